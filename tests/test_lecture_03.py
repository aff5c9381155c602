"""Lecture 03's measured claims, each on a right run and on a run made wrong on purpose, which must
fail it. SMOKE-sized; the timed claims run on the H100 model (lecture 02's paced link with an
NVLink ring step, scaled), whose ranks sleep, so a loaded machine moves them by a few percent of
their tolerance.

- the key claim (section 5): one call per barrier measures a chain broadcast's latency, (K-1) hops,
  where nccl-tests' loop measures its throughput, about one hop per call (course.benchmarking.
  chain_ratio). A star broadcast (the root sends to each rank in turn: nothing to pipeline) has the
  same latency and no pipeline, and must fail it.
- busbw reads the link back (section 3): lecture 02's ring on the H100 model's NVLink has busbw
  near its B. The same ring with each step serialised (send, then receive) takes twice as long and
  must fail it.
- nccl-tests' definitions (the optional section): NVIDIA's published 8-GPU table has algbw = S/t
  and busbw = 2(K-1)/K algbw; an all-gather's factor (K-1)/K must fail it.
- a GPU's floor (section 8, the runs kept in data/): one GPU's out-of-place all-gather and
  reduce-scatter at 256 MiB take one copy at lecture 00's device-to-device rate on that GPU; the
  other GPU's rate (the H100's for the H200's run, and back) must fail it.
- the harness's #wrong (section 2): the library's all-reduce and lecture 02's ring give 0; the ring
  with its last all-gather step left out gives more than 0, at every size.
"""
import pytest
import torch
import torch.distributed as dist

from course.benchmarking import (assert_busbw_reads_the_link, assert_latency_is_not_throughput,
                                 assert_nccl_tests_definitions, assert_the_copy_sets_the_loop,
                                 chain_ratio)
from course.ring_math import exchange, ring_all_reduce, ring_reduce_scatter
from helpers import archive, bench, machines, standins
from machinery import l00_hardware as hardware

H100 = machines.Scaled(machines.H100, time=300, bytes=256)   # the lecture's H100 model
GBPS, ALPHA = H100.link()
B = machines.link(machines.H100)[1] / 1e9


def chain_broadcast(x, root):
    """The lecture's: root -> root+1 -> ..., each rank receives, then forwards."""
    rank, k = dist.get_rank(), dist.get_world_size()
    if rank != root:
        dist.recv(x, (rank - 1) % k)
    if (rank + 1) % k != root:
        dist.send(x, (rank + 1) % k)


def star_broadcast(x, root):
    """Wrong on purpose for the key claim: the root sends to every rank in turn, through its one
    out-port, so consecutive calls cannot overlap: latency and throughput are both K-1 hops."""
    rank, k = dist.get_rank(), dist.get_world_size()
    if rank == root:
        for dst in range(k):
            if dst != root:
                dist.send(x, dst)
    else:
        dist.recv(x, root)


def serial_exchange(send_buf, dst, recv_buf, src):
    """A ring step serialised on purpose: even ranks send then receive, odd ranks the reverse."""
    first, second = (dist.isend, send_buf, dst), (dist.irecv, recv_buf, src)
    for op, buf, peer in ((first, second) if dist.get_rank() % 2 == 0 else (second, first)):
        op(buf, peer).wait()


def serial_ring_all_reduce(x):
    """Lecture 02's ring on two ranks with serial_exchange for its steps: wrong on purpose."""
    rank, k = dist.get_rank(), dist.get_world_size()
    chunks = list(torch.tensor_split(x, k))
    right, left = (rank + 1) % k, (rank - 1) % k
    for step in range(k - 1):
        send_c, recv_c = (rank - step - 1) % k, (rank - step - 2) % k
        incoming = torch.empty_like(chunks[recv_c])
        serial_exchange(chunks[send_c], right, incoming, left)
        chunks[recv_c] += incoming
    for step in range(k - 1):
        serial_exchange(chunks[(rank - step) % k], right, chunks[(rank - step - 1) % k], left)


def ring_without_last_step(x):
    """The lecture's: lecture 02's ring, its last all-gather step left out."""
    rank, k = dist.get_rank(), dist.get_world_size()
    chunks = list(torch.tensor_split(x, k))
    ring_reduce_scatter(chunks)
    for step in range(k - 2):
        exchange(chunks[(rank - step) % k], (rank + 1) % k,
                 chunks[(rank - step - 1) % k], (rank - 1) % k)


def test_the_chain_model_has_its_limits():
    assert chain_ratio(2, 10) == 1.0                       # two ranks: nothing to pipeline
    assert chain_ratio(4, 10**9) == pytest.approx(3.0)     # a long loop: K-1
    assert chain_ratio(3, 5) == pytest.approx(2 / (1 + 4 / 30))


def test_key_claim_latency_is_not_throughput_and_its_negative_control():
    plan = {"chain": ("broadcast", standins.paced(chain_broadcast, GBPS, ALPHA)),
            "star": ("broadcast", standins.paced(star_broadcast, GBPS, ALPHA))}
    loop, per_call = (bench.sweep(plan, [3], [2**25 // 256], warmup=1, iters=5, rounds=2,
                                  method=m, interleave=True, backend="gloo", progress=False)
                      for m in ("nccl-tests", "per-call"))
    pick = lambda rows, name: [r for r in rows if r["collective"] == name]  # noqa: E731
    assert_latency_is_not_throughput(pick(loop, "chain"), pick(per_call, "chain"), 5)
    with pytest.raises(AssertionError, match="per call / loop"):
        assert_latency_is_not_throughput(pick(loop, "star"), pick(per_call, "star"), 5)


def test_busbw_reads_the_link_and_a_serialised_ring_does_not():
    rows = H100.rows(bench.sweep(
        {"ring": ("all_reduce", standins.paced(ring_all_reduce, GBPS, ALPHA)),
         "serial": ("all_reduce", standins.paced(serial_ring_all_reduce, GBPS, ALPHA))},
        [2], [2**27 // 256], warmup=1, iters=3, rounds=2, interleave=True, backend="gloo",
        progress=False))
    right = [r for r in rows if r["collective"] == "ring"]
    wrong = [r for r in rows if r["collective"] == "serial"]
    assert_busbw_reads_the_link(right, B)
    assert wrong[0]["wrong"] == 0                          # right values, twice the time
    with pytest.raises(AssertionError, match="busbw"):
        assert_busbw_reads_the_link(wrong, B)


def test_the_published_table_meets_nccl_tests_definitions_and_an_all_gathers_factor_does_not():
    doc = machines.published("h100_8gpu_all_reduce_dgxc")
    assert_nccl_tests_definitions(doc["rows"], doc["gpus"])
    with pytest.raises(AssertionError):
        assert_nccl_tests_definitions(doc["rows"], doc["gpus"], "all_gather")


def test_the_harness_counts_a_wrong_collective():
    rows = bench.sweep({"library": "all_reduce", "ring": ("all_reduce", ring_all_reduce),
                        "broken": ("all_reduce", ring_without_last_step)},
                       [2, 3], bench.size_range("4K", "64K", 4), warmup=1, iters=2,
                       interleave=True, progress=False)
    assert len(rows) == 2 * 3 * 3
    for r in rows:
        assert (r["wrong"] > 0) == (r["collective"] == "broken"), r


def test_the_kept_gpu_runs_copy_at_their_gpus_rate_and_the_other_gpus_rate_fails():
    d2d = hardware.kept_d2d_gbps(archive.runs("00_hardware"))
    on = {run["machine"]["gpus"][0]["name"]: run["measurements"]["nccl"]
          for run in archive.runs("03_benchmarking") if run["measurements"].get("nccl")}
    assert {"NVIDIA H100 80GB HBM3", "NVIDIA H200"} <= set(on) & set(d2d)
    for gpu, rows in on.items():
        assert len(assert_the_copy_sets_the_loop(rows, d2d[gpu])) == 2
        other = next(rate for name, rate in d2d.items() if name != gpu)
        with pytest.raises(AssertionError, match="all_gather"):
            assert_the_copy_sets_the_loop(rows, other)
