"""Lecture 00's machinery: what the operating system and the driver say about the caches and GPUs,
which copies count as DRAM copies, rates with their spread, the runs kept in data/, and the
lecture's figures. The teaching code (the copies, the ping-pong) stays in the notebook; this module
only reads the machine, summarises and draws.

    from helpers import hardware
    hardware.cache_levels()          # [("L1d", 32768, "0"), ("L2", 1048576, "0"), ...]
    hardware.draw_node(PEAK)         # section 2's HGX H100 node, lines as thick as their bandwidth
"""
import glob
import math
import os
import platform
import shutil
import statistics
import subprocess

# The published figures the node drawing names (keys of the lecture's table, GB/s).
NODE_LINKS = ("DDR5-4800, 12-channel socket", "PCIe 5.0 x16", "NVLink 4, one H100", "NDR, one port")
# Section 7's copies and the bytes each moves per byte copied: H2D counts the n bytes crossing
# PCIe (n/t, per direction), D2D the bytes read and written on the GPU's memory bus (2n/t).
GPU_COPIES = {"pageable H2D": 1, "pinned H2D": 1, "D2D": 2}
GPU_COUNTED = {"pageable H2D": "n/t", "pinned H2D": "n/t", "D2D": "2n/t"}
# GPUs of the kept runs by torch's name: (the lecture's key of their HBM's published peak, L2 bytes).
# "NVIDIA H100 80GB HBM3" is the SXM part; both have a 50 MB L2 (NVIDIA's H100 whitepaper).
KNOWN_GPUS = {"H100 80GB HBM3": ("HBM3, H100 SXM", 50e6), "H200": ("HBM3e, H200", 50e6)}


def powers_of_two(low, high, step=1):
    """low, low * 2**step, ... (low a power of two) up to the first power of two >= high."""
    return [2**e for e in range(int(math.log2(low)), math.ceil(math.log2(high)) + 1, step)]


def _size(text):
    """'32K' -> 32768, '1024K' -> 1048576, '32768 KB' -> 33554432 (as /sys writes cache sizes)."""
    text = text.strip().upper().removesuffix("B").strip()
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * scale)


def cache_levels():
    """[(name, bytes, CPUs sharing it)] for the data caches of CPU 0, smallest first; [] where the
    operating system does not tell (Linux: /sys/devices/system/cpu; macOS: sysctl). The CPUs are
    a list as Linux writes it ("0-1": CPUs 0 and 1)."""
    levels = []
    for d in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        def read(name, d=d):
            with open(os.path.join(d, name)) as f:
                return f.read().strip()
        try:
            kind, level, size, shared = read("type"), read("level"), _size(read("size")), \
                read("shared_cpu_list")
        except (OSError, ValueError):
            continue
        if kind != "Instruction":
            levels.append((f"L{level}" + ("d" if kind == "Data" else ""), size, shared))
    if not levels and platform.system() == "Darwin":
        for name, key in (("L1d", "hw.l1dcachesize"), ("L2", "hw.l2cachesize"), ("L3", "hw.l3cachesize")):
            try:
                out = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True,
                                     timeout=5).stdout.strip()
            except (OSError, subprocess.SubprocessError):
                out = ""
            if out.isdigit() and int(out) > 0:
                levels.append((name, int(out), "?"))
    return sorted(levels, key=lambda level: level[1])


def gpu_topology():
    """`nvidia-smi topo -m` as text, or None where there is no nvidia-smi (no NVIDIA GPU)."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return str(e).splitlines()[0]
    return (out.stdout or out.stderr).rstrip()


def hbm_peak_gbps(props):
    """The GPU memory's peak from the driver's figures (torch.cuda.get_device_properties): 2 transfers
    per memory clock x the bus width in bytes, in GB/s (H100 SXM: 2 x 2.619 GHz x 640 B = 3,352);
    None where the driver does not give them."""
    clock_khz = getattr(props, "memory_clock_rate", 0) or 0
    bus_bits = getattr(props, "memory_bus_width", 0) or 0
    if clock_khz <= 0 or bus_bits <= 0:
        return None
    return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9


def gpu_levels(props):
    """[(level, bytes)] of a GPU's own memory, as the driver reports them."""
    return [("GPU shared memory, one SM", getattr(props, "shared_memory_per_multiprocessor", 0)),
            ("GPU L2", getattr(props, "L2_cache_size", 0)), ("GPU memory", props.total_memory)]


def dram_rate(sizes, gbps, caches, beyond=4):
    """The DRAM copy rate of a sweep: the median rate over the copies whose working set (2S) is at
    least `beyond` times the largest cache; the largest copy's rate where none is (or the caches
    are unknown). Returns (GB/s, the copy sizes S it is the median of)."""
    largest = max((size for _, size, _ in caches), default=0)
    picked = [(s, g) for s, g in zip(sizes, gbps) if largest and 2 * s >= beyond * largest]
    picked = picked or [(sizes[-1], gbps[-1])]
    return statistics.median(g for _, g in picked), [s for s, _ in picked]


# ------------------------------------------------------------------------- rates and spreads

def rate(moved, samples):
    """(median, low, high) in GB/s of `moved` bytes per sample of seconds: the rate of the median
    time, and of timing.summary's p90 and p10 times (the slowest and fastest below 10 samples;
    timing.spread_label names them)."""
    from helpers.timing import summary

    s = summary(samples)
    return moved / s["median"] / 1e9, moved / s["p90"] / 1e9, moved / s["p10"] / 1e9


def rate_text(median, low=None, high=None):
    """'54.8 (53.9-55.1)', or '54.8' where there is no spread (one kept median)."""
    if low is None:
        return f"{median:.1f}"
    return f"{median:.1f} ({low:.1f}-{high:.1f})"


def gpu_rates(rows):
    """Section 7's rows of samples ({"n", copy: [seconds per copy]}) or of kept medians ({"n",
    copy: GB/s}) as {"n", copy: (median, low, high) GB/s}; low and high are None for a median."""
    out = []
    for r in rows:
        row = {"n": r["n"]}
        for copy, factor in GPU_COPIES.items():
            v = r[copy]
            row[copy] = rate(factor * r["n"], v) if isinstance(v, list) else (v, None, None)
        out.append(row)
    return out


# ------------------------------------------------------------------------- runs kept in data/

def kept_run(run, peak):
    """A run of data/ (helpers.archive) as sections 6 and 7 draw it. Two formats: the current one
    (SAVE_TO of this lecture: samples, caches, the GPU's limits) and the one an earlier version of
    the lecture wrote (key "pingpong"; medians only, caches not kept, each GPU copy timed alone
    between two events). `peak`: the lecture's published figures, for a known GPU's HBM.
    Returns {"label", "host_gbps" (that host's one-core DRAM copy, hardware.dram_rate over its
    own sweep), "link": [(n, one-way s)], "link_backend", "gpu": None or {"label", "rows" (as
    gpu_rates), "host_gbps", "hbm", "l2"}}."""
    from helpers import archive

    m = run["measurements"]
    earlier = "pingpong" in m
    label = f"kept: {archive.label(run)}" + ", earlier version of this lecture" * earlier
    sizes = [c["n"] for c in m["cpu_copy"]]
    if earlier:
        gbps = [c["GB/s"] for c in m["cpu_copy"]]
        link = [(p["n"], p["one_way_s"]) for p in m["pingpong"]]
    else:
        gbps = [2 * c["n"] / statistics.median(c["samples_s"]) / 1e9 for c in m["cpu_copy"]]
        link = [(p["n"], statistics.median(p["round_trips_s"]) / 2) for p in m["link"]]
    host, _ = dram_rate(sizes, gbps, m.get("caches") or [])
    out = {"label": label, "host_gbps": host, "link": link,
           "link_backend": m.get("link_backend", m.get("pingpong_backend")), "gpu": None}
    if m.get("gpu_copies"):
        limits = m.get("gpu_limits") or {}
        name = " ".join(g["name"] for g in run["machine"]["gpus"])
        known = [v for k, v in KNOWN_GPUS.items() if k in name]
        hbm = limits.get("hbm_gbps") or (peak[known[0][0]] if known else None)
        l2 = limits.get("l2_bytes") or (known[0][1] if known else None)
        out["gpu"] = {"label": label, "rows": gpu_rates(m["gpu_copies"]), "host_gbps": host,
                      "hbm": hbm, "l2": l2}
    return out


# ------------------------------------------------------------------------------------- figures

def draw_node(peak):
    """Section 2's picture: an HGX H100 node, two sockets, 4 of its 8 GPUs and NICs, every line as
    thick as the log of its published bandwidth (`peak`: the lecture's {name: GB/s}, NODE_LINKS
    among them), and GPUDirect RDMA between NIC 0 and GPU 0 through their PCIe switch."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    from helpers import plots

    ddr, pcie, nvlink, ndr = (peak[k] for k in NODE_LINKS)
    fig, ax = plots.figure(width=11.5, height=7.2)
    ax.set_xlim(0, 11.5)
    ax.set_ylim(0, 7.2)
    ax.axis("off")

    def box(x, y, w, h, text, color):
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", fc=color, ec="black",
                                    lw=0.8, zorder=2))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=7.5, zorder=3)

    def width(gbps):
        return 1 + 1.5 * math.log10(max(gbps, 1))

    def link(a, b, gbps, ls="-"):
        ax.plot([a[0], b[0]], [a[1], b[1]], color=plots.REFERENCE, lw=width(gbps), ls=ls,
                solid_capstyle="butt", zorder=1)

    def note(x, y, text, fontsize=7, **kw):
        ax.text(x, y, text, fontsize=fontsize, va="center", **kw)

    ax.add_patch(FancyBboxPatch((0.1, 1.2), 11.3, 5.9, boxstyle="round,pad=0.02", fc="none",
                                ec="gray", ls="--"))
    note(0.2, 6.95, "one node (HGX H100): 2 sockets, 8 GPUs, 8 NICs; 4 GPUs and 4 NICs drawn",
         color="gray", fontsize=8)
    note(0.2, 6.45, f"DDR5, 12 channels: {ddr:.4g} GB/s per socket (bus total)")
    note(5.75, 6.05, "socket link", ha="center")
    link((3.25, 5.82), (8.25, 5.82), 10)
    box(2.4, 1.5, 6.7, 0.4, f"NVSwitch fabric: every GPU one hop from every other; NVLink 4, "
        f"{nvlink:.0f} GB/s per GPU each way", "#efe3f6")
    box(0.3, 0.15, 10.9, 0.6, f"network switches (one rail per NIC number), to the other nodes: "
        f"InfiniBand NDR or 400 GbE, {ndr:.0f} GB/s per port each way", "#fde2cf")
    for s in range(2):
        def x(u):                          # socket 1 is socket 0 mirrored about the middle
            return u if s == 0 else 11.5 - u

        def at(u, w):                      # the left edge of a box of width w centred at x(u)
            return x(u) - w / 2

        box(at(0.8, 1.2), 5.55, 1.2, 0.55, f"DRAM {s}", "#e8f3e0")
        box(at(2.55, 1.4), 5.45, 1.4, 0.75, f"CPU {s}\nL1, L2 per core\nL3 shared", "#dbe9f6")
        link((x(1.4), 5.82), (x(1.85), 5.82), ddr)
        box(at(2.55, 1.5), 4.2, 1.5, 0.5, f"PCIe switch {s}", "#f3f3f3")
        link((x(2.55), 5.45), (x(2.55), 4.7), pcie)
        near, far = (2 * s, 2 * s + 1) if s == 0 else (2 * s + 1, 2 * s)  # NIC g beside GPU g
        hbm = f"HBM3 {peak['HBM3, H100 SXM']:.0f}\nGB/s (bus total)"
        devices = [(0.75, f"NIC {far}", 0.8), (1.85, f"NIC {near}", 0.8),
                   (3.05, f"GPU {near}\n{hbm}", 1.05), (4.35, f"GPU {far}\n{hbm}", 1.05)]
        for u, text, w in devices:
            nic = text.startswith("NIC")
            top = 3.35 if nic else 3.45
            box(at(u, w), 2.85 if nic else 2.45, w, 0.5 if nic else 1.0, text,
                "#fde2cf" if nic else "#fbe3e8")
            link((x(2.55), 4.2), (x(u), top), pcie)
            if nic:                        # down the outside of the fabric to the network
                link((x(u), 2.85), (x(u), 0.75), ndr, ls=(0, (4, 2)))
            else:
                link((x(u), 2.45), (x(u), 1.9), nvlink)
    note(2.65, 5.05, f"PCIe 5.0 x16: {pcie:.0f} GB/s each way")
    for a, b in (((2.53, 4.1), (1.95, 3.38)), ((2.57, 4.1), (2.97, 3.48))):   # NIC 0 <-> GPU 0
        ax.annotate("", xy=b, xytext=a, zorder=4,
                    arrowprops=dict(arrowstyle="-|>", color="tab:red", lw=1.6, shrinkA=0,
                                    shrinkB=0))
    note(0.2, 4.75, "GPUDirect RDMA (red):\nNIC 0 reads and\nwrites GPU 0's\nmemory through\n"
         "PCIe switch 0", color="tab:red")
    ax.set_title("Where the bytes go: published peaks (links each way, memory as bus totals)")
    plt.show()


def plot_copy_sweep(sizes, samples, caches, peak, dram_gbps):
    """The key figure of lecture 00: one core's copy rate 2S/t against the working set 2S (median
    and spread of the samples), the rate a copy would show if it took only the fastest call's time
    (the fixed cost's bound), this machine's cache sizes, its DRAM rate and the published DRAM
    peaks (bus totals)."""
    import matplotlib.pyplot as plt

    from helpers import plots
    from helpers.timing import spread_label

    ws = [2 * s for s in sizes]
    rates = [rate(2 * s, x) for s, x in zip(sizes, samples)]
    floor = min(statistics.median(x) for x in samples)
    fig, ax = plots.figure(width=11, height=4.6)
    ax.plot(ws, [r[0] for r in rates], "o-", color=plots.MEASURED, label="measured, one core")
    ax.fill_between(ws, [r[1] for r in rates], [r[2] for r in rates], color=plots.MEASURED,
                    alpha=0.2, label=f"{spread_label(len(samples[0]))} of the samples")
    ax.plot(ws, [w / floor / 1e9 for w in ws], ":", color=plots.MODEL,
            label=f"2S / {floor * 1e6:.2f} us (the fastest copy's time): the fixed cost's bound")
    for (name, size, _), color in zip(caches, plots.COLORS[2:]):
        ax.axvline(size, color=color, ls="--", lw=1, label=f"{name} = {plots.bytes_label(size)} (here)")
    ax.axhline(dram_gbps, color=plots.MODEL, ls="-.", label=f"DRAM copy here: {dram_gbps:.1f} GB/s")
    for what, ls in (("DDR4-3200, one channel", ":"), ("DDR5-4800, one channel", "-."),
                     ("DDR5-4800, 12-channel socket", "--")):
        ax.axhline(peak[what], color=plots.REFERENCE, ls=ls,
                   label=f"{what}: {peak[what]:.1f} GB/s (published bus total)")
    ax.set_yscale("log")
    ax.set_ylim(top=2 * max(peak["DDR5-4800, 12-channel socket"], max(r[2] for r in rates)))
    ax.set_ylabel("GB/s, bytes read + written (2S/t)")
    plots.log2_size_axis(ax, ws)
    ax.set_xlabel("working set 2S (source + destination)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_title("Copy on one core against this machine's caches and published DRAM peaks")
    fig.tight_layout()
    plt.show()


def plot_link(rows, fit, peak, links, bound_gbps=None, kept=()):
    """Section 6's figure from measure_link's rows: the one-way bandwidth n/t of the ping-pong
    (median of the rounds, and their spread), the fitted t = alpha + n/B, the published
    per-direction peaks of `links`, (gloo) the bound of the lecture's claim, and the kept runs'
    ping-pongs (`kept`: [(label, [(n, one-way s)])], medians only)."""
    import matplotlib.pyplot as plt

    from helpers import plots
    from helpers.timing import spread_label

    sizes = [r["size"] for r in rows]
    gbps = {k: [2e-3 * r["size"] / r[k] for r in rows] for k in ("time_us", "p10_us", "p90_us")}
    fig, ax = plots.figure(width=11, height=4.6)
    ax.plot(sizes, gbps["time_us"], "o-", color=plots.MEASURED, label="measured here: n / one-way time")
    ax.fill_between(sizes, gbps["p90_us"], gbps["p10_us"], color=plots.MEASURED, alpha=0.2,
                    label=f"{spread_label(len(rows[0]['times_us']))} of the rounds")
    ax.plot(sizes, [n / fit.predict(n) / 1e9 for n in sizes], "--", color=plots.MODEL,
            label=f"fit: alpha = {fit.alpha * 1e6:.0f} us, B = {fit.bandwidth / 1e9:.2f} GB/s")
    for (label, points), color in zip(kept, plots.COLORS[4:]):
        ax.plot([n for n, _ in points], [n / t / 1e9 for n, t in points], "s--", color=color,
                ms=4, label=f"{label} (median only)")
    if bound_gbps is not None:
        ax.axhline(bound_gbps, color=plots.COLORS[2], lw=2,
                   label=f"one-core DRAM copy here, C (the claim's bound): {bound_gbps:.1f} GB/s")
    for what, ls in zip(links, ("-", "--", "-.", ":", (0, (5, 1)), (0, (1, 3)))):
        ax.axhline(peak[what], color=plots.REFERENCE, ls=ls, lw=1,
                   label=f"{what}: {peak[what]:.4g} GB/s (published)")
    ax.set_yscale("log")
    plots.log2_size_axis(ax, sizes[::2] if len(sizes) > 10 else sizes)
    ax.set_xlabel("message size n")
    ax.set_ylabel("GB/s, one way")
    ax.set_title("Two ranks of one host, against published link peaks (per direction)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    plt.show()


def plot_gpu_copies(runs, peak):
    """Section 7's figure, one row per run (dicts as kept_run's "gpu"): host to device (pageable,
    pinned) beside the PCIe peaks and that run's own host DRAM copy; device to device beside the
    GPU's HBM peak and its L2. Each copy with its spread where the run has one, and the rate it
    would show if it took as long as its smallest copy (the launch floor's bound)."""
    import textwrap

    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter, NullFormatter

    from helpers import plots

    fig, axes = plots.figure(ncols=2, nrows=len(runs), width=13, height=6.2 * len(runs),
                             squeeze=False)
    for run, (ax_h, ax_d) in zip(runs, axes):
        rows = run["rows"]
        ns = [r["n"] for r in rows]
        tops = {ax_h: [peak["PCIe 5.0 x16"]], ax_d: [run["hbm"] or 0]}
        for copy, color in (("pageable H2D", plots.COLORS[0]), ("pinned H2D", plots.COLORS[1]),
                            ("D2D", plots.COLORS[0])):
            ax = ax_d if copy == "D2D" else ax_h
            ax.plot(ns, [r[copy][0] for r in rows], "o-", color=color, label=copy)
            if rows[0][copy][1] is not None:
                ax.fill_between(ns, [r[copy][1] for r in rows], [r[copy][2] for r in rows],
                                color=color, alpha=0.2)
            t0 = GPU_COPIES[copy] * ns[0] / (rows[0][copy][0] * 1e9)
            ax.plot(ns, [GPU_COPIES[copy] * n / t0 / 1e9 for n in ns], ":", color=color, lw=1,
                    label=f"{copy} at {t0 * 1e6:.1f} us per copy (its smallest): the floor")
            tops[ax].append(max(max(v for v in r[copy] if v is not None) for r in rows))
        ax_h.axhline(run["host_gbps"], color=plots.COLORS[2], ls="-.",
                     label=f"that host's one-core DRAM copy C: {run['host_gbps']:.1f} GB/s")
        for what, ls in (("PCIe 4.0 x16", ":"), ("PCIe 5.0 x16", "--")):
            ax_h.axhline(peak[what], color=plots.REFERENCE, ls=ls,
                         label=f"{what}: {peak[what]:.1f} GB/s each way (published)")
        if run["hbm"]:
            ax_d.axhline(run["hbm"], color=plots.REFERENCE, ls="--",
                         label=f"its HBM: {run['hbm']:.0f} GB/s (bus total)")
        if run["l2"]:
            ax_d.axvline(run["l2"] / 2, color=plots.COLORS[3], ls="--", lw=1,
                         label=f"working set 2n = its L2 ({run['l2'] / 1e6:.0f} MB)")
        for ax in (ax_h, ax_d):
            ax.set_yscale("log")
            low = 0.5 * min(r[c][0] for r in rows for c in GPU_COPIES)
            high = 4 * max(tops[ax])
            ax.set_ylim(low, high)
            ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
            ax.yaxis.set_minor_formatter(FormatStrFormatter("%g") if high < 100 * low
                                         else NullFormatter())
            plots.log2_size_axis(ax, ns)
            ax.set_xlabel("bytes copied n")
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2)
        ax_h.set_ylabel("GB/s (n / t)")
        ax_d.set_ylabel("GB/s (2n / t, read + written)")
        label = textwrap.fill(run["label"], 75)
        ax_h.set_title(f"host to device\n{label}", fontsize=9)
        ax_d.set_title(f"device to device\n{label}", fontsize=9)
    fig.tight_layout()
    plt.show()
