"""What the installed backends support, found by trying it on ranks (a printed table goes stale).

    from machinery import l01_probes as probes
    backends, rows, errors = probes.reduce_ops(world_size=4)  # every op x call x dtype, graded
    rows, found, skipped = probes.calls_vs_reading()          # the UvA reading's table, tried again
    probes.differences(found)                                 # where this machine contradicts it

`reduce_ops` runs every reduce operation (OPS) in all_reduce, reduce and reduce_scatter_single (the
one-tensor form of reduce-scatter) on float32 and int64, on every backend that can start here, and
grades each against a single-process reference: "yes" (right), "no" (it raised; `errors` maps each
first error line to where it happened), "ran" (no reference to compare with: an integer average may
truncate or round), "WRONG" (a wrong answer).

`calls_vs_reading` tries every call of the reading's backend-support table (the UvA slides, the
PyTorch documentation's table at the time) on every backend and device this machine can start,
with two ranks, and sets what it found beside the reading's mark: a cell reads "yes" or "no" when
they agree, "no -> yes" (the reading's mark -> found here) when they differ, and "untried (no)"
(the reading's mark in parentheses) where the pair could not be tried here; `skipped` says why.
Here "yes" means only that the call ran without raising: its values are not checked.

Every probe fails alike on all ranks, before any data moves, so one rank's record speaks for all.
"""
import functools
import re

import torch
import torch.distributed as dist

from helpers import machine
from helpers.spawn import SpawnError, device, spawn

OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
DTYPES = {"float32": torch.float32, "int64": torch.int64}
CALLS = ["all_reduce", "reduce", "reduce_scatter_single"]
BITWISE = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}

READING_CALLS = ["send", "recv", "broadcast", "all_reduce", "reduce", "all_gather", "gather",
                 "scatter", "reduce_scatter", "all_to_all"]
READING_COLUMNS = [("gloo", "cpu"), ("gloo", "cuda"), ("mpi", "cpu"), ("mpi", "cuda"),
                   ("nccl", "cpu"), ("nccl", "cuda")]
READING = {  # the reading's marks, in the order of READING_COLUMNS: Y yes, N no, ? unknown
    "send": "YNY?NY", "recv": "YNY?NY", "broadcast": "YYY?NY", "all_reduce": "YYY?NY",
    "reduce": "YNY?NY", "all_gather": "YNY?NY", "gather": "YNY?NY", "scatter": "YNY?NN",
    "reduce_scatter": "NNNNNY", "all_to_all": "NNY?NY"}
MARK = {"Y": "yes", "N": "no", "?": "?"}


def first_line(error, limit=70):
    """'RuntimeError: the first line of its message', cut to `limit` characters, without a
    leading '[/path/of/torch's/build/file.cc:339] ' (gloo's errors begin with one)."""
    lines = str(error).strip().splitlines() or [""]
    line = re.sub(r"^\[[^\]]*:\d+\]\s*", "", lines[0])
    return f"{type(error).__name__}: {line[:limit]}"


def _reduce_scatter_single(out, x, op):
    # torch 2.13 renamed reduce_scatter_tensor; older torch has only the old name
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn(out, x, op=op)


def installed():
    """{backend: whether this torch has it}."""
    return {b: getattr(dist, f"is_{b}_available")() for b in ("gloo", "nccl", "mpi", "ucc")}


def backends(world_size):
    """One row per backend: installed or not, and the ranks it is probed on (or why it is not)."""
    gpus, rows = len(machine.gpus()), []
    for b, ok in installed().items():
        k, on = 0, "-"
        if ok and b in ("mpi", "ucc"):
            on = "not probed: helpers.spawn starts gloo and nccl only"
        elif ok and b == "nccl" and not gpus:
            on = "not probed: no GPU here"
        elif ok:
            k = world_size if b == "gloo" else min(world_size, gpus)
            on = f"{k} ranks"
        rows.append({"backend": b, "installed": "yes" if ok else "no", "ranks": k, "probed on": on})
    return rows


# ------------------------------------------------------------------------ reduce operations

def _input(rank, k, dtype, dev=None):
    return (torch.arange(1, 2 * k + 1) + rank).to(dtype).to(dev or "cpu")


def try_reduce_ops(rank, world_size):
    """On every rank: {(call, dtype name, op): the result, or the error's first line}."""
    dev, out = device(), {}
    for call in CALLS:
        for dname, dtype in DTYPES.items():
            for name in OPS:
                x, op = _input(rank, world_size, dtype, dev), getattr(dist.ReduceOp, name)
                try:
                    if call == "all_reduce":
                        dist.all_reduce(x, op=op)
                        res = x
                    elif call == "reduce":
                        dist.reduce(x, dst=0, op=op)
                        res = x if rank == 0 else None
                    else:
                        res = torch.empty(2, dtype=dtype, device=dev)
                        _reduce_scatter_single(res, x, op)
                    out[call, dname, name] = res
                except Exception as e:  # noqa: BLE001 - recorded; every rank fails alike
                    out[call, dname, name] = first_line(e)
    return out


def op_reference(name, stacked):
    """The reduction `name` of the rows of `stacked`, in one process; None where none is defined."""
    floating = stacked.is_floating_point()
    if name in BITWISE:
        return None if floating else functools.reduce(BITWISE[name], stacked)
    if name == "AVG":
        return stacked.mean(0) if floating else None
    return {"SUM": stacked.sum(0), "PRODUCT": stacked.prod(0), "MIN": stacked.amin(0),
            "MAX": stacked.amax(0)}[name]


def grade(call, name, dtype, per_rank):
    """("yes" | "no" | "ran" | "WRONG", the error's first line or what was wrong, or None)."""
    errors = [v for v in per_rank if isinstance(v, str)]
    if errors:
        return "no", errors[0]
    k = len(per_rank)
    want = op_reference(name, torch.stack([_input(r, k, dtype) for r in range(k)]))
    if want is None:
        return "ran", None
    for r, got in enumerate(per_rank):
        expected = {"all_reduce": want, "reduce": want if r == 0 else None,
                    "reduce_scatter_single": want.chunk(k)[r]}[call]
        if expected is None:
            continue
        same = (torch.allclose(got, expected, rtol=1e-5, atol=0) if dtype.is_floating_point
                else torch.equal(got, expected))
        if not same:
            return "WRONG", f"{call} {name} {dtype} on rank {r}: got {got.tolist()}, expected {expected.tolist()}"
    return "yes", None


def reduce_ops(world_size, timeout=60):
    """(backends' rows, one row per backend x call x dtype with one column per op of OPS,
    {error's first line: [where it happened]})."""
    probed = backends(world_size)
    rows, errors = [], {}
    for b, k in [(r["backend"], r["ranks"]) for r in probed if r["ranks"]]:
        results = spawn(try_reduce_ops, world_size=k, backend=b, timeout=timeout)
        for call in CALLS:
            for dname, dtype in DTYPES.items():
                row = {"backend": b, "call": call, "dtype": dname}
                for name in OPS:
                    row[name], why = grade(call, name, dtype, [res[call, dname, name] for res in results])
                    if why:
                        errors.setdefault(why, []).append(f"{b} {call} {dname} {name}")
                rows.append(row)
    return probed, rows, errors


# ------------------------------------------------------------- the reading's support table

def try_calls(rank, world_size, where, only=None):
    """On every rank: {call: "yes" (ran without raising) or "no (the error's first line)"} for
    tensors on `where`; every call, or those in `only`."""
    dev = torch.device("cpu") if where == "cpu" else torch.device("cuda", rank % torch.cuda.device_count())
    k, out = world_size, {}
    x = lambda: torch.arange(2 * k, dtype=torch.float32, device=dev) + rank  # noqa: E731

    def attempt(names, fn):
        if only is not None and not set(names) & set(only):
            return
        try:
            fn()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            verdict = "yes"
        except Exception as e:  # noqa: BLE001 - recorded; every rank fails alike
            verdict = f"no ({first_line(e)})"
        for name in names:
            out[name] = verdict

    if k >= 2:
        t = x()
        attempt(["send", "recv"], lambda: dist.send(t, 1) if rank == 0 else
                dist.recv(t, 0) if rank == 1 else None)
    attempt(["broadcast"], lambda: dist.broadcast(x(), src=0))
    attempt(["all_reduce"], lambda: dist.all_reduce(x()))
    attempt(["reduce"], lambda: dist.reduce(x(), dst=0))
    attempt(["all_gather"], lambda: dist.all_gather([x() for _ in range(k)], x()))
    attempt(["gather"], lambda: dist.gather(x(), [x() for _ in range(k)] if rank == 0 else None, dst=0))
    attempt(["scatter"], lambda: dist.scatter(torch.empty(2, device=dev),
                                              list(x().chunk(k)) if rank == 0 else None, src=0))
    attempt(["reduce_scatter"], lambda: dist.reduce_scatter(torch.empty(2, device=dev), list(x().chunk(k))))
    attempt(["all_to_all"], lambda: dist.all_to_all(list(torch.empty(2 * k, device=dev).chunk(k)),
                                                    list(x().chunk(k))))
    return out


def one_at_a_time(backend, where, k, timeout=60, probe=try_calls):
    """The calls of try_calls, each in a spawn of its own: a call that kills its process (an
    abort in C++, which nothing catches) reads "no (rank r died: its first line of output)"
    and the other calls are still tried."""
    out = {}
    for names in [["send", "recv"]] + [[c] for c in READING_CALLS[2:]]:
        try:
            out.update(spawn(probe, world_size=k, backend=backend, args=(where, names),
                             timeout=timeout)[0])
        except SpawnError as e:
            said = str(e).partition("Its last output:\n")[2].strip().splitlines()
            why = f"rank {e.rank} died" + (f": {said[0].strip()[:70]}" if said else "")
            out.update({name: f"no ({why})" for name in names})
    return out


def why_not(backend, where, have, gpus):
    """Why the pair (backend, device) cannot be tried here, or None when it can."""
    if not have.get(backend):
        return f"{backend} is not installed here"
    if backend == "mpi":
        return "mpi starts its ranks with mpirun; helpers.spawn starts gloo and nccl only"
    if (backend == "nccl" or where == "cuda") and not gpus:
        return "no GPU here"
    return None


def cell(mark, found):
    """One cell of the comparison: the reading's mark beside what was found here (None: not tried)."""
    then = MARK[mark]
    if found is None:
        return f"untried ({then})"
    now = found.split(" (")[0]
    return now if now == then else f"{then} -> {now}"


def calls_vs_reading(timeout=60):
    """(rows, {(backend, device): {call: found}}, {(backend, device): why not tried})."""
    have, gpus = installed(), len(machine.gpus())
    found, skipped = {}, {}
    for b, where in READING_COLUMNS:
        reason = why_not(b, where, have, gpus)
        if reason is None:
            k = min(2, gpus) if b == "nccl" else 2
            try:
                res = spawn(try_calls, world_size=k, backend=b, args=(where,), timeout=timeout)
                found[b, where] = res[0]
            except SpawnError as e:
                found[b, where] = one_at_a_time(b, where, k, timeout)
                if all(v.startswith("no (rank") for v in found[b, where].values()):
                    del found[b, where]                       # it does not start at all
                    reason = f"the probe failed: {str(e).splitlines()[0]}"
        if reason is not None:
            skipped[b, where] = reason
    rows = [{"call": name, **{f"{b} {w}": cell(READING[name][j], found.get((b, w), {}).get(name))
                              for j, (b, w) in enumerate(READING_COLUMNS)}}
            for name in READING_CALLS]
    return rows, found, skipped


def differences(found):
    """Where this machine contradicts the reading: one row per (call, backend, device)."""
    rows = []
    for j, (b, where) in enumerate(READING_COLUMNS):
        for name, now in found.get((b, where), {}).items():
            then = MARK[READING[name][j]]
            if now.split(" (")[0] != then:
                rows.append({"call": name, "backend": b, "device": where, "reading": then,
                             "now": now})
    return rows
