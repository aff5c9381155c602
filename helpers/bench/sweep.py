"""In the caller: a plan of collectives, its launches on K ranks (helpers.spawn, or torchrun's ranks),
and the per-rank timings combined into one row per (collective, K, size)."""
import os

from helpers.bench.common import AVERAGE, COLLECTIVES, METHODS, REDUCING, ROOTED, size_range
from helpers.bench.rank import measure_rank
from helpers.spawn import under_torchrun


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
                    # one rank moves nothing between ranks: no busbw (the series' rule; printed "-")
                    "busbw": busbw(row["kind"], row["size"], s["median"], world_size) if world_size > 1 else 0.0,
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
    shuffled order round by round (measure_rank); a progress line (helpers.progress) follows the launches.
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
    from helpers.progress import Progress

    bar = Progress(len(jobs), "sweep", "launches") if progress else None
    try:
        for k, group in jobs:
            per_rank = spawn(measure_rank, k, args=(group, sizes, warmup, iters, dtype, check, False,
                                                    0, method, rounds),
                             backend=backend, timeout=timeout, threads=threads)
            rows += combine(per_rank, k, dtype, average)
            if bar is not None:
                bar.update(note=f"{', '.join(g[0] for g in group)} on {k} ranks")
    finally:
        if bar is not None:
            bar.close()
    return rows
