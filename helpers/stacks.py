"""Where a rank is: its Python frames, as `helpers.spawn` shows them in a traceback or after a hang.

A rank calls `listen(path)` before it runs fn: from then on faulthandler writes the stacks of all
its threads into `path` whenever SIGUSR1 arrives. Its handler is C code, so it writes them even while
the thread that runs fn is blocked inside gloo or NCCL (waiting in a collective that a peer skipped),
where no Python code of the rank could run. All threads, because the signal lands on any one of them
(gloo's, the launcher's), and only the one it lands on would be written otherwise.

When a launch times out, the notebook process calls `capture` for the ranks still running: it sends
the signal and reads faulthandler's text back ('File "x", line N in f', most recent call first),
keeping the thread that ran fn and only the frames above the launcher's own. `describe` writes them
in Python's order with their source lines, read in the notebook process from linecache: that is
where IPython keeps the notebook's cells (a function defined in a cell has a file like
/tmp/ipykernel_123/456.py that exists nowhere else).
"""
import faulthandler
import linecache
import os
import re
import signal
import sysconfig
import time

SIGNAL = signal.SIGUSR1
WAIT_S = 1.0  # how long the notebook process waits for the ranks' stacks, at most
LIBRARY_FRAMES_SHOWN = 3  # a longer run of frames in Python's or installed packages' files is cut
FRAME = re.compile(r'\s*File "(.*)", line (\d+|\?\?\?) in (.*)')  # faulthandler's frame line
LIBRARIES = tuple({sysconfig.get_paths()[k] + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")})
HERE = os.path.dirname(os.path.abspath(__file__))


def listen(path):
    """In a rank: on SIGUSR1, write the stacks of all threads into a new file `path`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # open until the rank exits
    faulthandler.register(SIGNAL, file=fd, all_threads=True)


def capture(ranks, wait_s=WAIT_S):
    """Ask every rank in {rank: (pid, path)} for its stack; wait until each is written (at most
    wait_s). Returns {rank: frames of the thread that ran fn, oldest first} (see `fn_frames`), None
    for a rank that could not be asked (it had ended) or did not answer with fn on its stack."""
    asked = {}
    for rank, (pid, path) in ranks.items():
        try:
            os.kill(pid, SIGNAL)
            asked[rank] = path
        except ProcessLookupError:
            pass
    found = {}
    deadline = time.monotonic() + wait_s
    while len(found) < len(asked) and time.monotonic() < deadline:
        time.sleep(0.01)
        for rank in asked.keys() - found.keys():
            frames = fn_frames(_read(asked[rank]))
            if frames is not None:
                found[rank] = frames
    return {rank: found.get(rank) for rank in ranks}


def fn_frames(text):
    """From faulthandler's text: the frames (file, line, function, None) of the thread that ran fn,
    oldest first, from fn on (those above `_run` of helpers/_worker.py, which called it). None when
    no thread was inside `_run`."""
    for thread in _threads(text):
        frames = thread[::-1]  # faulthandler writes the most recent call first
        calls = [i for i, (file, _, name, _) in enumerate(frames) if name == "_run" and _is_launcher(file)]
        if calls:
            return frames[calls[-1] + 1:]
    return None


def describe(rank, frames):
    """What a student reads about a rank that hung: where it was, most recent call last."""
    if frames is None:
        return f"Rank {rank}: its stack could not be read (it had ended, or was no longer in fn)."
    return (f"Rank {rank} was waiting in (most recent call last):\n"
            + format_frames(frames, LIBRARY_FRAMES_SHOWN))


def format_frames(frames, library_shown=None):
    """Frames (file, line, function, source line or None), oldest first -> the lines of a Python
    traceback, without the launcher's own frames. A missing source line is read from linecache (a
    notebook cell's are there). With library_shown, of a run of consecutive frames in Python's or an
    installed package's files only the last `library_shown` are written, after a line that counts
    the others."""
    frames = [f for f in frames if not _is_launcher(f[0])]
    lines, left_out = [], 0
    for i, (file, lineno, name, source) in enumerate(frames):
        if library_shown is not None and _library_run(frames[i:]) > library_shown:
            left_out += 1
            continue
        if left_out:
            lines.append(f"  ... (library frames not shown: {left_out})")
            left_out = 0
        source = source or linecache.getline(file, lineno).strip()
        lines.append(f'  File "{file}", line {lineno}, in {name}' + (f"\n    {source}" if source else ""))
    return "\n".join(lines)


def _threads(text):
    """faulthandler's text -> per thread, its frames (file, line, function, None) as written."""
    threads = []
    for line in text.splitlines():
        match = FRAME.fullmatch(line)
        if line.endswith("(most recent call first):"):  # "Thread 0x... (most recent call first):"
            threads.append([])
        elif match and threads:
            lineno = int(match[2]) if match[2].isdigit() else 0
            threads[-1].append((match[1], lineno, match[3], None))
    return threads


def _library_run(frames):
    """How many of `frames`, from the first on, are in Python's or an installed package's files."""
    n = 0
    while n < len(frames) and frames[n][0].startswith(LIBRARIES):
        n += 1
    return n


def _is_launcher(file):
    return os.path.dirname(os.path.abspath(file)) == HERE and file.endswith("_worker.py")


def _read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""
