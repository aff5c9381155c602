"""What machine a measurement was taken on, stated at the top of every lecture."""
import functools
import os
import platform
import shutil
import subprocess


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if platform.system() == "Darwin":
        try:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                  text=True, timeout=5).stdout.strip() or platform.processor()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine()


def usable_cores():
    """CPU cores this process may run on (a container's limit, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def memory_bytes():
    import psutil

    return psutil.virtual_memory().total


def gpus():
    """[(name, memory in bytes)] for each visible GPU; [] without one."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [(torch.cuda.get_device_name(i), torch.cuda.get_device_properties(i).total_memory)
            for i in range(torch.cuda.device_count())]


@functools.lru_cache(maxsize=None)
def gpu_driver():
    """The NVIDIA driver's version as nvidia-smi reports it, or None (no nvidia-smi, no GPU).
    Asked once per process: it cannot change while the process runs, and nvidia-smi is slow."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0] if out else None


def describe():
    """A dict of the facts a measurement depends on (also written into results files)."""
    import torch

    found = gpus()
    return {"cpu": cpu_model(), "cores": usable_cores(), "memory_gib": round(memory_bytes() / 2**30, 1),
            "gpus": [{"name": n, "memory_gib": round(m / 2**30, 1)} for n, m in found],
            "torch": torch.__version__, "cuda": torch.version.cuda if found else None,
            "driver": gpu_driver() if found else None, "python": platform.python_version(),
            "os": f"{platform.system()} {platform.release()}"}


def short():
    """The machine in one line, for captions and page banners: CPU, cores, memory, GPUs, torch."""
    d = describe()
    gpus = ", ".join(g["name"] for g in d["gpus"]) or "no GPU"
    return f"{d['cpu']}, {d['cores']} cores, {d['memory_gib']} GiB, {gpus}, torch {d['torch']}"


def oversubscribed(world_size, threads_per_rank=1):
    return world_size * threads_per_rank > usable_cores()


def timed_ranks(world_size, least=1):
    """The ranks a timing runs on: `world_size`, but at most one per usable core (the series'
    convention, so that ranks do not take turns on the cores), and at least `least`."""
    return max(least, min(world_size, usable_cores()))


TORCH_NEEDED = (2, 13)   # all_gather_single, reduce_scatter_single and gloo's list all_to_all


def torch_too_old(version=None):
    """A sentence when this torch predates the one the course is written for, else None."""
    import torch

    version = version or torch.__version__
    found = tuple(int(x) for x in version.split("+")[0].split(".")[:2])
    if found >= TORCH_NEEDED:
        return None
    return (f"torch {version} is older than the {'.'.join(map(str, TORCH_NEEDED))} this course is "
            "written for: cells that use dist.all_gather_single, dist.reduce_scatter_single or "
            "gloo's all_to_all will fail (requirements.txt pins the version).")


def banner(world_size=None, backend=None):
    """Two lines: the machine, and the ranks, flagged "oversubscribed" when they outnumber the cores
    (what that means for a timing, each lecture says in its markdown); a third when torch is older
    than the course's (torch_too_old)."""
    d = describe()
    gpu = ", ".join(f"{g['name']} ({g['memory_gib']} GiB)" for g in d["gpus"]) or "no GPU"
    text = (f"Measured on: {d['cpu']}, {d['cores']} usable core(s), {d['memory_gib']} GiB memory, "
            f"{gpu}; torch {d['torch']}, {d['os']}.")
    if world_size is not None:
        text += "\n" + ranks(world_size, backend)
    old = torch_too_old()
    return text + (f"\n{old}" if old else "")


def ranks(world_size, backend=None):
    """The banner's second line: the ranks, flagged when they outnumber the cores."""
    over = f"; oversubscribed: {world_size} ranks > {usable_cores()} cores" if oversubscribed(world_size) else ""
    return f"Ranks: {world_size}" + (f" on {backend}" if backend else "") + over + "."
