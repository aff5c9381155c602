"""Lecture 00's figures, drawn from what notebooks/machinery/l00_hardware.py reads and summarises.

    from machinery import l00_hardware_figures as hardware_figures
    hardware_figures.draw_node(PEAK)   # section 2's HGX H100 node, lines as thick as their bandwidth
"""
import math
import statistics

from machinery.l00_hardware import GPU_COPIES, NODE_LINKS, rate


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
    fig, ax = plots.figure(width=11, height=6.4)
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
    ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=2)
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
    fig, ax = plots.figure(width=11, height=6.4)
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
    ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=2)
    fig.tight_layout()
    plt.show()


def plot_gpu_copies(runs, peak):
    """Section 7's figure, one row per run (dicts as kept_run's "gpu"): host to device (pageable,
    pinned) beside the PCIe peaks and what one core of that run's host stages (C/2, as n/t);
    device to device beside the GPU's HBM peak and its L2. Each copy with its spread where the
    run has one, and the rate it would show if it took as long as its smallest copy (the launch
    floor's bound)."""
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
        ax_h.axhline(run["host_gbps"] / 2, color=plots.COLORS[2], ls="-.",
                     label=f"C/2 = {run['host_gbps'] / 2:.1f} GB/s: if one host core staged it")
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
            ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncols=2)
        ax_h.set_ylabel("GB/s (n / t)")
        ax_d.set_ylabel("GB/s (2n / t, read + written)")
        label = textwrap.fill(run["label"], 75)
        ax_h.set_title(f"host to device\n{label}", fontsize=9)
        ax_d.set_title(f"device to device\n{label}", fontsize=9)
    fig.tight_layout()
    plt.show()
