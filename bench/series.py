"""How long the whole series takes headless with SMOKE=True, lecture by lecture, measured in one run.

    .venv/bin/python bench/series.py [--only 00 05] [--full]

Each lecture is executed the way CI executes it (papermill, a fresh kernel, SMOKE=True), one after the
other. Prints each lecture's wall time (kernel start included) and the total.
Goal (issue 8): the whole series <= 6 minutes on 2 cores.
"""
import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from helpers import machine  # noqa: E402
from helpers.site import execute, lectures  # noqa: E402

GOAL_S = 6 * 60


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="lecture prefixes, e.g. 00 05")
    ap.add_argument("--full", action="store_true", help="full parameters instead of SMOKE")
    a = ap.parse_args()
    print(machine.banner())
    print(f"load average before: {os.getloadavg()[0]:.1f}\n")
    rows, out = [], tempfile.mkdtemp(prefix="series-")
    for path in lectures(a.only):
        t0 = time.perf_counter()
        error = execute(path, os.path.join(out, path.name), smoke=not a.full)  # as `make html` does
        status = f"FAILED in {error}" if error else "ok"
        seconds = time.perf_counter() - t0
        rows.append((path.stem, seconds, status))
        print(f"{path.stem:24s} {seconds:7.1f} s  {status}", flush=True)
    total = sum(s for _, s, _ in rows)
    print(f"\n{'total':24s} {total:7.1f} s  ({total / 60:.1f} min; load average after: "
          f"{os.getloadavg()[0]:.1f})")
    if not a.full and not a.only:
        print(f"goal: whole series <= {GOAL_S / 60:.0f} min -> {'met' if total <= GOAL_S else 'NOT met'}")


if __name__ == "__main__":
    main()
