"""helpers/recording.py: the ring all-reduce of lecture 02, recorded as it runs, equals its
specification, stated here independently of the lecture's simulation (at step t of the
reduce-scatter rank r sends chunk (r - t - 1) mod K to r + 1, which adds it; at step t of the
all-gather it sends chunk (r - t) mod K, which r + 1 copies). Negative controls: a ring that sends
the wrong chunks, and one that turns the other way, record differently and are named at their
first step; a send that is not a chunk of the tensor is refused."""
import pytest
import torch
import torch.distributed as dist

from course.ring_math import exchange, ring_all_reduce
from helpers import recording
from helpers.spawn import spawn


def specification(k):
    holds = [[frozenset([r]) for _ in range(k)] for r in range(k)]
    out = [("start", 0, [], holds)]
    for phase, lag in (("reduce-scatter", 1), ("all-gather", 0)):
        for t in range(k - 1):
            sends = [(r, (r + 1) % k, (r - t - lag) % k) for r in range(k)]
            new = [row[:] for row in holds]
            for src, dst, c in sends:
                new[dst][c] = holds[dst][c] | holds[src][c] if lag else holds[src][c]
            holds = new
            out.append((phase, t + 1, sends, holds))
    return out


def recorded(k, collective):
    per_rank = spawn(recording.ring_steps, k, args=(collective,), backend="gloo")
    return recording.states(per_rank, [("reduce-scatter", k - 1), ("all-gather", k - 1)])


def ring(x, turn=-1, shift=1):
    """The ring all-reduce with its direction (turn) and its reduce-scatter's chunk lag (shift) as
    arguments: turn=-1, shift=1 is lecture 02's."""
    rank, k = dist.get_rank(), dist.get_world_size()
    chunks = list(torch.tensor_split(x, k))
    right, left = (rank - turn) % k, (rank + turn) % k
    incoming = torch.empty_like(chunks[0])
    for t in range(k - 1):
        send_c, recv_c = (rank + turn * (t + shift)) % k, (rank + turn * (t + shift + 1)) % k
        exchange(chunks[send_c], right, incoming[:len(chunks[recv_c])], left)
        chunks[recv_c] += incoming[:len(chunks[recv_c])]
    for t in range(k - 1):
        exchange(chunks[(rank + turn * t) % k], right, chunks[(rank + turn * (t + 1)) % k], left)


@pytest.mark.parametrize("k", [2, 3, 4])
def test_the_lectures_ring_records_as_its_specification(k):
    got, want = recorded(k, ring_all_reduce), specification(k)
    assert recording.first_difference(got, want) is None
    assert got == want


def test_the_parametrised_ring_is_the_lectures_when_unchanged():
    assert recorded(4, ring) == specification(4)


@pytest.mark.parametrize("change", [dict(shift=0), dict(turn=1)], ids=["wrong chunks", "turned"])
def test_a_changed_ring_records_differently_and_is_named(change):
    got, want = recorded(4, lambda x: ring(x, **change)), specification(4)
    assert got != want
    assert recording.first_difference(got, want).startswith("reduce-scatter, step 1: the code's sends")


def _half_chunk(x):
    rank, k = dist.get_rank(), dist.get_world_size()
    exchange(x[:1], (rank + 1) % k, torch.empty(1, dtype=x.dtype), (rank - 1) % k)


def test_a_send_that_is_not_a_chunk_is_refused():
    with pytest.raises(Exception, match="not one chunk"):
        spawn(recording.ring_steps, 2, args=(_half_chunk,), backend="gloo")


def test_states_refuse_phases_that_do_not_match_the_steps():
    per_rank = spawn(recording.ring_steps, 2, args=(ring_all_reduce,), backend="gloo")
    with pytest.raises(AssertionError, match="the phases name 3"):
        recording.states(per_rank, [("reduce-scatter", 1), ("all-gather", 2)])
