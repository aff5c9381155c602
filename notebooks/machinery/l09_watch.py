"""Watching ranks from outside, as `top` and `py-spy` do on a cluster (lecture 09).

    with watch_bench.Monitor(k, dump_at_s=1.0) as mon:     # in the notebook process
        spawn(mon.wrap(fn), k, args=(...))                  # fn unchanged; each rank announces its pid
    mon.samples    # [{"t", "rank", "cpu %", "memory (MB)"}], every `every` s (psutil)
    mon.dumps      # {rank: ("stack", ["function (file:line)", ...]) | ("returned", None)
                   #        | ("could not attach", reason)}: `py-spy dump` of every rank still
                   # running at dump_at_s, its main thread, innermost frame first
    where = watch_bench.stacks(mon, hang, k)   # after a SpawnTimeout `hang`: per rank, py-spy's
                                               # frames and the launcher's (faulthandler)

`wrap(fn)` is fn with one thing before it: the rank writes its pid into the monitor's folder, so
the thread here can ask the operating system (psutil) for that process's CPU time and resident
memory. CPU % is CPU time over wall time between two samples (100 = one core; a rank's threads
and gloo's can take it past 100). The progress is one line, redrawn in place in a notebook.
`py-spy dump --pid` reads a process's Python stacks from outside (no signal, no cooperation), as one
runs it on a hung rank of a real job; file names are cut to their last part and a notebook
cell's file is written "cell". It needs ptrace: where the kernel's Yama module allows it only on a
process's descendants (Ubuntu's ptrace_scope=1), each rank allows any tracer of its user
(prctl PR_SET_PTRACER_ANY, Linux only); where py-spy still cannot attach (macOS without sudo, a
container without CAP_SYS_PTRACE) or is missing, the dump says "could not attach" and why, and
`stacks` still has the launcher's faulthandler stacks, which need no ptrace.
"""
import ctypes
import ctypes.util
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import psutil

ANSI = re.compile(r"\x1b\[[0-9;]*m")
FRAME = re.compile(r"^\s+(\S+) \((.+):(\d+)\)$")   # py-spy's frame line: "    fn (file:line)"


PR_SET_PTRACER, PR_SET_PTRACER_ANY = 0x59616D61, ctypes.c_ulong(-1)   # linux/prctl.h


def allow_tracing():
    """Let any process of this user ptrace this one (Yama's ptrace_scope=1); Linux only, and
    harmless where there is no Yama or no prctl."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(ctypes.util.find_library("c") or None).prctl(
                PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0)
        except (OSError, AttributeError):
            pass


def _announced(rank, world_size, *args, fn, folder):
    allow_tracing()
    with open(os.path.join(folder, f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    return fn(rank, world_size, *args)


def py_spy():
    """The py-spy program of this environment (requirements.txt installs it), or None."""
    found = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    return found if os.path.exists(found) else None


def short_file(path):
    """A frame's file, as the page shows it: 'cell' for a notebook cell, else its last part."""
    return "cell" if "ipykernel_" in path else os.path.basename(path)


def dump(pid, program=None):
    """`py-spy dump --pid`: ("stack", the main thread's frames inside the wrapped function,
    innermost first, as "function (file:line)"); ("returned", None) when the rank is not inside
    it; ("could not attach", reason) when py-spy is missing or fails (no ptrace, a timeout)."""
    program = program or py_spy()
    if program is None:
        return "could not attach", "py-spy is not installed (pip install -r requirements.txt)"
    try:
        run = subprocess.run([program, "dump", "--full-filenames", "--pid", str(pid)],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as e:
        return "could not attach", type(e).__name__
    if run.returncode != 0:
        reason = ANSI.sub("", run.stderr or run.stdout).strip().splitlines() or ["no output"]
        return "could not attach", f"exit code {run.returncode}: {reason[0][:80]}"
    frames, main = [], False
    for line in ANSI.sub("", run.stdout).splitlines():  # colours, where a terminal is assumed
        if line.startswith("Thread "):
            main = '"MainThread"' in line
        elif main and (m := FRAME.match(line)):
            if m[1] == "_announced":            # below it: the launcher's frames
                return "stack", frames
            frames.append(f"{m[1]} ({short_file(m[2])}:{m[3]})")
    return "returned", None                     # not inside the wrapped function


def launcher_frames(frames):
    """helpers.stacks' frames of a rank (oldest first, from the wrapper on) -> the frames inside
    the wrapped function, innermost first, as "function (file:line)"; None if there were none."""
    if not frames:
        return None
    inside = [f for f in frames if f[2] != "_announced" or not f[0].endswith("l09_watch.py")]
    return [f"{name} ({short_file(file)}:{line})" for file, line, name, _ in inside[::-1]]


def shown(frames, n=3):
    """A stack as a table cell: its n innermost frames, or the reason there is none."""
    return " < ".join(frames[:n]) if isinstance(frames, list) else str(frames or "(none)")


def stacks(mon, hang, world_size):
    """Per rank, where it was during a hang: {"py-spy": frames or "(returned)" or "(could not
    attach: reason)", "faulthandler": frames or None (the launcher read none: the rank had
    ended), "frames": py-spy's where it attached, else faulthandler's, "source": which}."""
    out = {}
    for r in range(world_size):
        state, got = mon.dumps.get(r, ("returned", None))
        fault = launcher_frames(hang.stacks.get(r)) if r in hang.ranks else None
        spy = got if state == "stack" else f"({state}{': ' + got if got else ''})"
        use = "py-spy" if state != "could not attach" else "faulthandler"
        out[r] = {"py-spy": spy, "faulthandler": fault, "source": use,
                  "frames": got if use == "py-spy" else fault}
    return out


def short_paths(text):
    """A launcher's message with each 'File "/a/b/c.py"' cut to its last part (or "cell")."""
    return re.sub(r'File "([^"]+)"', lambda m: f'File "{short_file(m[1])}"', text)


class Monitor:
    def __init__(self, world_size, every=0.25, dump_at_s=None, label="watching", program=None):
        self.world_size, self.every, self.dump_at_s, self.label = world_size, every, dump_at_s, label
        self.program = program or py_spy()   # tests pass a program that fails, to check the fallback
        self.samples, self.dumps = [], {}
        self._folder = tempfile.mkdtemp(prefix="watch-")
        self._stop, self._procs = threading.Event(), {}

    def wrap(self, fn):
        return functools.partial(_announced, fn=fn, folder=self._folder)

    def __enter__(self):
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._t0 = time.monotonic()
        self._line = _Line()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        shutil.rmtree(self._folder, ignore_errors=True)

    def _proc(self, rank):
        if rank not in self._procs:
            with open(os.path.join(self._folder, f"rank{rank}.pid")) as f:
                self._procs[rank] = psutil.Process(int(f.read()))
            self._procs[rank].cpu_percent(None)         # the first reading only starts the clock
        return self._procs[rank]

    def _dump(self, proc):
        try:
            if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
                return "returned", None
        except psutil.Error:
            return "returned", None
        if self.program is None:
            return "could not attach", "py-spy is not installed (pip install -r requirements.txt)"
        return dump(proc.pid, self.program)

    def _watch(self):
        while not self._stop.wait(self.every):
            t, now = time.monotonic() - self._t0, []
            for rank in range(self.world_size):
                try:
                    proc = self._proc(rank)
                    if proc.status() == psutil.STATUS_ZOMBIE:
                        continue                         # ended, not yet reaped
                    now.append({"t": t, "rank": rank, "cpu %": proc.cpu_percent(None),
                                "memory (MB)": proc.memory_info().rss / 1e6})
                except (FileNotFoundError, ValueError, psutil.Error):
                    continue                             # not started yet, or already gone
            self.samples += now
            if self.dump_at_s is not None and t >= self.dump_at_s and not self.dumps:
                self.dumps = {r: self._dump(p) for r, p in self._procs.items()}
            self._line.show(f"{self.label}: {t:.1f} s | " + " | ".join(
                f"rank {s['rank']}: {s['cpu %']:.0f}% CPU, {s['memory (MB)']:.0f} MB" for s in now))


class _Line:
    """One line of text, redrawn in place in a notebook (nothing outside one)."""

    def __init__(self):
        try:
            from IPython import get_ipython
            from IPython.display import Pretty, display
        except ImportError:
            self.handle = None
            return
        kernel = get_ipython() is not None and getattr(get_ipython(), "kernel", None) is not None
        self.pretty = Pretty
        self.handle = display(Pretty(""), display_id=True) if kernel else None

    def show(self, text):
        if self.handle is not None:
            self.handle.update(self.pretty(text))
