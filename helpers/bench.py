"""Measuring collectives the way nccl-tests does, from a notebook or from the command line.

    from helpers import bench
    rows = bench.sweep(["all_reduce", "all_gather"], world_sizes=[2, 4],
                       sizes=bench.size_range("1K", "64M", 2), warmup=5, iters=20, rounds=5)
    bench.table(rows)                       # size count type redop root time algbw busbw #wrong

The default measurement is nccl-tests' (method="nccl-tests"; its letters on the command line):
- a size sweep from -b to -e bytes, multiplied by -f each step (powers of two by default);
- -w warm-up calls first (the first collective builds the connections);
- then, per size, one barrier and -n calls back to back, the clock read once around the loop (CUDA
  events recorded on the current stream on a GPU, perf_counter on the CPU): time = loop / n;
- the ranks' times combined as -a says (0 rank 0, 1 the mean, its default, 2 min, 3 max);
- -N cycles of that, here in rounds: each round measures every size once, in a freshly shuffled order
  (the same on every rank), so a change in the machine's load falls on all sizes alike; the median
  over the rounds is reported, with their 10th and 90th percentiles as the spread. (nccl-tests runs
  its cycles size after size; the shuffled order is our one departure, and rounds=1 is nccl-tests.)
- algbw = size / time (GB = 1e9 bytes), busbw = algbw x nccl-tests' factor (helpers.cost);
- -c 1: every benchmarked collective is checked once more after timing, from restored inputs: inputs
  hold small integers, so the result is exact in any order of summation, and the elements that
  differ from the expected result are counted (nccl-tests' `#wrong`).

A second measurement, named as such (method="per-call", --method per-call): a barrier before every
call, each call timed on every rank, per call the slowest rank's time, then the median and the
10th-90th percentiles over the calls. It measures the distribution of one call's latency, including
the barrier's release skew: useful on a noisy machine or for a latency-bound call, not comparable
with nccl-tests' numbers (lecture 03 runs both and shows where they differ).

Any callable can be benchmarked in place of the library's collective, as long as it has the same
meaning: pass `{"my ring": ("all_reduce", my_ring_all_reduce)}` and the harness makes the buffers,
times it, checks it and reports it with all_reduce's busbw factor. The signatures, per meaning:
    all_reduce(tensor)            in place, sum over ranks
    reduce(tensor, root)          in place, the sum lands on root
    broadcast(tensor, root)       in place, root's values everywhere
    all_gather(output, input)     output (K*c elements) = every rank's input (c elements), in rank order
    reduce_scatter(output, input) output (c elements) = this rank's chunk of the sum of the inputs (K*c)
    send_recv(send, recv)         send to rank+1, receive from rank-1 (a ring shift)

Command line (the same harness; standalone it starts its ranks with helpers.spawn, under torchrun it
runs in the ranks torchrun started):
    python -m helpers.bench --world-size 2 -b 1K -e 64M -f 2 --out results.json
    torchrun --nproc-per-node 2 -m helpers.bench -b 1K -e 64M -f 2 --out results.json
"""
import argparse
import csv
import datetime
import io
import json
import os
import socket
import sys
import time

from helpers.spawn import under_torchrun

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "send_recv")
ROOTED = ("broadcast", "reduce")
REDUCING = ("all_reduce", "reduce", "reduce_scatter")
COLUMNS = ("collective", "world_size", "backend", "size", "count", "type", "redop", "root",
           "time_us", "p10_us", "p90_us", "algbw", "busbw", "wrong", "iters", "method", "ranks")
FORMAT = "helpers.bench/1"
METHODS = ("per-call", "nccl-tests")
# nccl-tests' -a: how the ranks' times of one measurement are combined (name, function)
AVERAGE = {0: ("rank 0", lambda ts: ts[0]), 1: ("mean", lambda ts: sum(ts) / len(ts)),
           2: ("min", min), 3: ("max", max)}


# --------------------------------------------------------------------------------- sizes

def parse_size(text):
    """'64M' -> 67108864, '1K' -> 1024, '4096' -> 4096 (K, M, G are powers of 1024, as in nccl-tests)."""
    if isinstance(text, (int, float)):
        return int(text)
    s = str(text).strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(s[-1:], 1)
    try:
        return int(float(s[:-1] if scale > 1 else s) * scale)
    except ValueError:
        raise ValueError(f"cannot read a size from {text!r}; write e.g. 4096, 64K, 16M or 1G.") from None


def size_range(min_bytes="1K", max_bytes="64M", factor=2):
    """min, min*factor, ... up to max (inclusive): nccl-tests' -b/-e/-f sweep."""
    lo, hi = parse_size(min_bytes), parse_size(max_bytes)
    if lo < 1 or hi < lo:
        raise ValueError(f"need 1 <= min_bytes <= max_bytes, got {lo} and {hi}.")
    if factor <= 1:
        raise ValueError(f"the step factor must be > 1, got {factor}.")
    out, n = [], lo
    while n <= hi:
        out.append(int(n))
        n = n * factor
    return out


# ------------------------------------------------------------------------- inside one rank

CHECK_BLOCK = 2**22  # elements compared at a time by the correctness check (bounds its memory)


def _pattern(rank, count, dtype, dev, start=0):
    """Elements start..start+count of what rank `rank` contributes: small integers (0..15), exact
    in every dtype and in any order of summation."""
    import torch

    i = torch.arange(start, start + count, dtype=torch.int64, device=dev)
    return ((i + 3 * rank) % 16).to(dtype)


class _Case:
    """The buffers, the call and the check of one collective at one size on one rank.

    `pool` (a dict) lets the cases of one collective share buffers, as nccl-tests does: each case
    uses the first `count` elements of buffers sized for the largest case (make that one first), so a
    sweep holds a few buffers of the largest size, not of every size.
    """

    def __init__(self, kind, nbytes, k, rank, dtype, dev, fn=None, pool=None):
        import torch

        self.kind, self.k, self.rank, self.dtype, self.dev = kind, k, rank, dtype, dev
        item = torch.empty((), dtype=dtype).element_size()
        count = max(1, nbytes // item)
        if kind in ("all_gather", "reduce_scatter"):
            count = max(k, count // k * k)  # the full array splits evenly, as in nccl-tests
        self.count, self.nbytes, self.chunk = count, count * item, count // k
        self.fn = fn or _library(kind)
        pool = {} if pool is None else pool

        def buffer(name, n, make):  # the first n elements of the pool's buffer (a prefix of a pattern
            if name not in pool or pool[name].numel() < n:  # is the pattern of the prefix)
                pool[name] = make(n)
            return pool[name][:n]

        pattern = lambda n: _pattern(rank, n, dtype, dev)  # noqa: E731
        empty = lambda n: torch.empty(n, dtype=dtype, device=dev)  # noqa: E731
        self.src = self.buf = self.out = None
        if kind in ("all_reduce", "reduce", "broadcast"):
            make = pattern if kind != "broadcast" or rank == 0 else \
                (lambda n: torch.zeros(n, dtype=dtype, device=dev))
            self.src, self.buf = buffer("src", count, make), buffer("buf", count, empty)
        elif kind == "all_gather":
            self.inp, self.out = buffer("inp", self.chunk, pattern), buffer("out", count, empty)
        elif kind == "reduce_scatter":
            self.inp, self.out = buffer("inp", count, pattern), buffer("out", self.chunk, empty)
        elif kind == "send_recv":
            self.inp, self.out = buffer("inp", count, pattern), buffer("out", count, empty)
        else:
            raise ValueError(f"unknown collective {kind!r}; known: {', '.join(COLLECTIVES)}.")
        self.reset()

    def reset(self):
        """Before each run (untimed): restore the inputs an in-place collective overwrites, and fill
        outputs with -1, a value no correct result holds (so a call that leaves its output alone,
        or a value left by another size's run in the shared buffer, counts as wrong)."""
        if self.buf is not None:
            self.buf.copy_(self.src)
        if self.out is not None:
            self.out.fill_(-1)

    def run(self):
        if self.kind in ("all_reduce",):
            self.fn(self.buf)
        elif self.kind in ROOTED:
            self.fn(self.buf, 0)
        elif self.kind == "send_recv":
            self.fn(self.inp, self.out)
        else:
            self.fn(self.out, self.inp)

    def wrong(self):
        """How many elements of this rank's result differ from the expected result (#wrong)."""
        import torch

        k, dev = self.k, self.dev
        if self.kind == "reduce" and self.rank != 0:
            return 0  # only the root's result is defined
        if self.kind in ("all_reduce", "reduce", "broadcast"):
            got, offset = self.buf, 0
        elif self.kind == "reduce_scatter":
            got, offset = self.out, self.rank * self.chunk
        else:
            got, offset = self.out, 0
        wrong = 0
        for start in range(0, got.numel(), CHECK_BLOCK):
            part = got[start:start + CHECK_BLOCK]
            n, first = part.numel(), offset + start
            if self.kind in REDUCING:
                want = sum(_pattern(r, n, torch.float64, dev, first) for r in range(k))
                wrong += int((part.double() != want).sum())
                continue
            if self.kind == "broadcast":
                want = _pattern(0, n, self.dtype, dev, first)
            elif self.kind == "send_recv":
                want = _pattern((self.rank - 1) % k, n, self.dtype, dev, first)
            else:  # all_gather: element j came from rank j // chunk, its element j % chunk
                j = torch.arange(first, first + n, device=dev)
                want = ((j % self.chunk + 3 * (j // self.chunk)) % 16).to(self.dtype)
            wrong += int((part != want).sum())
        return wrong


def _library(kind):
    """torch.distributed's own collective with the harness's signature for `kind`."""
    import torch.distributed as dist

    if kind == "all_reduce":
        return lambda t: dist.all_reduce(t)
    if kind == "reduce":
        return lambda t, root: dist.reduce(t, root)
    if kind == "broadcast":
        return lambda t, root: dist.broadcast(t, root)
    if kind == "all_gather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda out, inp: gather(out, inp)
    if kind == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda out, inp: scatter(out, inp)
    if kind == "send_recv":
        return _send_recv
    raise ValueError(f"unknown collective {kind!r}; known: {', '.join(COLLECTIVES)}.")


def _send_recv(send, recv):
    """nccl-tests' sendrecv: every rank sends to the next and receives from the previous one."""
    import torch.distributed as dist

    rank, k = dist.get_rank(), dist.get_world_size()
    if k == 1:
        recv.copy_(send)
        return
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % k), dist.P2POp(dist.irecv, recv, (rank - 1) % k)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()


def _start_together(case, dev):
    """Untimed: restore the inputs, let queued GPU work finish, then a barrier (it returns on every
    rank once all have entered it; under NCCL it blocks the host too)."""
    import torch.distributed as dist

    from helpers.timing import sync

    case.reset()
    sync(dev)
    dist.barrier()
    sync(dev)


def _time_loop(case, dev, iters):
    """nccl-tests' measurement on this rank: after one barrier, `iters` calls back to back, the clock
    read once around the loop (CUDA events on the current stream on a GPU: a call without async_op
    makes that stream wait for the collective), divided by `iters`. Seconds per call."""
    import torch

    _start_together(case, dev)
    if dev.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            case.run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        case.run()
    return (time.perf_counter() - t0) / iters


def measure_rank(rank, world_size, plan, sizes, warmup, iters, dtype="float32", check=True,
                 progress=False, seed=0, method="nccl-tests", rounds=1):
    """Run in every rank: for each (label, kind, fn) in plan and each size, this rank's timings.

    After `warmup` untimed runs of every case, rounds; in each round every (collective, size) of the
    plan is measured once, in an order shuffled afresh per round (the same on every rank, from
    `seed`), so a change in the machine's load, or a cache warmed by the call before, falls on every
    size and collective alike instead of on one stretch of the sweep.
    method="per-call": `iters` rounds, each measuring one call after a barrier (times: one per call).
    method="nccl-tests": `rounds` rounds, each measuring `iters` calls back to back after one
    barrier, divided by `iters` (times: one per round; nccl-tests' -N cycles, its -n calls).
    The result of each case's last run is checked (`wrong`): after the timed loop of nccl-tests'
    method (whose in-place calls compound), once more from restored inputs, as its -c 1 does.
    Returns {"host", "backend", "method", "rows": [{label, kind, size, count, times (s), wrong}]}.
    """
    import random

    import torch
    import torch.distributed as dist

    from helpers.spawn import device

    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}.")
    dev = device()
    dt = getattr(torch, dtype)
    pools = {label: {} for label, _, _ in plan}  # largest size first: the pool's buffers fit them all
    cases = {(i, n): _Case(kind, n, world_size, rank, dt, dev, fn, pools[label])
             for i, (label, kind, fn) in enumerate(plan) for n in sorted(sizes, reverse=True)}
    for case in cases.values():
        for _ in range(warmup):
            case.reset()
            case.run()
    times = {key: [] for key in cases}
    wrong = {key: -1 for key in cases}
    order, rng = list(cases), random.Random(seed)
    n_rounds, calls = (iters, 1) if method == "per-call" else (rounds, iters)   # rounds; calls timed per round
    bar = None
    if progress and rank == 0:
        from tqdm import tqdm

        bar = tqdm(total=n_rounds, desc="bench", unit="round", file=sys.stderr)
    for r in range(n_rounds):
        rng.shuffle(order)
        for key in order:
            times[key].append(_time_loop(cases[key], dev, calls))
            if check and r == n_rounds - 1:  # checked at once: the next case may share its buffers
                if method != "per-call":
                    cases[key].reset()
                    cases[key].run()
                wrong[key] = cases[key].wrong()
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    rows = [{"label": label, "kind": kind, "size": cases[(i, n)].nbytes, "count": cases[(i, n)].count,
             "times": times[(i, n)], "wrong": wrong[(i, n)]}
            for i, (label, kind, _) in enumerate(plan) for n in sizes]
    return {"host": socket.gethostname(), "backend": dist.get_backend(), "method": method,
            "iters": iters, "rows": rows}


# ------------------------------------------------------------------------ in the caller

def _plan(collectives):
    """['all_reduce', ...] or {label: kind or (kind, fn)} -> [(label, kind, fn or None)]."""
    if isinstance(collectives, str):
        collectives = [collectives]
    items = collectives.items() if isinstance(collectives, dict) else ((c, c) for c in collectives)
    plan = []
    for label, what in items:
        kind, fn = (what, None) if isinstance(what, str) else tuple(what)
        if kind not in COLLECTIVES:
            raise ValueError(f"{label!r}: unknown collective {kind!r}; known: {', '.join(COLLECTIVES)}.")
        if fn is not None and not callable(fn):
            raise ValueError(f"{label!r}: the function to benchmark must be callable, got {fn!r}.")
        plan.append((label, kind, fn))
    return plan


def combine(per_rank, world_size, dtype="float32", average=1):
    """Per-rank timings -> one row per (collective, size), then the median over runs (or rounds).

    Per call (method "per-call"): per run the slowest rank's time. nccl-tests' method: per round the
    ranks' times combined as its -a says (0: rank 0's, 1: their mean, its default, 2: min, 3: max).
    """
    from helpers.cost import algbw, busbw
    from helpers.timing import summary

    backend = per_rank[0]["backend"]
    method = per_rank[0].get("method", "per-call")
    if average not in AVERAGE:
        raise ValueError(f"average must be one of {sorted(AVERAGE)} (nccl-tests' -a), got {average!r}.")
    across = max if method == "per-call" else AVERAGE[average][1]
    out = []
    for i, row in enumerate(per_rank[0]["rows"]):
        slowest = [across([r["rows"][i]["times"][j] for r in per_rank]) for j in range(len(row["times"]))]
        s = summary(slowest)
        wrong = sum(r["rows"][i]["wrong"] for r in per_rank) if row["wrong"] >= 0 else -1
        out.append({"collective": row["label"], "kind": row["kind"], "world_size": world_size,
                    "backend": backend, "size": row["size"], "count": row["count"], "type": dtype,
                    "redop": "sum" if row["kind"] in REDUCING else "none",
                    "root": 0 if row["kind"] in ROOTED else -1,
                    "time_us": s["median"] * 1e6, "p10_us": s["p10"] * 1e6, "p90_us": s["p90"] * 1e6,
                    "algbw": algbw(row["size"], s["median"]),
                    "busbw": busbw(row["kind"], row["size"], s["median"], world_size),
                    "wrong": wrong, "iters": len(slowest) if method == "per-call" else per_rank[0]["iters"],
                    "method": method, "ranks": "slowest" if method == "per-call" else AVERAGE[average][0],
                    "times_us": [t * 1e6 for t in slowest]})
    return out


def sweep(collectives=("all_reduce",), world_sizes=(2,), sizes=None, warmup=5, iters=20,
          dtype="float32", backend="auto", check=True, progress=True, timeout=600, threads=1,
          interleave=False, method="nccl-tests", rounds=1, average=1):
    """Measure `collectives` at every size on every world size; one row per (collective, K, size).

    method="per-call": `iters` timed calls per size, each after a barrier; time = the median over
    calls of the slowest rank's time (with its spread). method="nccl-tests": `rounds` times, `iters`
    calls back to back after one barrier, timed as a loop; time = loop / iters, ranks combined as
    `average` says (nccl-tests' -a: 1 = mean), the median over rounds when there are several.

    collectives: names from COLLECTIVES, or {label: kind or (kind, callable)} to benchmark your own
    implementation with the meaning of `kind` (signatures in the module docstring).
    Each (collective, world size) is one launch of helpers.spawn, in which the sizes take turns in a
    shuffled order round by round (measure_rank); a progress bar follows the launches.
    interleave=True: one launch per world size, in which the collectives take turns too (fair
    comparisons between them on a machine whose load changes; it holds every collective's buffers
    at once). Under torchrun the sweep runs in place on the ranks torchrun started (world_sizes is
    ignored; every collective in one launch).
    """
    from helpers.spawn import spawn

    plan = _plan(collectives)
    sizes = list(sizes or size_range())
    if not (isinstance(iters, int) and iters >= 1 and isinstance(warmup, int) and warmup >= 0):
        raise ValueError(f"need iters >= 1 and warmup >= 0 (whole numbers), got {iters} and {warmup}.")
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}.")
    if not (isinstance(rounds, int) and rounds >= 1):
        raise ValueError(f"rounds must be a whole number >= 1, got {rounds!r}.")
    if average not in AVERAGE:
        raise ValueError(f"average must be one of {sorted(AVERAGE)} (nccl-tests' -a), got {average!r}.")
    if isinstance(world_sizes, int):
        world_sizes = [world_sizes]
    rows = []
    if under_torchrun():
        k = int(os.environ["WORLD_SIZE"])
        per_rank = spawn(measure_rank, k, args=(plan, sizes, warmup, iters, dtype, check, progress,
                                                0, method, rounds), backend=backend)
        return combine(per_rank, k, dtype, average)
    jobs = [(k, plan) for k in world_sizes] if interleave else \
        [(k, [p]) for k in world_sizes for p in plan]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(jobs), desc="sweep", unit="launch")
    try:
        for k, group in jobs:
            if bar is not None:
                bar.set_postfix_str(f"{', '.join(g[0] for g in group)} on {k} ranks")
            per_rank = spawn(measure_rank, k, args=(group, sizes, warmup, iters, dtype, check, False,
                                                    0, method, rounds),
                             backend=backend, timeout=timeout, threads=threads)
            rows += combine(per_rank, k, dtype, average)
            if bar is not None:
                bar.update()
    finally:
        if bar is not None:
            bar.close()
    return rows


# ---------------------------------------------------------------------------- printing, files

def human_size(n):
    """67108864 -> "64M", 4096 -> "4K" (the way -b/-e take sizes); other numbers as they are."""
    for unit, size in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def table(rows, spread=True):
    """Print rows as nccl-tests does: size count type redop root time algbw busbw #wrong.

    One block per (collective, world size, backend); time in microseconds (the slowest rank's median,
    with its 10th-90th percentile spread when `spread`), bandwidths in GB/s.
    """
    from helpers.report import table as print_table

    blocks = {}
    for r in rows:
        blocks.setdefault((r["collective"], r["world_size"], r["backend"]), []).append(r)
    for (name, k, backend), block in blocks.items():
        r0 = block[0]
        if r0.get("method", "per-call") == "per-call":
            print(f"# {name} on {k} ranks ({backend}), per call: {r0['iters']} timed calls per size, each "
                  "after a barrier; time = median of the slowest rank")
        else:
            rounds = len(r0["times_us"])
            print(f"# {name} on {k} ranks ({backend}), nccl-tests' method: {r0['iters']} calls back to back "
                  f"after one barrier, time = loop / {r0['iters']}, ranks' {r0['ranks']} (-a)"
                  + (f"; median of {rounds} rounds" if rounds > 1 else ""))
        cols = ["size", "count", "type", "redop", "root", "time(us)"] + \
            (["p10-p90(us)"] if spread else []) + ["algbw(GB/s)", "busbw(GB/s)", "#wrong"]
        shown = [{"size": r["size"], "count": r["count"], "type": r["type"], "redop": r["redop"],
                  "root": r["root"], "time(us)": f"{r['time_us']:.1f}",
                  "p10-p90(us)": f"{r['p10_us']:.0f}-{r['p90_us']:.0f}",
                  "algbw(GB/s)": f"{r['algbw']:.3f}", "busbw(GB/s)": f"{r['busbw']:.3f}",
                  "#wrong": r["wrong"] if r["wrong"] >= 0 else "n/a"} for r in block]
        print_table(shown, cols)
        print()


def metadata(world_size=None, backend=None, hosts=None, params=None, command=None):
    """What a results file says about where and how it was measured."""
    from helpers.machine import describe

    return {"format": FORMAT, "machine": describe(), "hosts": hosts or [socket.gethostname()],
            "world_size": world_size, "backend": backend,
            "launcher": "torchrun" if under_torchrun() else "helpers.spawn",
            "command": command or " ".join(sys.argv), "params": params or {},
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def save(rows, path, meta=None):
    """Write rows and the machine description to `path`: JSON (.json) or CSV (.csv, meta as # lines)."""
    meta = meta or metadata()
    if str(path).endswith(".csv"):
        buf = io.StringIO()
        for key, value in meta.items():
            buf.write(f"# {key}: {json.dumps(value)}\n")
        w = csv.DictWriter(buf, fieldnames=list(COLUMNS) + ["kind", "times_us"], lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({**{c: r.get(c) for c in COLUMNS}, "kind": r["kind"],
                        "times_us": " ".join(f"{t:.3f}" for t in r["times_us"])})
        text = buf.getvalue()
    else:
        text = json.dumps({**meta, "rows": rows}, indent=1)
    with open(path, "w") as f:
        f.write(text)
    return path


def load(path):
    """Read a results file written by save(): returns (rows, meta)."""
    with open(path) as f:
        text = f.read()
    if not str(path).endswith(".csv"):
        data = json.loads(text)
        rows = data.pop("rows")
        return rows, data
    meta, lines = {}, []
    for line in text.splitlines():
        if line.startswith("# ") and ": " in line:
            key, value = line[2:].split(": ", 1)
            meta[key] = json.loads(value)
        elif line.strip():
            lines.append(line)
    rows = []
    for r in csv.DictReader(lines):
        row = dict(r)
        for c in ("world_size", "size", "count", "root", "wrong", "iters"):
            row[c] = int(row[c])
        for c in ("time_us", "p10_us", "p90_us", "algbw", "busbw"):
            row[c] = float(row[c])
        row["times_us"] = [float(t) for t in row["times_us"].split()]
        rows.append(row)
    return rows, meta


# ------------------------------------------------------------------------------ the command

def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m helpers.bench",
        description="Benchmark collectives and write a results file. By default as nccl-tests does: "
                    "per size, -w warm-up calls, one barrier, -n calls back to back timed as one loop, "
                    "time = loop / n, the ranks' times combined by -a; algbw, busbw, #wrong. With "
                    "--method per-call: a barrier before every call, each call timed, the slowest "
                    "rank's median and 10th-90th percentiles (a spread, for noisy machines). "
                    "Standalone it starts --world-size ranks itself; under `torchrun --nproc-per-node N "
                    "-m helpers.bench` it runs in the ranks torchrun started (any number of nodes).")
    p.add_argument("--collectives", default="all_reduce,all_gather,reduce_scatter,broadcast",
                   help=f"comma-separated, from {','.join(COLLECTIVES)}, or 'all' (default: %(default)s)")
    p.add_argument("-b", "--minbytes", "--min-bytes", dest="min_bytes", default="1K",
                   help="smallest size (default: %(default)s)")
    p.add_argument("-e", "--maxbytes", "--max-bytes", dest="max_bytes", default="64M",
                   help="largest size (default: %(default)s)")
    p.add_argument("-f", "--stepfactor", "--factor", dest="factor", type=float, default=2,
                   help="size step factor (default: 2)")
    p.add_argument("-w", "--warmup_iters", "--warmup", dest="warmup", type=int, default=5,
                   help="untimed calls per size (default: 5)")
    p.add_argument("-n", "--iters", type=int, default=20,
                   help="calls per timed loop; with --method per-call, timed calls (default: 20)")
    p.add_argument("-N", "--run_cycles", "--rounds", dest="rounds", type=int, default=1,
                   help="timed loops per size, in shuffled rounds; the median is reported (default: 1)")
    p.add_argument("-d", "--datatype", "--dtype", dest="dtype", default="float32",
                   help="element type (default: float32)")
    p.add_argument("-a", "--average", type=int, default=1, choices=sorted(AVERAGE),
                   help="how the ranks' times combine: 0 rank 0, 1 mean, 2 min, 3 max (default: 1); "
                        "--method per-call always takes the slowest rank")
    p.add_argument("-c", "--check", type=int, default=1, choices=(0, 1),
                   help="1: check every result and count wrong elements, #wrong (default: 1)")
    p.add_argument("--method", default="nccl-tests", choices=METHODS,
                   help="nccl-tests (a timed loop) or per-call (one timed call per barrier) (default: %(default)s)")
    p.add_argument("--world-size", type=int, default=2,
                   help="ranks to start when not under torchrun (default: 2)")
    p.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("-o", "--out", default=None, help="results file, .json or .csv (default: none)")
    a = p.parse_args(argv)
    names = COLLECTIVES if a.collectives == "all" else [c.strip() for c in a.collectives.split(",") if c.strip()]
    torchrun = under_torchrun()
    k = int(os.environ["WORLD_SIZE"]) if torchrun else a.world_size
    rank = int(os.environ.get("RANK", 0)) if torchrun else 0
    if a.out and not (a.out.endswith(".json") or a.out.endswith(".csv")):
        p.error(f"--out must end in .json or .csv, got {a.out!r}")  # every rank stops alike
    unknown = [n for n in names if n not in COLLECTIVES]
    if unknown:
        p.error(f"unknown collective(s) {unknown}; choose from {', '.join(COLLECTIVES)} or 'all'")
    if a.rounds < 1 or a.iters < 1 or a.warmup < 0:
        p.error(f"need -n >= 1, -N >= 1 and -w >= 0, got {a.iters}, {a.rounds} and {a.warmup}")
    sizes = size_range(a.min_bytes, a.max_bytes, a.factor)
    hosts = []
    if torchrun:
        from helpers.spawn import spawn  # under torchrun: joins the group, runs in this process

        plan = _plan(list(names))
        per_rank = spawn(measure_rank, k, args=(plan, sizes, a.warmup, a.iters, a.dtype, bool(a.check),
                                                not a.no_progress, 0, a.method, a.rounds), backend=a.backend)
        rows = combine(per_rank, k, a.dtype, a.average)
        hosts = sorted({r["host"] for r in per_rank})
    else:
        rows = sweep(list(names), [k], sizes, a.warmup, a.iters, a.dtype, a.backend, bool(a.check),
                     not a.no_progress, average=a.average, method=a.method, rounds=a.rounds)
    if rank != 0:
        return rows
    from helpers.machine import banner

    print(banner(k, rows[0]["backend"] if rows else a.backend))
    table(rows)
    wrong = sum(max(r["wrong"], 0) for r in rows)
    print(f"# out-of-bounds values: {wrong} ({'OK' if wrong == 0 else 'WRONG RESULTS'})")
    if a.out:
        params = {"collectives": list(names), "sizes": sizes, "warmup": a.warmup, "iters": a.iters,
                  "rounds": a.rounds, "method": a.method, "average": a.average, "dtype": a.dtype,
                  "check": bool(a.check)}
        args = " ".join(sys.argv[1:] if argv is None else argv)
        local = int(os.environ.get("LOCAL_WORLD_SIZE", k))
        command = (f"torchrun --nnodes {k // local} --nproc-per-node {local} -m helpers.bench {args}"
                   if torchrun else f"python -m helpers.bench {args}")
        save(rows, a.out, metadata(k, rows[0]["backend"] if rows else a.backend, hosts or None, params,
                                   command))
        print(f"# results written to {a.out}")
    return rows


if __name__ == "__main__":
    main()
