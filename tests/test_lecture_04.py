"""Lecture 04 (CUDA streams and overlap): its shape, its key measured claim with a negative control,
and the machinery it moved to notebooks/machinery/l04_cuda_streams.py.

The claim (notebooks/04_cuda_streams.ipynb, section 4): an all-reduce on a paced link (a ring's
time on links of B GB/s, on a clock that takes no core) beside device-like compute (time that
takes no core) overlaps to max(comm, compute) of the models, within 5 ms
(course.cuda_streams.assert_overlaps). The negative control runs the same all-reduce and compute
with the compute made to wait for the collective (sequential_step in the place of the overlapped
step), at every ratio of the lecture: comm + compute, above the max by the shorter piece (a sleep
is never shorter than asked), which must fail the claim. Both stand-ins sleep, so the timings hold
on a loaded machine; the test takes about ten seconds.
"""
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from course.cuda_streams import (assert_hides_the_shorter, assert_overlaps, overlapped_step,
                                 sequential_step)
from helpers import archive, cost, machine
from helpers.site import shape
from machinery import l04_cuda_streams as streams_bench
from helpers.spawn import spawn

GBPS, NBYTES = 0.05, 2 * 2**20    # the lecture's 2 MiB at 0.05 GB/s: 42 ms on 2 ranks
LECTURE = Path(shape.NOTEBOOKS) / "04_cuda_streams.ipynb"


def test_an_overlapped_step_takes_the_longer_piece_and_a_serialised_one_fails():
    t_link = cost.ring_all_reduce(NBYTES, 2, GBPS * 1e9)
    steps = {"overlapped": overlapped_step,
             "serialised": sequential_step}          # the compute waits for the collective
    runs = spawn(streams_bench.overlap_rank, 2, backend="gloo",
                 args=(steps, NBYTES // 4, [0.25, 0.5, 1.0, 2.0], 3, GBPS))
    right = streams_bench.step_rows(runs, model_s=t_link)
    assert assert_overlaps(right)
    for row in right:                                # every ratio, the smallest margin first
        wrong = {**row, "overlapped ms": row["serialised ms"]}
        with pytest.raises(AssertionError, match="off max"):
            assert_overlaps([wrong])
        # it fails for the reason it was built: above the max by the shorter piece
        comm, compute = row["comm model ms"], row["compute model ms"]
        assert wrong["overlapped ms"] - max(comm, compute) >= min(comm, compute) - 0.5


def test_the_claim_uses_the_model_it_is_given():
    """assert_overlaps compares with the rows' models, never with their measured pieces."""
    row = {"ratio": 1.0, "comm model ms": 100.0, "compute model ms": 50.0, "overlapped ms": 104.0,
           "comm ms": 114.0, "compute ms": 50.0}
    assert assert_overlaps([row])                                # 5 ms of slack
    with pytest.raises(AssertionError, match=r"\+6.0 ms"):
        assert_overlaps([{**row, "overlapped ms": 106.0}])


def _paced_alone(rank, k):
    x = torch.full((NBYTES // 4,), rank + 1.0)
    spans = []
    with streams_bench.paced_all_reduce(GBPS, spans):
        dist.all_reduce(x)
        work = dist.all_reduce(x, async_op=True)
        work.wait()
    return x, spans


def test_the_paced_all_reduce_sums_and_takes_the_ring_time():
    model = cost.ring_all_reduce(NBYTES, 2, GBPS * 1e9)
    for x, spans in spawn(_paced_alone, 2, backend="gloo"):
        assert torch.equal(x, torch.full_like(x, 6.0))            # (1 + 2) twice
        assert [name for name, _, _ in spans] == ["all-reduce", "all-reduce"]
        for _, start, end in spans:                                # a sleep: never shorter
            assert model - 1e-9 <= end - start < model + 0.05


def _halves(rank, world_size):
    x, spans = torch.ones(NBYTES // 4), []
    with streams_bench.paced_all_reduce(GBPS, spans):
        works = [dist.all_reduce(half, async_op=True) for half in x.chunk(2)]
        [w.wait() for w in works]
    return spans


def test_the_paced_link_carries_one_all_reduce_at_a_time():
    """Two halves launched at once take the whole tensor's time, one after the other (a link that
    gave each call its own deadline would finish both in half of it)."""
    half = cost.ring_all_reduce(NBYTES // 2, 2, GBPS * 1e9)
    for (_, s0, e0), (_, s1, e1) in spawn(_halves, 2, backend="gloo"):
        assert s1 >= s0 + half - 1e-9 and e1 - s0 >= 2 * half - 1e-9, (s0, e0, s1, e1)


def test_the_cpu_share_is_taken_around_the_collective_only():
    """Per rank, the share of a core its process used during its all-reduce: at most the cores
    each rank has (one on 2 cores; its threads, gloo's among them, can use more where there are
    more), which a share taken around a fill, a barrier and a check was not."""
    runs = spawn(streams_bench.overlap_rank, 2, backend="gloo",
                 args=({"overlapped": overlapped_step}, 2**20, [0.5], 3, None, "matmul"))
    _, medians = streams_bench.cpu_shares(runs)
    each = machine.usable_cores() / 2
    assert all(0 < m <= 1.05 * each for m in medians), (medians, each)


def test_the_lecture_has_the_shape():
    got = shape.shape(LECTURE)
    assert got["minutes"] <= shape.MINUTES and got["cells over 60"] == 0
    assert got["lines over 88"] == 0 and got["before section 1"] <= shape.BEFORE_SECTION_1
    assert got["wordy prints"] == 0 and got["chosen texts"] == 0


def test_the_kept_hosts_hide_the_shorter_piece_and_shared_cores_do_not():
    """The optional section's claim on the kept runs (16 cores, 2 ranks); its control, rows as this
    2-core machine gives them (cores shared: overlap near 0 at every ratio), must fail it."""
    kept = streams_bench.spare_core_runs(archive.runs("04_cuda_streams"))
    assert len(kept) >= 2
    for _, rows in kept:
        assert_hides_the_shorter(rows)
    # the optional section's rows of lecture 04 at full size on this 2-core machine (make html,
    # 2026-11-28): cores shared
    shared = [{"ratio": r, "measured ratio": m, "overlap": o}
              for r, m, o in ((0.25, 0.26, -0.02), (0.5, 0.52, -0.06), (1.0, 1.01, 0.04),
                              (2.0, 1.87, 0.09))]
    with pytest.raises(AssertionError):
        assert_hides_the_shorter(shared)
