"""Lecture 16's training program: FSDP2 on a 1-D mesh, checkpointed with DCP every N steps.

A checkpoint is written to `step_NNNNN.tmp/` and renamed to `step_NNNNN/` once every rank's files
and the metadata are on disk, so a folder without `.tmp` is always complete; at start the program
resumes from the newest complete one. `--kill-at S` makes the last rank SIGKILL itself once (a
marker file remembers it) at step S, between the checkpoint's write and its rename: torchrun
restarts the group, which skips the half-committed folder and resumes from the one before.
`--hang-at S` makes the last rank sleep, once, at the start of step S: the other rank's collective
waits `--timeout` seconds (init_process_group's timeout), raises and exits non-zero, and torchrun
ends the sleeping rank and restarts the group. `build_2d` is the model on a (dp, tp) mesh.

Under torchrun (from the repo root), as lecture 16 runs it:
    torchrun --standalone --nproc-per-node 2 --max-restarts 1 notebooks/ckpt_train.py \
        --dir CKPT --steps 12 --every 4 --kill-at 8 --out losses.jsonl
Rank 0 appends one JSON line per step to --out: the attempt (torchrun's restart count), the
step, the loss and the time (time.time()). Without torchrun, `python notebooks/ckpt_train.py ...`
starts 2 ranks with helpers.spawn; in Python, `spawn(ckpt_train.train, 2, args=(CFG, steps))`
returns the losses.
"""
import argparse
import json
import os
import re
import shutil
import signal
import sys
import time
from datetime import timedelta

for _root in (os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.getcwd()):
    if os.path.isdir(os.path.join(_root, "helpers")) and _root not in sys.path:
        sys.path.insert(0, _root)  # so `helpers` imports when torchrun runs this file

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DistributedSampler

from helpers import tiny
from helpers.spawn import spawn

CFG = dict(dim=16, hidden=32, depth=2, samples=48, batch=8, lr=1e-2, noise=0.1, seed=0)
DONE = re.compile(r"step_(\d+)$")  # a committed checkpoint; `step_N.tmp` is not one


def build(world, cfg):
    """The tiny model, FSDP2-sharded over all ranks (one unit per block), and its Adam."""
    mesh = init_device_mesh("cpu", (world,))
    model = tiny.model(cfg["dim"], cfg["hidden"], cfg["depth"], seed=cfg["seed"])
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=cfg["lr"])


def build_2d(shape, cfg):
    """The tiny model on a (dp, tp) mesh: lecture 07's split (fc1 by columns, fc2 by rows) over
    "tp", then FSDP2 over "dp" (lecture 13's recipe); its Adam."""
    import logging
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp"))
    model = tiny.model(cfg["dim"], cfg["hidden"], cfg["depth"], seed=cfg["seed"])
    for block in model:
        parallelize_module(block, mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model, torch.optim.Adam(model.parameters(), lr=cfg["lr"])


def local_batch(cfg, rank, world, step):
    """Step s's shard of the data: the sampler's epoch and position follow from s."""
    data = tiny.batch(cfg["samples"], cfg["dim"], seed=cfg["seed"] + 1)
    per_rank = cfg["batch"] // world
    steps_per_epoch = cfg["samples"] // cfg["batch"]
    epoch, position = divmod(step, steps_per_epoch)
    sampler = DistributedSampler(range(cfg["samples"]), world, rank, seed=cfg["seed"])
    sampler.set_epoch(epoch)
    rows = list(sampler)[position * per_rank:(position + 1) * per_rank]
    return data[0][rows], data[1][rows]


def training_state(model, opt, rank, step):
    """What a resumed run needs: parameters, optimizer state, the step, this rank's RNG."""
    model_sd, optim_sd = get_state_dict(model, opt)
    return {"model": model_sd, "optim": optim_sd, "progress": {"step": step},
            f"rng_{rank}": torch.get_rng_state()}


def latest(ckpt_dir):
    """The newest committed checkpoint folder (name, step), or None."""
    done = [(int(m[1]), n) for n in os.listdir(ckpt_dir)
            if (m := DONE.fullmatch(n)) and os.path.isdir(os.path.join(ckpt_dir, n))]
    return max(done, default=None)


def save(ckpt_dir, state, step, before_commit=lambda: None):
    """Write to step_N.tmp, then rename to step_N when every rank has written."""
    final = os.path.join(ckpt_dir, f"step_{step:05d}")
    tmp = final + ".tmp"
    if dist.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # a previous attempt's leftovers
    dist.barrier()
    dcp.save(state, checkpoint_id=tmp)  # returns once rank 0 wrote .metadata
    before_commit()
    dist.barrier()
    if dist.get_rank() == 0:
        os.rename(tmp, final)  # atomic on one file system
    dist.barrier()


def resume(ckpt_dir, model, opt, rank, restore_rng=True):
    """Load the newest committed checkpoint into model and opt; the step it ends (0: none)."""
    found = latest(ckpt_dir)
    if found is None:
        return 0
    state = training_state(model, opt, rank, 0)
    dcp.load(state, checkpoint_id=os.path.join(ckpt_dir, f"step_{found[0]:05d}"))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if restore_rng:
        torch.set_rng_state(state[f"rng_{rank}"])
    return state["progress"]["step"]


def train(rank, world, cfg, steps, every=0, ckpt_dir=None, kill_at=None, marker=None,
          log=None, restore_rng=True, hang_at=None):
    """Train `steps` steps, checkpointing every `every`; the (step, loss) pairs of this run."""
    torch.set_num_threads(1)
    model, opt = build(world, cfg)
    torch.manual_seed(100 + rank)  # the noise added to the inputs (a stand-in for dropout)
    start = resume(ckpt_dir, model, opt, rank, restore_rng) if ckpt_dir else 0
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    losses = []
    for step in range(start + 1, steps + 1):
        if step == hang_at and rank == world - 1:
            hang_once(os.path.join(ckpt_dir, "hung-once"))
        x, y = local_batch(cfg, rank, world, step - 1)
        x = x + cfg["noise"] * torch.randn(x.shape, dtype=x.dtype)
        loss = tiny.loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append((step, (total / world).item()))
        if rank == 0 and log:
            with open(log, "a") as f:
                f.write(json.dumps({"attempt": attempt, "step": step, "loss": losses[-1][1],
                                    "time": time.time()}) + "\n")
        if every and step % every == 0:
            die = step == kill_at and rank == world - 1 and not os.path.exists(marker)
            save(ckpt_dir, training_state(model, opt, rank, step), step,
                 before_commit=(lambda: kill_once(marker)) if die else (lambda: None))
    return losses


def kill_once(marker):
    """SIGKILL this process, leaving a marker so that the restarted run goes on."""
    open(marker, "w").close()
    os.kill(os.getpid(), signal.SIGKILL)


def hang_once(marker, seconds=600):
    """Stop (sleep far longer than any timeout) unless the marker exists; the marker holds this
    process's id, so that a caller can check it is gone afterwards."""
    if not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(seconds)


def join_attempt(timeout=None):
    """Under torchrun: join this attempt's group. Every attempt shares the launcher's store, so
    the keys are prefixed by the attempt: a restarted rank must not read a dead rank's address."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False)
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt_{attempt}", store),
                            rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=None if timeout is None else timedelta(seconds=timeout))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True, help="checkpoint folder (created)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--every", type=int, default=4, help="checkpoint every N steps")
    p.add_argument("--kill-at", type=int, default=None, help="the last rank dies once here")
    p.add_argument("--hang-at", type=int, default=None, help="the last rank stops once here")
    p.add_argument("--timeout", type=float, default=None,
                   help="under torchrun: seconds a collective waits (default 30 min)")
    p.add_argument("--out", default=None, help="rank 0 appends a JSON line per step")
    a = p.parse_args()
    if a.every < 1 or a.steps < 1:
        p.error("--steps and --every must be at least 1")
    if a.kill_at is not None and a.kill_at % a.every:
        p.error("--kill-at must be a checkpoint step (a multiple of --every)")
    if a.hang_at is not None and not 1 <= a.hang_at <= a.steps:
        p.error("--hang-at must be a step of the run (1 to --steps)")
    if a.hang_at is not None and "RANK" not in os.environ:
        p.error("--hang-at needs torchrun, whose restart ends the hang")
    if a.timeout is not None and a.timeout <= 0:
        p.error("--timeout must be positive")
    os.makedirs(a.dir, exist_ok=True)
    if "RANK" in os.environ:
        join_attempt(a.timeout)
    marker = os.path.join(a.dir, "killed-once")
    spawn(train, None if "RANK" in os.environ else 2, backend="gloo",
          args=(CFG, a.steps, a.every, a.dir, a.kill_at, marker, a.out, True, a.hang_at))


if __name__ == "__main__":
    main()
