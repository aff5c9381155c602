"""Lecture 01 (notebooks/01_collectives.ipynb): its key measured claim with negative controls, the
check that left the lecture (every collective on K ranks, roots moved, inputs left alone), and unit tests of the
machinery it moved out (machinery.l01_diagrams, machinery.l01_probes).

The claim: no rank leaves a barrier before the last one has arrived, on one clock, with no slack
(course.collectives.assert_barrier_held, shown in the lecture). Rank r works r/2 s first, so a
barrier that does not wait for everyone misses by half a second or more: load only delays the
ranks' starts alike (they start together, after the group's rendezvous), never by that much.
"""
import time

import matplotlib
import pytest
import torch
import torch.distributed as dist

matplotlib.use("Agg")

from course.collectives import assert_barrier_held, barrier_timeline  # noqa: E402
from helpers import plots  # noqa: E402
from machinery import l01_diagrams as diagrams, l01_probes as probes
from helpers.spawn import spawn  # noqa: E402


# ------------------------------------------------------- the key claim and its negative controls

def _timeline(rank, world_size, t0, kind):
    """The lecture's measurement, with the barrier it names."""
    if kind == "barrier":
        barrier = dist.barrier
    elif kind == "no-op":                                     # waits for nobody
        barrier = lambda: None  # noqa: E731
    else:                                                     # a subgroup without the last rank
        group = dist.new_group(list(range(world_size - 1)))   # every rank takes part in making it
        barrier = (lambda: dist.barrier(group=group)) if rank < world_size - 1 else (lambda: None)
    return barrier_timeline(rank, world_size, t0, barrier)


def _measure(kind, k=3):
    t0 = time.perf_counter()
    return spawn(_timeline, world_size=k, args=(t0, kind), timeout=60)


def test_no_rank_leaves_the_barrier_before_the_last_one_arrives():
    by_rank = _measure("barrier")
    arrived, left = assert_barrier_held(by_rank)
    assert arrived >= 1.0                       # rank 2 worked 1 s after t0 (a sleep only lasts longer)
    assert [e["name"] for e in by_rank[0]] == ["work", "barrier"]


@pytest.mark.parametrize("kind", ["no-op", "subgroup"])
def test_a_barrier_that_does_not_wait_for_everyone_fails_the_assertion(kind):
    by_rank = _measure(kind)
    with pytest.raises(AssertionError, match="a rank left at"):
        assert_barrier_held(by_rank)


def test_the_assertion_reads_only_the_barrier_spans():
    ok = [[{"name": "work", "start": 0, "end": 5}, {"name": "barrier", "start": 1, "end": 3}],
          [{"name": "barrier", "start": 2, "end": 3}]]
    assert assert_barrier_held(ok) == (2, 3)
    late = [[{"name": "barrier", "start": 1, "end": 1.5}], [{"name": "barrier", "start": 2, "end": 3}]]
    with pytest.raises(AssertionError):
        assert_barrier_held(late)


# ----------------------------------------- every collective on K ranks (the lecture's former section 3)

def _every_collective(rank, world_size, data):
    x, k, last, got = data[rank], world_size, world_size - 1, {}
    t = x.clone(); dist.broadcast(t, src=last); got["broadcast from the last rank"] = t
    t = x.clone(); dist.reduce(t, dst=last); got["reduce to the last rank"] = t if rank == last else None
    t = x.clone(); dist.all_reduce(t); got["all_reduce"] = t
    out = [torch.empty_like(x) for _ in range(k)] if rank == 0 else None
    dist.gather(x, out, dst=0); got["gather to rank 0"] = torch.stack(out) if rank == 0 else None
    out = [torch.empty_like(x) for _ in range(k)]
    dist.all_gather(out, x); got["all_gather"] = torch.stack(out)
    t = torch.empty(2, dtype=x.dtype)
    dist.scatter(t, list(x.chunk(k)) if rank == 0 else None, src=0); got["scatter from rank 0"] = t
    t = torch.empty(2, dtype=x.dtype); dist.reduce_scatter(t, list(x.chunk(k))); got["reduce_scatter"] = t
    t = torch.empty_like(x); dist.all_to_all_single(t, x); got["all_to_all_single"] = t
    lst = list(x.clone().chunk(k))
    dist.all_to_all(list(torch.empty_like(x).chunk(k)), lst); got["all_to_all inputs"] = torch.cat(lst)
    dist.barrier()
    got["x after every call"] = x
    return got


@pytest.mark.parametrize("k", [2, 3, 4])
def test_every_collective_matches_one_process_exactly_with_roots_moved(k):
    """Small integers in float64: every order of additions gives the same bits."""
    data = torch.randint(-9, 10, (k, 2 * k), generator=torch.Generator().manual_seed(0)).double()
    total = data.sum(0)
    reference = {
        "broadcast from the last rank": lambda r: data[k - 1],
        "reduce to the last rank": lambda r: total if r == k - 1 else None,
        "all_reduce": lambda r: total,
        "gather to rank 0": lambda r: data if r == 0 else None,
        "all_gather": lambda r: data,
        "scatter from rank 0": lambda r: data[0].chunk(k)[r],
        "reduce_scatter": lambda r: total.chunk(k)[r],
        "all_to_all_single": lambda r: torch.cat([data[j].chunk(k)[r] for j in range(k)]),
        "all_to_all inputs": lambda r: data[r],               # the calls leave their inputs alone
        "x after every call": lambda r: data[r],
    }
    got = spawn(_every_collective, world_size=k, args=(data,), backend="gloo")
    for name, want in reference.items():
        for r in range(k):
            g, w = got[r][name], want(r)
            assert (g is None and w is None) or torch.equal(g, w), (name, r, g, w)


# --------------------------------------------------------------------------- machinery.l01_diagrams

def test_cells_and_colours_follow_the_data():
    assert diagrams.cells(None) == []
    assert diagrams.cells(torch.tensor([1, 2])) == [(1, 0), (2, 0)]
    assert diagrams.cells([torch.tensor([1]), torch.tensor([2, 3])]) == [(1, 0), (2, 1), (3, 1)]
    held = diagrams.owners([torch.tensor([1, 5]), torch.tensor([2, 5]), None])
    assert held == {1: {0}, 2: {1}, 5: {0, 1}}
    assert diagrams.colour(2, held, reduced=False) == plots.COLORS[1]       # one holder: its colour
    assert diagrams.colour(5, held, reduced=False) == "white"              # several holders
    assert diagrams.colour(6, held, reduced=False) == diagrams.GREY        # nobody held it (a sum)
    assert diagrams.colour(1, held, reduced=True) == diagrams.GREY         # a reduction's result
    assert diagrams.label(3.0) == "3" and diagrams.label(0.125) == "0.125"
    assert diagrams.rank_colour(1) == plots.COLORS[1]


def test_the_figure_draws_one_box_per_element_and_hatches_the_undefined():
    before = [torch.tensor([1, 1]), torch.tensor([2, 2]), torch.tensor([3, 3])]
    after = [torch.tensor([6, 6]), torch.tensor([5, 2]), torch.tensor([3, 6])]
    fig = diagrams.figure("reduce", before, after, reduced=True, undefined=[1, 2])
    left, right = fig.axes
    assert len(left.patches) == 6 and len(right.patches) == 6
    assert sum(p.get_hatch() == "//" for p in right.patches) == 4 and not any(p.get_hatch() for p in left.patches)
    assert [t.get_text() for t in right.get_yticklabels()] == ["rank 0", "rank 1 (undefined)", "rank 2 (undefined)"]
    fills = [p.get_facecolor() for p in left.patches]          # before: coloured by owner
    assert fills[0] == fills[1] != fills[2] == fills[3]
    shared = diagrams.figure("x", [torch.tensor([2]), torch.tensor([2])], [None, None])
    assert shared.axes[0].patches[0].get_facecolor() != shared.axes[0].patches[1].get_facecolor()
    empty = diagrams.figure("gather", before, [[torch.tensor([1])], None, None])
    assert any(t.get_text() == "(no buffer)" for t in empty.axes[1].texts)
    matplotlib.pyplot.close("all")


# ----------------------------------------------------------------------------- machinery.l01_probes

def test_the_reference_of_every_operation():
    ints = torch.tensor([[1, 6], [3, 4]])
    assert torch.equal(probes.op_reference("SUM", ints), torch.tensor([4, 10]))
    assert torch.equal(probes.op_reference("PRODUCT", ints), torch.tensor([3, 24]))
    assert torch.equal(probes.op_reference("MIN", ints), torch.tensor([1, 4]))
    assert torch.equal(probes.op_reference("MAX", ints), torch.tensor([3, 6]))
    assert torch.equal(probes.op_reference("BXOR", ints), torch.tensor([2, 2]))
    assert torch.equal(probes.op_reference("AVG", ints.double()), torch.tensor([2.0, 5.0], dtype=torch.float64))
    assert probes.op_reference("AVG", ints) is None and probes.op_reference("BAND", ints.float()) is None


def test_grading_says_yes_no_ran_and_wrong():
    k = 2
    inputs = [probes._input(r, k, torch.int64) for r in range(k)]
    total = sum(inputs)
    assert probes.grade("all_reduce", "SUM", torch.int64, [total, total]) == ("yes", None)
    assert probes.grade("reduce", "SUM", torch.int64, [total, inputs[1]]) == ("yes", None)  # rank 1: undefined
    assert probes.grade("reduce_scatter_single", "SUM", torch.int64, list(total.chunk(k))) == ("yes", None)
    assert probes.grade("all_reduce", "AVG", torch.int64, [total, total]) == ("ran", None)
    assert probes.grade("all_reduce", "SUM", torch.int64, ["RuntimeError: no", "RuntimeError: no"]) == \
        ("no", "RuntimeError: no")
    mark, why = probes.grade("all_reduce", "SUM", torch.int64, [total, total + 1])
    assert mark == "WRONG" and "rank 1" in why


def test_a_cell_sets_what_was_found_beside_the_readings_mark():
    assert probes.cell("Y", "yes") == "yes" and probes.cell("N", "no (RuntimeError: x)") == "no"
    assert probes.cell("N", "yes") == "no -> yes" and probes.cell("?", "yes") == "? -> yes"
    assert probes.cell("Y", None) == "untried (yes)"
    found = {("gloo", "cpu"): {"broadcast": "yes", "reduce_scatter": "yes", "send": "no (ValueError: v)"}}
    assert probes.differences(found) == [
        {"call": "reduce_scatter", "backend": "gloo", "device": "cpu", "reading": "no", "now": "yes"},
        {"call": "send", "backend": "gloo", "device": "cpu", "reading": "yes", "now": "no (ValueError: v)"}]
    assert probes.first_line(RuntimeError("first\nsecond")) == "RuntimeError: first"
    gloo = RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:339] writev: Bad address")
    assert probes.first_line(gloo) == "RuntimeError: writev: Bad address"   # no build machine's path


def _aborts_on_send(rank, world_size, where, only=None):
    """try_calls' signature; a send ends the process as a C++ abort does (gloo's send of a CUDA
    tensor on an H200 with torch 2.11): a line on stderr, then SIGABRT, nothing to catch."""
    import os
    import sys
    if "send" in only:
        print("terminate called after throwing an instance of 'gloo::IoException'", file=sys.stderr,
              flush=True)
        os.abort()
    return {name: "yes" for name in only}


def test_a_call_that_kills_its_rank_reads_no_and_the_other_calls_are_still_tried():
    got = probes.one_at_a_time("gloo", "cpu", 2, timeout=30, probe=_aborts_on_send)
    died = "no (rank 0 died: terminate called after throwing an instance of 'gloo::IoException')"
    assert got == {"send": died, "recv": died, **{c: "yes" for c in probes.READING_CALLS[2:]}}
    assert spawn(probes.try_calls, 2, backend="gloo", args=("cpu", ["broadcast"])) == \
        [{"broadcast": "yes"}] * 2


def test_the_probes_run_on_gloo_and_grade_it():
    backends, rows, errors = probes.reduce_ops(2)
    gloo = next(b for b in backends if b["backend"] == "gloo")
    assert gloo["installed"] == "yes" and gloo["ranks"] == 2
    assert {r["call"] for r in rows if r["backend"] == "gloo"} == set(probes.CALLS)
    assert all(r["SUM"] == "yes" and r["MAX"] == "yes" for r in rows)
    assert not any(v == "WRONG" for r in rows for v in r.values())
    floats = [r for r in rows if r["dtype"] == "float32"]
    assert all(r["BAND"] == "no" for r in floats)          # the dtype's gap, not the backend's
    assert any("BAND" in why for why in errors)
    support, found, untried = probes.calls_vs_reading()
    assert [r["call"] for r in support] == probes.READING_CALLS
    assert found["gloo", "cpu"]["broadcast"] == found["gloo", "cpu"]["all_reduce"] == "yes"
    assert ("mpi", "cpu") in untried and ("gloo", "cpu") not in untried
    assert all(r["gloo cpu"] in ("yes", "no") or "->" in r["gloo cpu"] for r in support)
    assert {r["call"] for r in support if "->" in r["gloo cpu"]} == {"reduce_scatter", "all_to_all"}
    assert all(r["mpi cpu"].startswith("untried") for r in support)
