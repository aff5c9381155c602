"""Lecture 09 (profiling and debugging): its shape, its key measured claim with a negative control,
and the instruments it uses (the monitor with py-spy, DETAIL's cost, the parsers of errors).

The claim (notebooks/09_profiling_debugging.ipynb, section 2), on lecture 05's H100 model: the
exposed communication read off the profiler's trace (from the last bucket launch of the rank that
left backward last, stamped in its log of the link, to the end of its "wait for gradients" range)
is lecture 05's overlap model for the run's bucket plan, each bucket the model's ring, plus the
floor (the least round the same steps expose on an unpaced link), within timing.above_floor's
tolerance (`profile_bench.assert_exposed_predicted`). The negative control, a wrong algorithm: a run with
one bucket (every all-reduce after backward) held to the model of four 1 MiB buckets must fail
it. The stand-ins take their time without a core, so the timings hold on a loaded machine.
"""
import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from course.profiling_debugging import RANGES, train_step
from helpers import cost, machines
from machinery import l09_debug as debug_bench, l09_profile as profile_bench, l09_watch as watch_bench
from helpers.site import shape
from helpers.spawn import SpawnTimeout, spawn

LECTURE = Path(shape.NOTEBOOKS) / "09_profiling_debugging.ipynb"
MODEL = dict(dim=128, hidden=512, depth=4)
H100 = machines.Scaled(machines.H100, time=15, bytes=256)       # lecture 05's H100 model
FORWARD_S = H100.compute(2 * 8 * 4096**2 * 2048)
K = 2


def _ring_s(nbytes):
    alpha, bw = machines.link(machines.H100)
    return H100.wall(cost.ring_all_reduce(nbytes * H100.bytes, K, bw, alpha))


@pytest.fixture(autouse=True)
def quiet_profiler(monkeypatch):
    monkeypatch.setenv("KINETO_LOG_LEVEL", "6")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("traces"))
    os.environ["KINETO_LOG_LEVEL"] = "6"
    out = {}
    for cap in (1, 4):
        per_rank = spawn(profile_bench.profiled_steps, K, backend="gloo", timeout=120,
                         args=(train_step, MODEL, cap, FORWARD_S, H100,
                               machines.H100.contention[0], 5, folder))
        model = profile_bench.modelled_exposed(per_rank[0]["plan"], MODEL["depth"],
                                               2 * FORWARD_S, _ring_s)
        out[cap] = per_rank, profile_bench.steps_of(per_rank), model
    return out


def _links(per_rank):
    return [r["link"] for r in per_rank]


def test_the_exposed_communication_is_predicted_and_a_serialised_run_is_not(runs):
    for cap, (per_rank, steps, model) in runs.items():
        assert len(steps) == 5 and all(tuple(r) == RANGES for s in steps for r in s)
        measured = profile_bench.exposed(steps, _links(per_rank))
        profile_bench.assert_exposed_predicted(measured, profile_bench.floor_rounds(per_rank), model)
    per_rank, steps, _ = runs[4]
    one_bucket = profile_bench.exposed(steps, _links(per_rank))
    with pytest.raises(AssertionError):
        profile_bench.assert_exposed_predicted(one_bucket, profile_bench.floor_rounds(runs[1][0]),
                                               runs[1][2])


def test_exposed_is_read_from_the_last_launch_so_a_late_range_does_not_shorten_it():
    """The rank out of backward last (rank 0) launched its last bucket at 150 ms and was
    descheduled for 6 ms before its wait range began: the wait is 42 ms from the launch, 36 from
    the range; rank 1's own log does not count."""
    ranks = [{"forward": (0.0, 0.05), "backward": (0.05, 0.150),
              "wait for gradients": (0.156, 0.192), "optimizer": (0.192, 0.193)},
             {"forward": (0.0, 0.05), "backward": (0.05, 0.140),
              "wait for gradients": (0.140, 0.192), "optimizer": (0.192, 0.193)}]
    mine = [{"launched": 0.120}, {"launched": 0.150}, {"launched": 0.9}]   # 0.9: a later step
    theirs = [{"launched": 0.139}]
    assert profile_bench.exposed([ranks], [mine, theirs]) == pytest.approx([0.042])
    assert profile_bench.exposed([ranks]) == pytest.approx([0.036])
    with pytest.raises(ValueError, match="no launch"):
        profile_bench.exposed([ranks], [[{"launched": 0.9}], theirs])


def test_the_models_are_lecture_05s(runs):
    """Four buckets of a block each: only the last one's ring is exposed; one bucket: all of
    it (the ring model of the H100's NVLink, scaled, for each plan's bytes)."""
    four, one = runs[1][0][0]["plan"], runs[4][0][0]["plan"]
    assert len(four) == 4 and len(one) == 1
    assert runs[1][2] == pytest.approx(_ring_s(four[-1][1]), rel=1e-9)
    assert runs[4][2] == pytest.approx(_ring_s(one[0][1]), rel=1e-9)


def _sync_gradients(grad, group):
    dist.all_reduce(grad, group=group)
    return grad.sum().item()


def _load_batch():
    time.sleep(600)


def _stuck_elsewhere(rank, world_size):
    group = dist.new_group(timeout=timedelta(minutes=5))
    if rank == world_size - 1:
        _load_batch()
    return _sync_gradients(torch.ones(4), group)


def _hang(program=None):
    with watch_bench.Monitor(K, dump_at_s=1.0, program=program) as mon:
        with pytest.raises(SpawnTimeout) as hang:
            spawn(mon.wrap(_stuck_elsewhere), K, backend="gloo", timeout=2.5)
    return mon, hang.value, watch_bench.stacks(mon, hang.value, K)


def _assert_the_culprit_is_told_apart(where):
    assert where[0]["frames"][0].startswith("all_reduce") and any(
        f.startswith("_sync_gradients (test_lecture_09.py:") for f in where[0]["frames"])
    assert where[1]["frames"][0].startswith("_load_batch (test_lecture_09.py:")
    assert not any(f.startswith("_sync_gradients") for f in where[1]["frames"])


def test_the_monitor_reads_a_hung_rank_with_py_spy_or_falls_back():
    """Where py-spy can attach, its stacks are asserted; where it cannot (no ptrace), the dump
    says so and the launcher's faulthandler stacks are asserted instead: never a silent skip."""
    mon, hang, where = _hang()
    assert hang.ranks == [0, 1]
    for r in range(K):
        assert where[r]["faulthandler"] is not None
        state, got = mon.dumps[r]
        if state == "could not attach":
            assert where[r]["source"] == "faulthandler" and got, got
        else:
            assert state == "stack" and where[r]["source"] == "py-spy"
            assert where[r]["py-spy"][0] == where[r]["faulthandler"][0]
    _assert_the_culprit_is_told_apart(where)
    stuck = [s["cpu %"] for s in mon.samples if s["rank"] == 0][1:]
    assert stuck and sorted(stuck)[len(stuck) // 2] < 10
    short = watch_bench.short_paths(str(hang))
    assert "/" not in "".join(line for line in short.splitlines() if "File " in line)


@pytest.mark.parametrize("program", ["/bin/false", "/no/such/py-spy"])
def test_a_py_spy_that_cannot_attach_is_reported_and_the_launcher_stacks_answer(program):
    mon, hang, where = _hang(program)
    assert all(mon.dumps[r][0] == "could not attach" for r in range(K)), mon.dumps
    assert all(where[r]["source"] == "faulthandler" for r in range(K))
    assert all(where[r]["py-spy"].startswith("(could not attach: ") for r in range(K))
    _assert_the_culprit_is_told_apart(where)
    assert len({s["t"] for s in mon.samples}) > 4          # the monitor went on sampling


def test_a_rank_that_returned_is_not_reported_as_unreachable():
    def returns_then_waits(rank, world_size):
        if rank == 0:
            time.sleep(600)
    with watch_bench.Monitor(K, dump_at_s=1.0) as mon:
        with pytest.raises(SpawnTimeout) as hang:
            spawn(mon.wrap(returns_then_waits), K, backend="gloo", timeout=2.5)
    where = watch_bench.stacks(mon, hang.value, K)
    attached = mon.dumps[0][0] != "could not attach"      # ptrace allowed on this machine
    assert hang.value.ranks == [0] and where[1]["py-spy"].startswith(
        "(returned)" if attached else "(could not attach: ")
    assert where[1]["faulthandler"] is None


def test_detail_is_four_more_calls_per_collective_on_rank_0():
    os.environ["KINETO_LOG_LEVEL"] = "6"
    cost = spawn(debug_bench.detail_cost, 3, backend="gloo", args=(4096, 3, 2))
    assert cost[0]["calls"]["off"] == {"gloo:all_reduce": 1}
    assert cost[0]["calls"]["DETAIL"] == {"gloo:all_gather": 2, "gloo:all_reduce": 1,
                                          "gloo:recv": 2, "gloo:send": 2}
    assert cost[1]["calls"]["DETAIL"]["gloo:send"] == 1
    assert len(cost[0]["off"]) == len(cost[0]["DETAIL"]) == 2


def test_the_error_parsers():
    detail = ("Detected mismatch between collectives on ranks. Rank 0 is running collective: "
              "CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE, TensorShape=[4], "
              "TensorDtypes=Float), but Rank 1 is running collective: CollectiveFingerPrint("
              "SequenceNumber=0, OpType=BROADCAST, TensorShape=[4], TensorDtypes=Float).")
    assert debug_bench.fingerprints(detail) == [(0, ("all_reduce", 4)), (1, ("broadcast", 4))]
    assert debug_bench.failed_barrier("[Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier") == [1, 3]
    assert debug_bench.failed_barrier("Timed out waiting 2000ms for recv") == []
    assert not debug_bench.names_a_call("Timed out waiting 2000ms for recv operation to complete")
    assert debug_bench.names_a_call(detail)
    assert debug_bench.first_line("[../gloo/pair.cc:12] Timed out\nmore") == "Timed out"


def test_rank_env_restores_the_environment():
    before = dict(os.environ)
    with pytest.raises(RuntimeError):
        with debug_bench.rank_env(TORCH_DISTRIBUTED_DEBUG="DETAIL"):
            assert os.environ["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
            raise RuntimeError
    assert dict(os.environ) == before


def test_the_lecture_has_the_shape():
    got = shape.shape(LECTURE)
    assert got["minutes"] <= shape.MINUTES and got["cells over 60"] == 0
    assert got["lines over 88"] == 0 and got["before section 1"] <= shape.BEFORE_SECTION_1
    assert got["wordy prints"] == 0 and got["chosen texts"] == 0
