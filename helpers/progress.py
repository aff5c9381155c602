"""A progress line that is right while it runs and in the saved notebook.

    with Progress(total=12, desc="sweep", units="launches") as bar:
        for job in jobs:
            bar.update(note="all_reduce on 2 ranks")

In a notebook it is one line of text, updated in place (a display with an id: JupyterLab redraws it,
and papermill and the site keep its last state, "sweep: 12/12 launches in 41.2 s"), never a widget
whose saved state is whatever it was when the notebook was written. In a terminal it is tqdm's bar
on stderr.

    watch_cells()     # once per kernel (helpers.spawn.warm_up calls it)

A cell that runs longer than a few seconds then shows one line while it runs, updated in place
("this cell: 12 s so far, 3 launches of ranks"), and keeps its last state ("this cell took 41.2 s, 9
launches of ranks"), unless it shows a Progress line of its own. A reader who waits sees that the
cell works; the saved notebook says how long it took here.
"""
import contextvars
import sys
import threading
import time

CELL = {"start": None, "launches": 0, "own": False}   # the running cell, as watch_cells sees it


def _in_a_kernel():
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


class Progress:
    def __init__(self, total, desc="", units="steps"):
        self.total, self.desc, self.units, self.done, self.t0 = total, desc, units, 0, time.perf_counter()
        self.handle = self.bar = None
        CELL["own"] = True                      # the cell has its own line: watch_cells stays quiet
        if _in_a_kernel():
            from IPython.display import display

            self.handle = display(self._line(), display_id=True)
        else:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit=units, file=sys.stderr)

    def _line(self, note=""):
        from IPython.display import Pretty

        text = f"{self.desc}: {self.done}/{self.total} {self.units} in {time.perf_counter() - self.t0:.1f} s"
        return Pretty(text + (f" ({note})" if note else ""))

    def update(self, n=1, note=""):
        self.done += n
        if self.handle is not None:
            self.handle.update(self._line(note))
        elif self.bar is not None:
            self.bar.set_postfix_str(note, refresh=False)
            self.bar.update(n)

    def close(self):
        if self.handle is not None:
            self.handle.update(self._line())
        elif self.bar is not None:
            self.bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def launched():
    """helpers.spawn calls this after each launch: the count the running cell's line shows."""
    CELL["launches"] += 1


def _cell_line(final):
    seconds, n = time.perf_counter() - CELL["start"], CELL["launches"]
    launches = f", {n} launch{'es' if n != 1 else ''} of ranks" if n else ""
    return f"this cell took {seconds:.1f} s{launches}" if final else \
        f"this cell: {seconds:.0f} s so far{launches}"


def watch_cells(after=5.0, every=1.0):
    """In a kernel (once; later calls do nothing): every cell that runs longer than `after` seconds
    shows one line, updated every `every` seconds from a thread while the cell runs (the kernel's
    thread is busy in the cell) and left at its final state. Outside a kernel it does nothing."""
    if not _in_a_kernel() or CELL.get("watching"):
        return
    from IPython import get_ipython
    from IPython.display import Pretty, display

    CELL["watching"] = True
    state = {"stop": threading.Event(), "thread": None, "handle": None}

    def show(final=False):
        if CELL["own"]:
            return
        if state["handle"] is None:
            state["handle"] = display(Pretty(_cell_line(final)), display_id=True)
        else:
            state["handle"].update(Pretty(_cell_line(final)))

    def watch():
        if state["stop"].wait(after):
            return
        while True:
            show()
            if state["stop"].wait(every):
                return

    def pre_run_cell(*_):
        CELL.update(start=time.perf_counter(), launches=0, own=False)
        state.update(stop=threading.Event(), handle=None)
        # the thread writes into this cell: it runs in this cell's context (the kernel keeps the
        # cell an output belongs to in it)
        state["thread"] = threading.Thread(target=contextvars.copy_context().run, args=(watch,), daemon=True)
        state["thread"].start()

    def post_run_cell(*_):
        if state["thread"] is None:             # installed by this very cell: nothing to close
            return
        state["stop"].set()
        state["thread"].join()
        if state["handle"] is not None:
            show(final=True)

    shell = get_ipython()
    shell.events.register("pre_run_cell", pre_run_cell)
    shell.events.register("post_run_cell", post_run_cell)
