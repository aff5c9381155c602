"""Machinery of the debugging part of lecture 09: switches for the ranks of one launch, the cost
of TORCH_DISTRIBUTED_DEBUG=DETAIL measured, and errors cut to what a reader needs.

    with debug_bench.rank_env(TORCH_DISTRIBUTED_DEBUG="DETAIL"):    # the ranks launched inside
        spawn(fn, k)                                                # see it; the notebook's
                                                                    # environment comes back after
    times = spawn(debug_bench.detail_cost, k, args=(nbytes, calls, rounds))[0]
    times["off"], times["DETAIL"]          # seconds per all-reduce, one number per round
    times["calls"]["DETAIL"]               # {"gloo:all_gather": 2.0, ...} per all-reduce

`detail_cost` makes two gloo groups on the same ranks, one created with the debug level OFF and one
with DETAIL (the level is read when a group is created, so one process can hold both), and times
the same all-reduce on each in turn: per round, one barrier and `calls` all-reduces back to back,
the clock read around the loop (nccl-tests' method, rank 0's clock); taking turns makes a change in
the machine's load hit both alike.
"""
import contextlib
import os
import re
import time

import torch
import torch.distributed as dist


@contextlib.contextmanager
def rank_env(**variables):
    """Environment variables for the ranks launched inside the block (spawn copies os.environ at
    launch); the notebook's own come back afterwards, whatever happens."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update({name: str(value) for name, value in variables.items()})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def detail_cost(rank, world_size, nbytes, calls, rounds, warmup=1):
    """A rank's function for helpers.spawn: {"off": [s], "DETAIL": [s]}, per round the mean time of
    `calls` all-reduces of nbytes back to back (nccl-tests' method), the groups taking turns; and
    "calls": {level: {gloo call: count per all-reduce}}, what the profiler saw this rank run."""
    from torch.profiler import profile

    groups = {}
    for level in ("OFF", "DETAIL"):
        dist.set_debug_level(getattr(dist.DebugLevel, level))
        groups["off" if level == "OFF" else level] = dist.new_group(backend="gloo")
    dist.set_debug_level(dist.DebugLevel.OFF)
    x = torch.zeros(nbytes // 4)
    out = {name: [] for name in groups}
    for i in range(warmup + rounds):
        for name, group in groups.items():
            dist.barrier(group=groups["off"])
            t0 = time.perf_counter()
            for _ in range(calls):
                dist.all_reduce(x, group=group)
            if i >= warmup:
                out[name].append((time.perf_counter() - t0) / calls)
    out["calls"] = {}
    for name, group in groups.items():
        with profile(acc_events=True) as prof:
            for _ in range(calls):
                dist.all_reduce(x, group=group)
        names = [str(e.name) for e in prof.events() if str(e.name).startswith("gloo:")]
        out["calls"][name] = {n: names.count(n) / calls for n in sorted(set(names))}
    return out


def first_line(message, width=110):
    """An error's first line, without gloo's '[/path/to/file.cc:NN] ' prefix, cut to `width`."""
    line = (message.strip().splitlines() or [""])[0]
    line = re.sub(r"\[[^\]]*\.(cc|cpp|h|hpp):\d+\]\s*", "", line)
    return line if len(line) <= width else line[:width - 3] + "..."


CALL = re.compile(r"shape|all_?reduce|broadcast|collective", re.I)
FINGERPRINT = re.compile(r"Rank (\d+) is running collective: CollectiveFingerPrint\("
                         r"SequenceNumber=\d+, OpType=(\w+), TensorShape=\[(\d+)\]")
OPS = {"ALLREDUCE": "all_reduce", "BROADCAST": "broadcast"}


def names_a_call(message):
    """Whether an error names a collective or a shape."""
    return bool(CALL.search(message))


def fingerprints(message):
    """DETAIL's mismatch error -> [(rank, (op, elements))]: the raising rank's call, then the call
    of the rank it disagrees with, as the lecture's plans write them."""
    return [(int(r), (OPS.get(op, op), int(n))) for r, op, n in FINGERPRINT.findall(message)]


def failed_barrier(message):
    """The ranks a monitored barrier's error names as not arriving ([] if none)."""
    found = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", message)
    return [int(r) for r in found[1].split(",")] if found else []
