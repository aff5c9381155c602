"""The series' time budgets on this machine (issues 20 and 44), each measured in one run and printed
against its goal.

    .venv/bin/python bench/series.py            every lecture headless with SMOKE=True       goal <= 5 min
    .venv/bin/python bench/series.py --html     `make html`: full sizes, executed, site built goal <= 8 min,
                                                and no cell over 30 s
    .venv/bin/python bench/series.py --test     `make test` in a fresh clone of HEAD          goal <= 8 min,
                                                the browser tests run (a skip fails the verdict)
    .venv/bin/python bench/series.py --test --base REV    REV first, then HEAD, back to back
    .venv/bin/python bench/series.py --only 00 05 [--full]    those lectures, SMOKE (or full) sizes

Machines of one kind differ by up to 2x, so a budget is read with a baseline: --base REV runs the same
command on a fresh clone of REV just before HEAD's, on the same machine, and prints the ratio.

The first executes each lecture the way CI does (papermill, a fresh kernel), one after the other, and
prints each lecture's wall time (kernel start included). --html runs `make html` in a fresh clone of
each commit (its environment built first by `make env`, timed apart), then reads the executed
notebooks (build/executed/) for the slowest cells. --test runs `make test` in a fresh clone of each
commit, building its environment from nothing as CI does (pip's cache helps, as it helps CI); it
needs Chromium for the browser tests to count.
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from helpers import machine  # noqa: E402
from helpers.site.build import execute, lectures  # noqa: E402

GOALS_MIN = {"series": 5, "html": 8, "test": 8}   # issue 44: 8 minutes each for make test and make html
CELL_GOAL_S = 30                                   # issue 44: no cell of a full-size run over 30 s
BROWSER_TESTS = ("tests/test_site.py", "tests/test_lab.py")


def verdict(name, seconds, *also):
    goal = GOALS_MIN[name]
    ok = seconds <= goal * 60 and all(also)
    return f"goal: <= {goal} min -> {'met' if ok else 'NOT met'} ({seconds / 60:.1f} min)"


def timed(cmd, cwd):
    """Run cmd, its output streamed and kept; (seconds, exit status, output)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = []
    for line in proc.stdout:
        sys.stdout.write(line)
        out.append(line)
    return time.perf_counter() - t0, proc.wait(), "".join(out)


def clone(rev, into):
    """A fresh clone of this repository's commit `rev`, as CI gets one: its path."""
    path = os.path.join(into, rev.replace("/", "_"))
    subprocess.run(["git", "clone", "--quiet", ROOT, path], check=True)
    subprocess.run(["git", "checkout", "--quiet", rev], cwd=path, check=True)
    return path


def label(path):
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=path, capture_output=True, text=True)
    return sha.stdout.strip()


def slowest_cells(executed, n=5):
    """[(seconds, lecture, cell index, first line)] of the slowest code cells papermill timed."""
    cells = []
    for path in sorted(glob.glob(os.path.join(executed, "*.ipynb"))):
        for i, cell in enumerate(json.load(open(path))["cells"]):
            seconds = cell.get("metadata", {}).get("papermill", {}).get("duration")
            if cell["cell_type"] == "code" and seconds is not None:
                first = "".join(cell["source"]).strip().splitlines()[0][:60] if cell["source"] else ""
                cells.append((seconds, os.path.basename(path)[:-6], i, first))
    return sorted(cells, reverse=True)[:n]


def html_run(path):
    """`make html` at full sizes in the clone at path: its line and whether it met its goals."""
    env_s, status, _ = timed(["make", "env"], path)
    assert status == 0, "make env failed"
    seconds, status, _ = timed(["make", "html"], path)
    slow = slowest_cells(os.path.join(path, "build", "executed"))
    cells_ok = bool(slow) and slow[0][0] <= CELL_GOAL_S
    lines = [f"{label(path)}: make html (full sizes): {'ok' if status == 0 else f'FAILED (exit {status})'}; "
             + verdict("html", seconds, status == 0, cells_ok) + f"; environment first: {env_s:.0f} s"]
    lines += [f"    {s:6.1f} s  {name} cell {i}: {first}" for s, name, i, first in slow]
    lines.append(f"    slowest cell {slow[0][0]:.1f} s: goal <= {CELL_GOAL_S} s -> {'met' if cells_ok else 'NOT met'}"
                 if slow else "    no executed cells found")
    return seconds, lines


def test_run(path):
    """`make test` in the clone at path: its line, the browser tests counted as run or skipped."""
    seconds, status, out = timed(["make", "test"], path)
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")
               and any(t in line for t in BROWSER_TESTS)]
    ran = all(re.search(rf"^{re.escape(t)} \.", out, re.M) for t in BROWSER_TESTS)
    browsers = ran and not skipped
    lines = [f"{label(path)}: make test in a fresh clone: {'passed' if status == 0 else f'FAILED (exit {status})'}; "
             + verdict("test", seconds, status == 0, browsers)
             + f"; browser tests {'run' if browsers else 'SKIPPED or missing (the verdict fails)'}"]
    lines += [f"    {s}" for s in skipped]
    return seconds, lines


def compare(run, revs):
    """`run` on a fresh clone of each commit, one after the other; every result, then HEAD's ratio."""
    results = []
    with tempfile.TemporaryDirectory(prefix="clone-") as tmp:
        for rev in revs:
            results.append(run(clone(rev, tmp)))
    print()
    for _, lines in results:
        print("\n".join(lines))
    if len(results) == 2:
        print(f"HEAD / {revs[0]}: {results[1][0] / results[0][0]:.2f} (the same machine, back to back)")


def series(only, full):
    rows, out = [], tempfile.mkdtemp(prefix="series-")
    for path in lectures(only):
        t0 = time.perf_counter()
        error = execute(path, os.path.join(out, path.name), smoke=not full)  # as `make html` does
        rows.append((path.stem, time.perf_counter() - t0, f"FAILED in {error}" if error else "ok"))
        print(f"{rows[-1][0]:28s} {rows[-1][1]:7.1f} s  {rows[-1][2]}", flush=True)
    total = sum(s for _, s, _ in rows)
    print(f"\n{'total':28s} {total:7.1f} s  (load average after: {os.getloadavg()[0]:.1f})")
    for s, name, i, first in slowest_cells(out):
        print(f"    {s:6.1f} s  {name} cell {i}: {first}")
    if not full and not only:
        print("the whole series headless, SMOKE: " + verdict("series", total))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="lecture prefixes, e.g. 00 05")
    ap.add_argument("--full", action="store_true", help="full parameters instead of SMOKE")
    ap.add_argument("--html", action="store_true", help="time `make html` (full sizes, site built) in a fresh clone")
    ap.add_argument("--test", action="store_true", help="time `make test` in a fresh clone of HEAD")
    ap.add_argument("--base", help="with --html or --test: run this commit first, then HEAD, back to back")
    a = ap.parse_args()
    print(machine.banner())
    print(f"load average before: {os.getloadavg()[0]:.1f}\n")
    revs = [a.base, "HEAD"] if a.base else ["HEAD"]
    if a.html:
        compare(html_run, revs)
    if a.test:                  # both flags: the site's run, then the tests'
        compare(test_run, revs)
    if not (a.html or a.test):
        series(a.only, a.full)


if __name__ == "__main__":
    main()
