"""The series' three time budgets on this machine (issue 20), each measured in one run and printed
against its goal.

    .venv/bin/python bench/series.py            every lecture headless with SMOKE=True       goal <= 5 min
    .venv/bin/python bench/series.py --html     `make html`: full sizes, executed, site built goal <= 8 min
    .venv/bin/python bench/series.py --test     `make test` in a fresh clone of HEAD          goal <= 10 min
    .venv/bin/python bench/series.py --only 00 05 [--full]    those lectures, SMOKE (or full) sizes

The first executes each lecture the way CI does (papermill, a fresh kernel), one after the other, and
prints each lecture's wall time (kernel start included). --html runs `make html`'s command,
`python -m helpers.site --out build/html` (so `python -m helpers.images build/executed` can keep that
run's key figures). --test clones this repository's committed HEAD into a temporary
folder and runs `make test` there, building its environment from nothing as CI does (pip's cache
helps, as it helps CI); it needs Chromium for the browser tests to count.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from helpers import machine  # noqa: E402
from helpers.site import execute, lectures  # noqa: E402

GOALS_MIN = {"series": 5, "html": 8, "test": 10}   # issue 33: 5 min for the series after the splits


def verdict(name, seconds):
    goal = GOALS_MIN[name]
    return f"goal: <= {goal} min -> {'met' if seconds <= goal * 60 else 'NOT met'} ({seconds / 60:.1f} min)"


def timed(cmd, cwd):
    """Run cmd, its output streamed; (seconds, exit status)."""
    t0 = time.perf_counter()
    status = subprocess.run(cmd, cwd=cwd).returncode
    return time.perf_counter() - t0, status


def series(only, full):
    rows, out = [], tempfile.mkdtemp(prefix="series-")
    for path in lectures(only):
        t0 = time.perf_counter()
        error = execute(path, os.path.join(out, path.name), smoke=not full)  # as `make html` does
        rows.append((path.stem, time.perf_counter() - t0, f"FAILED in {error}" if error else "ok"))
        print(f"{rows[-1][0]:28s} {rows[-1][1]:7.1f} s  {rows[-1][2]}", flush=True)
    total = sum(s for _, s, _ in rows)
    print(f"\n{'total':28s} {total:7.1f} s  (load average after: {os.getloadavg()[0]:.1f})")
    if not full and not only:
        print("the whole series headless, SMOKE: " + verdict("series", total))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="lecture prefixes, e.g. 00 05")
    ap.add_argument("--full", action="store_true", help="full parameters instead of SMOKE")
    ap.add_argument("--html", action="store_true", help="time `make html` (full sizes, site built)")
    ap.add_argument("--test", action="store_true", help="time `make test` in a fresh clone of HEAD")
    a = ap.parse_args()
    print(machine.banner())
    print(f"load average before: {os.getloadavg()[0]:.1f}\n")
    if a.html:
        seconds, status = timed([sys.executable, "-m", "helpers.site", "--out", os.path.join(ROOT, "build", "html")], ROOT)
        print(f"\nmake html (full sizes): {'ok' if status == 0 else f'FAILED (exit {status})'}; " + verdict("html", seconds))
    elif a.test:
        with tempfile.TemporaryDirectory(prefix="clone-") as tmp:
            subprocess.run(["git", "clone", "--quiet", ROOT, os.path.join(tmp, "project")], check=True)
            seconds, status = timed(["make", "test"], os.path.join(tmp, "project"))
        print(f"\nmake test in a fresh clone: {'passed' if status == 0 else f'FAILED (exit {status})'}; " + verdict("test", seconds))
    else:
        series(a.only, a.full)


if __name__ == "__main__":
    main()
