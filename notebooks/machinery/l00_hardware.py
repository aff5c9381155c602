"""Lecture 00's machinery: what the operating system and the driver say about the caches and GPUs,
which copies count as DRAM copies, rates with their spread, the runs kept in data/, and the
lecture's figures (those in notebooks/machinery/l00_hardware_figures.py). The teaching code (the copies, the
ping-pong) stays in the notebook; this module only reads the machine and summarises.

    from machinery import l00_hardware as hardware
    hardware.cache_levels()          # [("L1d", 32768, "0"), ("L2", 1048576, "0"), ...]
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
# "NVIDIA H100 80GB HBM3" is the SXM part, with a 50 MB L2 (NVIDIA's H100 whitepaper); torch
# reports 60 MiB of L2 on an H200 (the kept run, 2026-11-27).
KNOWN_GPUS = {"H100 80GB HBM3": ("HBM3, H100 SXM", 50e6), "H200": ("HBM3e, H200", 60 * 2**20)}


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
    time, and of timing.summary's p90 and p10 times (the slowest and fastest up to 5 samples;
    timing.spread_label names them)."""
    from helpers.timing import summary

    s = summary(samples)
    return moved / s["median"] / 1e9, moved / s["p90"] / 1e9, moved / s["p10"] / 1e9


def rate_text(median, low=None, high=None):
    """'54.8 (53.9-55.1)', or '54.8' where there is no spread (one kept median)."""
    if low is None:
        return f"{median:.1f}"
    return f"{median:.1f} ({low:.1f}-{high:.1f})"


def assert_caches_beat_dram(in_cache, dram_best):
    """Section 5's claim: DRAM feeds one core more slowly than its caches by more than the noise.
    in_cache: rate()'s (median, low, high) of the fastest copy; dram_best: each DRAM copy's rate
    from its fastest sample (least time). The fastest copy's median beats every DRAM copy's best.
    The median, not the slowest sample: one interrupted sample (a preemption of a few hundred
    microseconds in a sample of about a hundred) cannot decide it; an interruption only slows a
    sample, so a DRAM copy's fastest is its upper bound."""
    assert in_cache[0] > max(dram_best), (
        f"the fastest copy's median ({in_cache[0]:.1f} GB/s) does not beat the fastest sample of "
        f"a DRAM copy ({max(dram_best):.1f} GB/s): no cache is seen to be faster than DRAM here")


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


def kept_d2d_gbps(runs):
    """{GPU name: its device-to-device rate, GB/s counted 2n/t, at the largest copy} of the runs
    of this lecture kept in data/ (archive.runs("00_hardware")) that measured a GPU."""
    return {run["machine"]["gpus"][0]["name"]:
            gpu_rates(run["measurements"]["gpu_copies"])[-1]["D2D"][0]
            for run in runs if run["measurements"].get("gpu_copies")}
