"""Lecture 16's bench: run the checkpointing program under torchrun, time checkpoint writes, and
simulate failures over a long run to find the best checkpoint interval.

    log = ckpt_bench.torchrun(script, ckpt_dir, steps=12, every=4, kill_at=8)   # JSON lines
    log = ckpt_bench.torchrun(script, ckpt_dir, 12, 4, hang_at=11, pg_timeout=5)  # a hung rank
    ckpt_bench.assert_resumed_equal(log, reference)                             # the key claim
    times = spawn(ckpt_bench.save_times, 2, args=(sizes, rounds))               # dcp.save
    curve = ckpt_bench.simulate(intervals, C, M, work, runs=8, seed=0)          # mean wall time

The simulation is exact for exponential failures: a segment of `interval` work plus the
checkpoint's `C` either survives (probability exp(-(interval + C) / M)) or fails after a
truncated-exponential time, costs a restart `restart` and is run again.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np


def torchrun(script, ckpt_dir, steps, every, kill_at=None, nproc=2, max_restarts=1, timeout=240,
             hang_at=None, pg_timeout=None):
    """Run the checkpointing program under torchrun; its per-step log (a list of dicts).
    hang_at: the last rank stops there once; pg_timeout: seconds a collective waits."""
    exe = os.path.join(os.path.dirname(sys.executable), "torchrun")
    out = os.path.join(ckpt_dir, "losses.jsonl")
    cmd = [exe, "--standalone", "--nproc-per-node", str(nproc), "--max-restarts",
           str(max_restarts), "--monitor-interval", "0.1", script, "--dir", ckpt_dir,
           "--steps", str(steps), "--every", str(every), "--out", out]
    cmd += [] if kill_at is None else ["--kill-at", str(kill_at)]
    cmd += [] if hang_at is None else ["--hang-at", str(hang_at)]
    cmd += [] if pg_timeout is None else ["--timeout", str(pg_timeout)]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    env.pop("HELPERS_SPAWN_RANK", None)
    os.makedirs(ckpt_dir, exist_ok=True)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"torchrun failed ({done.returncode}):\n{done.stderr[-3000:]}")
    with open(out) as f:
        return [json.loads(line) for line in f]


def assert_gone(pid):
    """No process with this id is left (`ps -p` finds none)."""
    found = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-p", str(pid)],
                           capture_output=True, text=True).stdout.strip()
    assert not found, f"process {pid} is still there: {found}"


def assert_resumed_equal(log, reference):
    """Every logged loss, first run and resumed, equals the uninterrupted run's at that step,
    exactly; every step was logged; at least one restart happened."""
    want = dict(reference)
    assert max(r["attempt"] for r in log) >= 1, "no restart happened"
    assert {r["step"] for r in log} == set(want), "steps missing from the log"
    wrong = [(r["step"], r["attempt"], r["loss"], want[r["step"]]) for r in log
             if r["loss"] != want[r["step"]]]
    assert not wrong, f"losses differ from the uninterrupted run (step, attempt, got, want): {wrong}"


def restart_gap(log):
    """Seconds from the last step logged by attempt 0 to the first logged by attempt 1."""
    last = max(r["time"] for r in log if r["attempt"] == 0)
    return min(r["time"] for r in log if r["attempt"] == 1) - last


def by_step(log):
    """Rows of a table: each step's loss per attempt."""
    attempts = sorted({r["attempt"] for r in log})
    rows = {}
    for r in log:
        row = rows.setdefault(r["step"], {"step": r["step"]} | {f"attempt {a}": "-" for a in attempts})
        row[f"attempt {r['attempt']}"] = r["loss"]
    return [rows[s] for s in sorted(rows)]


def files(path):
    """{file name: bytes} of a checkpoint folder."""
    return {n: os.path.getsize(os.path.join(path, n)) for n in sorted(os.listdir(path))}


def records(metadata):
    """{file name: number of items stored in it} from DCP's metadata."""
    out = {}
    for info in metadata.storage_data.values():
        out[info.relative_path] = out.get(info.relative_path, 0) + 1
    return out


def shard_bytes(state):
    """Bytes of the DTensor shards this rank holds in a (nested) state dict; plain tensors (a
    replicated `step`) and other values are not counted."""
    from torch.distributed.tensor import DTensor

    if isinstance(state, dict):
        return sum(shard_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(shard_bytes(v) for v in state)
    if isinstance(state, DTensor):
        local = state.to_local()
        return local.numel() * local.element_size()
    return 0


def save_times(rank, world, sizes, rounds, root=None):
    """Seconds of dcp.save of a state of `n` bytes split over the ranks, for each n in sizes:
    per size the slowest rank's time of each round (a barrier before each save)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    torch.set_num_threads(1)
    base = root or tempfile.gettempdir()
    out = {}
    for n in sizes:
        state = {f"shard_{rank}": torch.rand(max(1, n // world // 8), dtype=torch.float64)}
        out[n] = []
        for i in range(rounds + 1):                          # round 0 warms up
            path = os.path.join(base, f"ckpt_bench_{os.getppid()}_{n}_{i}")
            dist.barrier()
            t0 = time.perf_counter()
            dcp.save(state, checkpoint_id=path)
            took = torch.tensor([time.perf_counter() - t0])
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            dist.barrier()
            if rank == 0:
                shutil.rmtree(path, ignore_errors=True)
            if i:
                out[n].append(took.item())
    return out


def simulate(intervals, C, M, work, runs=8, seed=0, restart=0.0):
    """Mean wall time to finish `work` seconds of training, checkpointing every `interval` of
    work at cost C, failures exponential with mean M, a restart costing `restart`."""
    rng = np.random.default_rng(seed)
    means = []
    for tau in intervals:
        seg = tau + C
        n = int(np.ceil(work / tau))
        survive = np.exp(-seg / M)
        total = 0.0
        for _ in range(runs):
            fails = rng.geometric(survive, size=n) - 1          # failed tries per segment
            k = int(fails.sum())
            u = rng.random(k)                                    # truncated exponential on [0, seg)
            lost = -M * np.log1p(-u * (1 - np.exp(-seg / M)))
            total += n * seg + lost.sum() + k * restart
        means.append(total / runs)
    return np.array(means)


def best_interval(intervals, means):
    """The interval of least wall time: a parabola in log(interval) through the grid's lowest
    point and its neighbours (the curve is flat near its minimum)."""
    i = int(np.clip(np.argmin(means), 1, len(means) - 2))
    x, y = np.log(intervals[i - 1:i + 2]), means[i - 1:i + 2]
    a, b, _ = np.polyfit(x, y, 2)
    return float(np.exp(-b / (2 * a))) if a > 0 else float(intervals[i])


def young_daly(C, M):
    """Young's (1974) first-order optimum of the checkpoint interval, sqrt(2 C M)."""
    return float(np.sqrt(2 * C * M))


def assert_best_near_formula(best, C, M, rtol=0.15):
    """The simulated best interval within rtol of sqrt(2 C M): the formula keeps the first order
    in C/M (Daly's next term is -C) and the simulated curve is flat near its minimum."""
    want = young_daly(C, M)
    assert abs(best / want - 1) <= rtol, \
        f"simulated best interval {best:.4g} s, sqrt(2 C M) = {want:.4g} s: off by more than {rtol:.0%}"



def step_times(rank, world, n, rounds, root, work_s=0.1):
    """Seconds per step of a loop that computes for about `work_s` and saves a state of `n` bytes
    (split over the ranks): per round one step of each mode, "none", "sync" (dcp.save) and
    "async" (dcp.async_save: its write runs beside that step's compute); the slowest rank's. The
    loop adds 1 to the state right after each save call. A save in flight is awaited before the
    next step (untimed: none runs beside another mode's step), and each checkpoint, once complete,
    is loaded, compared with the value at its call and removed (checkpoints left on the disk made
    later saves slower: a synchronous step paid about 120 ms for a 40 ms save). Returns
    ({mode: times}, every saved value was the value at its call)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    torch.set_num_threads(1)
    group = dist.new_group(backend="gloo")            # the saves' collectives: not the loop's
    key = f"shard_{rank}"
    state = {key: torch.zeros(max(1, n // world // 8), dtype=torch.float64)}
    a, reps, t0 = torch.rand(256, 256, dtype=torch.float64), 0, time.perf_counter()
    while time.perf_counter() - t0 < work_s:        # calibrate the compute to about work_s
        a, reps = torch.tanh(a @ a), reps + 1
    reps = torch.tensor([reps])
    dist.all_reduce(reps, op=dist.ReduceOp.MAX)

    def checked(path, value):                        # the saved value is the one at its call
        got = {key: torch.empty_like(state[key])}
        dcp.load(got, checkpoint_id=path, process_group=group)
        dist.barrier(group)
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
        return bool((got[key] == value).all())

    times, same, pending = {m: [] for m in ("none", "sync", "async")}, True, None
    for i in range(rounds + 1):                      # round 0 warms up
        for mode in times:
            path = os.path.join(root, f"steps_{os.getppid()}_{mode}_{i}")
            if pending is not None:                  # one save in flight, none beside the next step
                future, done_path, done_value = pending
                future.result()
                same &= checked(done_path, done_value)
                pending = None
            value = state[key][0].item()
            dist.barrier()
            t0 = time.perf_counter()
            if mode == "sync":
                dcp.save(state, checkpoint_id=path, process_group=group)
            elif mode == "async":
                pending = (dcp.async_save(state, checkpoint_id=path, process_group=group), path, value)
            state[key].add_(1.0)                     # the loop goes on changing the state
            for _ in range(int(reps)):
                a = torch.tanh(a @ a)
            took = torch.tensor([time.perf_counter() - t0])
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            if mode == "sync":
                same &= checked(path, value)
            if i:
                times[mode].append(took.item())
    if pending is not None:
        pending[0].result()
        same &= checked(*pending[1:])
    return times, same
