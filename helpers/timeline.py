"""A recorder of timeline events inside a rank, and the figure that draws every rank's events.

    from helpers import timeline
    rec = timeline.Recorder(device())             # inside a rank
    with rec.span("compute"):                     # start and end of the work inside
        y = layer(x)
    work = dist.all_reduce(g, async_op=True)
    rec.until("all-reduce", work)                 # from now until the collective itself is done
    work.wait()
    return rec.events()                           # [{"name", "start", "end"}], seconds

    timeline.draw(ax, [events of rank 0, events of rank 1, ...])   # in the notebook process

The stamps are helpers.timing.Clock's, right on both backends: on the CPU perf_counter (a call has
finished when it returns) and a callback on the work's future for `until`; on a GPU CUDA events on
the stream where the work runs (a host clock would read launches). events() reads them once, after
one synchronize. Times are seconds since `origin`: by default this rank's first stamp; on the CPU
`events(origin=t)` with one host time t shared by the ranks (taken after a barrier, say) puts every
rank on one axis (perf_counter reads the system's monotonic clock, the same in every process).
"""
import contextlib
import itertools
import time

from helpers.timing import Clock


class Recorder:
    """Named intervals of one rank's work (see the module's docstring)."""

    def __init__(self, device=None):
        self.clock, self.names, self._ids, self.marks = Clock(device), [], itertools.count(), set()
        self.host_origin = time.perf_counter() if not self.clock.cuda else None

    def _key(self, name):
        i = next(self._ids)
        self.names.append((i, name))
        return i

    @contextlib.contextmanager
    def span(self, name):
        """The work inside `with` is one event; its end is stamped when it has run."""
        i = self._key(name)
        self.clock.now(("start", i))
        yield
        self.clock.now(("end", i))

    def until(self, name, work):
        """An event from now until `work` (an async collective's handle) is done."""
        i = self._key(name)
        self.clock.now(("start", i))
        self.clock.done(("end", i), work)

    def mark(self, name):
        """An instant: an event that starts and ends now."""
        i = self._key(name)
        self.clock.now(("start", i))
        self.marks.add(i)

    def events(self, origin=None):
        """[{"name", "start", "end"}] in seconds since `origin` (a perf_counter time, CPU only) or since
        this rank's first stamp. Call it once every recorded work is done."""
        times = self.clock.read()                  # waits for the collectives' stamps
        if origin is not None and not self.clock.cuda:
            times = {k: v - origin for k, v in self.clock.stamps.items()}
        end = lambda i: times[("start", i)] if i in self.marks else times[("end", i)]  # noqa: E731
        return [{"name": name, "start": times[("start", i)], "end": end(i)} for i, name in self.names]


def draw(ax, by_rank, colors=None, label=True):
    """Every rank's events as bars on one row per rank (rank 0 on top); one colour per event name.
    `colors`: {name: colour}; the names not in it get the series' colours in order."""
    from helpers import plots

    names = list(dict.fromkeys(e["name"] for events in by_rank for e in events))
    palette = iter(plots.COLORS * (1 + len(names) // len(plots.COLORS)))
    colors = {**{n: next(palette) for n in names if n not in (colors or {})}, **(colors or {})}
    for rank, events in enumerate(by_rank):
        for e in events:
            ax.barh(rank, max(e["end"] - e["start"], 1e-9), left=e["start"], height=0.6,
                    color=colors[e["name"]], edgecolor="white", linewidth=0.5)
    if label:
        for n in names:
            ax.barh(0, 0, color=colors[n], label=n)
    ax.set_yticks(range(len(by_rank)), [f"rank {r}" for r in range(len(by_rank))])
    ax.set_ylim(len(by_rank) - 0.5, -0.5)
    ax.set_xlabel("seconds")
    return colors
