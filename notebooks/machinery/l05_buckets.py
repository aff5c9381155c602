"""Lecture 05's pictures of bucketing: which gradients fill which bucket, and when each bucket
leaves during the backward. The same drawing serves an independent statement of the rule
(spec: walk the parameters in reverse order of registration, a bucket takes them until its size
reaches the cap, a bucket leaves once its last gradient is ready and every earlier bucket has
left; one dtype throughout) and a run of the lecture's DDP (record: a hook on every parameter,
registered before the DDP's own, notes each gradient as it becomes ready, and the DDP's
all-reduces are noted as they are launched), so the two can be held side by side. It also draws
section 5's step against the bucket cap (draw_caps) and its traced step (draw_step). It holds
none of the lecture's code.
"""
import itertools

import matplotlib.pyplot as plt
import torch.distributed as dist

from helpers import plots
from helpers.patching import patched


def spec(sizes, cap_bytes):
    """The rule's events for gradients of `sizes` bytes, in the order backward makes them ready
    (reverse registration): [("ready", i, bucket), ("launch", bucket)]."""
    bucket_of, size, j = [], 0, 0
    for i, n in enumerate(sizes):
        if i and size >= cap_bytes:           # the cap reached: a new bucket
            j, size = j + 1, 0
        bucket_of.append(j)
        size += n
    events = []
    for i, j in enumerate(bucket_of):
        events.append(("ready", i, j))
        if i == len(sizes) - 1 or bucket_of[i + 1] != j:
            events.append(("launch", j))       # its last gradient: it leaves
    return events


def record(rank, world_size, wrap, cfg, seed, data_seed):
    """A rank's events of one backward of tiny.model(**cfg, seed) under `wrap(model)` (the
    lecture's DDP) on tiny.batch(8, dim, data_seed), as spec gives them: the parameters numbered
    in reverse order of registration; a gradient's bucket and a launched buffer's bucket read from
    the DDP's own `buckets` and `flat`."""
    from helpers import tiny
    from helpers.spawn import device

    model = tiny.model(**cfg, seed=seed, device=device())       # nccl where each rank has a GPU
    x, y = tiny.batch(8, cfg["dim"], seed=data_seed, device=device())
    params = list(reversed(list(model.parameters())))
    index = {id(p): i for i, p in enumerate(params)}
    events = []
    for p in params:                          # before the DDP's hooks: noted as it is ready
        p.register_post_accumulate_grad_hook(lambda p: events.append(("ready", index[id(p)])))
    ddp = wrap(model)
    bucket = {index[id(p)]: j for j, b in enumerate(ddp.buckets) for p in b}
    buffer = {f.data_ptr(): j for j, f in enumerate(ddp.flat)}

    def launching(tensor, *args, **kwargs):
        events.append(("launch", buffer[tensor.data_ptr()]))
        return real["all_reduce"](tensor, *args, **kwargs)

    with patched(dist, all_reduce=launching) as real:
        tiny.loss(ddp(x), y).backward()
    ddp.finish_gradient_sync()
    return [e + (bucket[e[1]],) if e[0] == "ready" else e for e in events]


def _say(event):
    return (f"gradient {event[1]} ready, into bucket {event[2]}" if event[0] == "ready"
            else f"bucket {event[1]}'s all-reduce launched")


def assert_rule(recorded, rule):
    """Section 4's check: every rank's recorded events are the rule's, one by one; the first
    that is not is named, on the first rank where one differs."""
    for rank, events in enumerate(recorded):
        for k, (got, want) in enumerate(itertools.zip_longest(events, rule)):
            if got != want:
                raise AssertionError(f"rank {rank}, event {k}: " + (_say(got) if got else "nothing")
                                     + "; the rule says " + (_say(want) if want else "nothing"))


def draw(runs, sizes, cap_bytes, title=""):
    """One panel per list of events: a row per bucket (first to leave on top); each gradient a
    bar as wide as its bytes, laid out in the order backward makes them ready (reverse
    registration), in its bucket's row; a dashed line a cap past each bucket's start (a bucket
    closes at the gradient that reaches it); a triangle where a bucket's all-reduce is launched,
    at the gradient whose arrival launched it."""
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    fig, axes = plots.figure(ncols=len(runs), width=6 * len(runs), height=3.4)
    axes = axes if len(runs) > 1 else [axes]
    for ax, (label, events) in zip(axes, runs.items()):
        first, last = {}, None
        for e in events:
            if e[0] == "ready":
                last, j = e[1], e[2]
                first.setdefault(j, starts[e[1]])
                ax.barh(j, sizes[e[1]], left=starts[e[1]], height=0.6, edgecolor="white",
                        color=plots.COLORS[j % len(plots.COLORS)])
            else:
                ax.plot(starts[last] + sizes[last], e[1], ">", color="k", ms=7)
        for j, x0 in first.items():
            ax.plot([x0 + cap_bytes] * 2, [j - 0.4, j + 0.4], "k--", lw=1)
        ax.set(ylim=(len(first) - 0.5, -0.5), xlim=(0, sum(sizes) * 1.03), title=label,
               xlabel="gradient bytes, in the order backward makes them ready")
        ax.set_yticks(range(len(first)), [f"bucket {j}" for j in range(len(first))])
        ax.grid(False)
    axes[0].plot([], [], ">", color="k", label="all-reduce launched")
    axes[0].plot([], [], "k--", lw=1, label="the cap, from the bucket's start")
    axes[0].legend(fontsize=7, loc="lower left")
    if title:
        fig.suptitle(title)
    plt.show()


def draw_caps(caps_mb, summaries, model_s, naive_s, spread):
    """Section 5's step against the bucket cap: the median step of each cap with its spread
    (timing.summary's), the model's step, naive DDP's median; seconds in, ms drawn."""
    caps = [cap * 2**20 for cap in caps_mb]
    fig, ax = plots.figure(height=3)
    ax.errorbar(caps, [m["median"] * 1e3 for m in summaries], fmt="o", capsize=3,
                yerr=[[1e3 * abs(m["median"] - m[q]) for m in summaries] for q in ("p10", "p90")],
                label=f"on the H100 model ({spread})")
    ax.plot(caps, [t * 1e3 for t in model_s], "--", label="model")
    ax.axhline(naive_s * 1e3, color="grey", lw=1, label="naive DDP")
    plots.log2_size_axis(ax, caps)
    ax.set(xlabel="bucket cap (here)", ylabel="step here (ms)", title="Step and cap")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
    plt.show()


def draw_step(traced, title):
    """Section 5's step on every rank: compute and link rows (helpers.timeline), from
    l05_ddp.traced_step's returns."""
    from helpers import timeline

    fig, ax = plots.figure(height=2.8)
    timeline.draw(ax, [part for events, on_link, _ in traced for part in (events, on_link)])
    ax.set_yticks(range(2 * len(traced)), [f"rank {r} {row}" for r in range(len(traced))
                                           for row in ("compute", "link")])
    ax.set_title(title)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=5)
    plt.show()
