"""What a chunked collective did, step by step, recorded from the code as it runs: the picture drawn
after a lecture's plain code, to hold beside the picture of its specification drawn before it.

    per_rank = spawn(recording.ring_steps, k, args=(ring_all_reduce,), backend="gloo")
    recorded = recording.states(per_rank, phases=[("reduce-scatter", k - 1), ("all-gather", k - 1)])
    assert recorded == simulated          # the lecture's specification, in the same format

How it knows without reading the code: every rank's tensor is a tag, 2**rank in float64, so a
chunk's value is the sum of 2**j over the ranks j whose contributions it holds (exact: distinct
powers of two up to 2**52); a chunk's number is where its send buffer lies in the tensor. The
collective runs unchanged, with dist.batch_isend_irecv wrapped (helpers.patching) to note each call's
sends and, before each call, what every chunk holds: a step is one call (one batched exchange, as
lecture 02's `exchange`). The format is lecture 02's simulation's: (phase, step, sends
[(src, dst, chunk)], holds[rank][chunk] = the ranks whose contributions that rank holds there).

A ring that computes between its passes is recorded by its work instead: flops_per_step (or
at_waits and per_step around a counter of one's own) counts the matmul flops (FlopCounterMode) from
one wait of a batched exchange to the next, so that a step is what the code did between two
arrivals; which blocks those flops are is the lecture's to say.
"""
import contextlib

import torch
import torch.distributed as dist
from torch.utils.flop_counter import FlopCounterMode

from helpers.patching import patched

PER_CHUNK = 3           # elements per chunk: every chunk non-empty, each of its elements checked


def _holds(x, bounds):
    """For each chunk, the set of ranks whose tag its elements sum (every element the same)."""
    out = []
    for start, stop in bounds:
        values = set(x[start:stop].tolist())
        if len(values) != 1:
            raise AssertionError(f"elements {start}-{stop} of one chunk hold different sums: {values}")
        v = int(values.pop())
        out.append(frozenset(j for j in range(v.bit_length()) if v >> j & 1))
    return out


def ring_steps(rank, k, collective):
    """Run collective(x) on this rank's tag; [(sends [(rank, dst, chunk)], holds before the step)]
    for each step, and the holds after the last one."""
    x = torch.full((k * PER_CHUNK,), 2.0 ** rank, dtype=torch.float64)   # k equal chunks
    bounds = [(c * PER_CHUNK, (c + 1) * PER_CHUNK) for c in range(k)]
    steps = []

    def chunk_of(t):
        start = (t.data_ptr() - x.data_ptr()) // x.element_size()
        if start % PER_CHUNK or t.numel() != PER_CHUNK:
            raise AssertionError(f"rank {rank} sent {t.numel()} elements that are not one chunk "
                                 f"of its tensor (offset {start})")
        return start // PER_CHUNK

    def recording(ops):
        sends = sorted((rank, op.peer, chunk_of(op.tensor)) for op in ops if op.op is dist.isend)
        steps.append((sends, _holds(x, bounds)))
        return originals["batch_isend_irecv"](ops)

    with patched(dist, batch_isend_irecv=recording) as originals:
        collective(x)
    return steps, _holds(x, bounds)


def states(per_rank, phases):
    """The ranks' records as one list of states, the start first: (phase, step, sends, holds).
    phases: [(name, steps)] in order, their steps summing to the steps every rank took."""
    counts = {len(steps) for steps, _ in per_rank}
    total = sum(n for _, n in phases)
    if counts != {total}:
        raise AssertionError(f"the ranks took {sorted(counts)} steps; the phases name {total}")
    names = [(name, i + 1) for name, n in phases for i in range(n)]
    before = [[steps[t][1] for steps, _ in per_rank] for t in range(total)]
    after = before[1:] + [[last for _, last in per_rank]]
    out = [("start", 0, [], before[0] if total else after[-1])]
    for t, (name, step) in enumerate(names):
        sends = sorted(s for steps, _ in per_rank for s in steps[t][0])
        out.append((name, step, sends, after[t]))
    return out


def first_difference(recorded, specified):
    """None when the two lists of states are equal, else a sentence naming the first step that differs."""
    for got, want in zip(recorded, specified):
        if got != want:
            what = "sends" if got[2] != want[2] else "holds"
            return (f"{want[0]}, step {want[1]}: the code's {what} differ from the specification's: "
                    f"{got[2] if what == 'sends' else got[3]} against "
                    f"{want[2] if what == 'sends' else want[3]}")
    if len(recorded) != len(specified):
        return f"the code took {len(recorded) - 1} steps, the specification {len(specified) - 1}"
    return None


class _Marked:
    """A work handle whose first wait calls `mark` (then waits as the original)."""
    def __init__(self, work, mark):
        self._work, self._mark = work, mark

    def wait(self, *args, **kwargs):
        self._mark()
        return self._work.wait(*args, **kwargs)


@contextlib.contextmanager
def at_waits(read):
    """Inside, the first wait for each batched exchange (dist.batch_isend_irecv) appends read() to
    the list yielded: with a FlopCounterMode's get_total_flops, the flops done by each arrival."""
    marks = []

    def marked(ops):
        works, once = originals["batch_isend_irecv"](ops), [True]

        def mark():                       # the first of this pass's handles to be waited for
            if once:
                once.pop()
                marks.append(read())
        return [_Marked(w, mark) for w in works]

    with patched(dist, batch_isend_irecv=marked) as originals:
        yield marks


def per_step(marks, total):
    """A running count read at each arrival (at_waits) and at the end, as the count of each step."""
    ends = list(marks) + [total]
    return [b - a for a, b in zip([0] + ends[:-1], ends)]


def flops_per_step(run):
    """Run run() (code that passes blocks round a ring with dist.batch_isend_irecv and waits for
    them); the matmul flops it did in each step: from its start, or a pass's wait, to the next
    wait, the last step ending with run()."""
    with FlopCounterMode(display=False) as counter:
        with at_waits(counter.get_total_flops) as marks:
            run()
        return per_step(marks, counter.get_total_flops())
