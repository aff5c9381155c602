"""Printing rows as nccl-tests does, and the results file (JSON or CSV) that carries the machine."""
import csv
import datetime
import io
import json
import socket
import sys

from helpers.bench.common import COLUMNS, FORMAT
from helpers.timing import spread_label
from helpers.spawn import under_torchrun


def human_size(n):
    """67108864 -> "64M", 4096 -> "4K" (the way -b/-e take sizes); other numbers as they are."""
    for unit, size in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def _busbw(row):
    """busbw as printed: "-" for one rank, which moves nothing between ranks (no bus to measure)."""
    return "-" if row["world_size"] == 1 else f"{row['busbw']:.3f}"


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
        several = spread and len(r0["times_us"]) > 1   # one round has no spread to print
        label = f"{spread_label(len(r0['times_us']))}(us)"   # up to 5 rounds, p10-p90 is min-max
        cols = ["size", "count", "type", "redop", "root", "time(us)"] + \
            ([label] if several else []) + ["algbw(GB/s)", "busbw(GB/s)", "#wrong"]
        shown = [{"size": r["size"], "count": r["count"], "type": r["type"], "redop": r["redop"],
                  "root": r["root"], "time(us)": f"{r['time_us']:.1f}",
                  label: f"{r['p10_us']:.0f}-{r['p90_us']:.0f}",
                  "algbw(GB/s)": f"{r['algbw']:.3f}", "busbw(GB/s)": _busbw(r),
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
