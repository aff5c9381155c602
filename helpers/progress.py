"""A progress line that is right while it runs and in the saved notebook.

    with Progress(total=12, desc="sweep", units="launches") as bar:
        for job in jobs:
            bar.update(note="all_reduce on 2 ranks")

In a notebook it is one line of text, updated in place (a display with an id: JupyterLab redraws it,
and papermill and the site keep its last state, "sweep: 12/12 launches in 41.2 s"), never a widget
whose saved state is whatever it was when the notebook was written. In a terminal it is tqdm's bar
on stderr.
"""
import sys
import time


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
