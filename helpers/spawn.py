"""Start K ranks from a notebook cell: the one way every lecture launches workers.

    from helpers.spawn import spawn
    results = spawn(fn, world_size=4, args=(x,), backend="auto", timeout=120)

`fn(rank, world_size, *args)` runs in `world_size` processes with the default process group ready
(gloo on CPU, nccl when every rank can have its own GPU) and returns the per-rank values in rank
order, tensors moved to the CPU. What the ranks print is shown afterwards, labelled by rank, rank 0
first. A rank that raises, dies or hangs becomes one readable exception here, and no worker is left
running. Under `torchrun` the same call joins the existing group instead and runs `fn` in place.
After a hang the exception shows, for every rank still running, where it was waiting: its Python
stack, read while it hung (`helpers/stacks.py`).

How it is fast: a fork server (`helpers/_worker.py`) imports torch once; each rank is a fork of it.
How ranks find each other: a FileStore in a fresh temporary file per launch (all ranks are on this
host), so there is no port to collide on. A TCP store was tried first: each connection formats the peer
address `::ffff:127.0.0.1` with a reverse DNS lookup, and one lookup in ~25 waited out the resolver's
5 s timeout, stalling a whole launch.
"""
import atexit
import os
import pickle
import socket
import sys
import time
import uuid
from multiprocessing.connection import Connection, wait

from helpers import forkserver, progress, stacks

BACKENDS = ("auto", "gloo", "nccl")
GRACE_S = 0.3  # after a first error, how long to wait for the other ranks' own errors
# Errors that only say a peer went away: the consequence of another rank's failure, not its cause.
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
             "remote process exited", "Connection refused")


class SpawnError(RuntimeError):
    """A rank raised an exception or died before returning."""


class SpawnTimeout(SpawnError, TimeoutError):
    """Some ranks had not finished within the timeout (a hang: a skipped collective, a deadlock)."""


def spawn(fn, world_size, args=(), backend="auto", timeout=120, threads=1):
    """Run fn(rank, world_size, *args) on `world_size` ranks; return their values in rank order."""
    if under_torchrun():
        return _run_in_place(fn, world_size, args, backend)
    backend = check_args(fn, world_size, backend, timeout, threads)
    payload = forkserver.dumps_by_value((fn, tuple(args)))
    launch = _Launch(world_size, backend, timeout, threads, payload)
    succeeded = False
    try:
        values = launch.run()
        succeeded = True
        return values
    finally:
        launch.end(succeeded)
        progress.launched()          # the count a long cell's line shows (helpers.progress)


def check_args(fn, world_size, backend="auto", timeout=120, threads=1):
    """Refuse what cannot run, with a sentence, before any process starts. Returns the backend."""
    if not callable(fn):
        raise ValueError(f"spawn needs a function to run on every rank, got {fn!r}.")
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise ValueError(f"world_size must be a whole number of ranks, got {world_size!r}.")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1 (one process per rank), got {world_size}.")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}.")
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}.")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads (per rank) must be a whole number >= 1, got {threads!r}.")
    return resolve_backend(world_size, backend)


def resolve_backend(world_size, backend="auto"):
    """'auto' -> nccl when every rank can have its own GPU, else gloo; refuses nccl without GPUs."""
    gpus = gpu_count()
    if backend == "nccl" and gpus < world_size:
        raise ValueError(f"nccl needs one GPU per rank: {world_size} ranks asked for, "
                         f"{gpus} GPU(s) here. Use backend='gloo' or 'auto', or fewer ranks.")
    if backend == "auto":
        return "nccl" if 0 < world_size <= gpus else "gloo"
    return backend


def gpu_count():
    """GPUs visible to this process, counted without initialising CUDA here."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device(rank=None):
    """The device a rank's tensors belong on: its GPU under nccl, else the CPU."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device() if rank is None else rank)
    return torch.device("cpu")


def warm_up():
    """Start the fork server now (it imports torch once), so the first launch is a warm one; in a
    notebook, a cell that runs longer than 5 s shows how long so far (helpers.progress.watch_cells)."""
    forkserver.server()
    progress.watch_cells()


def describe_launch(world_size, backend="auto"):
    """What `spawn` does to make a group, as a dict a lecture can print."""
    backend = resolve_backend(world_size, backend)
    return {"start": "fork of a server process that imported torch once (helpers/_worker.py)",
            "rendezvous": "a FileStore (a key-value store in a fresh temporary file) that every rank "
                          "opens; torchrun would use a TCPStore at MASTER_ADDR:MASTER_PORT instead",
            "backend": backend, "world_size": world_size,
            "env per rank": "RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (the node), HELPERS_SPAWN_STORE"}


# ---------------------------------------------------------------------------------------- a launch

class _Launch:
    def __init__(self, world_size, backend, timeout, threads, payload):
        self.world_size, self.timeout = world_size, timeout
        self.pids, self.conns, self.outputs, self.stacks = {}, {}, {}, {}
        self.store = os.path.join(forkserver.tmpdir(), f"{uuid.uuid4().hex}.store")
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
                   WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size), GROUP_RANK="0",
                   HELPERS_SPAWN_STORE=self.store, HELPERS_SPAWN_RANK="1")
        env.setdefault("GLOO_SOCKET_IFNAME", forkserver.loopback_interface())
        env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        self.base = dict(world_size=world_size, backend=backend, timeout=timeout, threads=threads,
                         payload=payload, store=self.store, sys_path=list(sys.path), cwd=os.getcwd())
        self.env = env

    def run(self):
        for rank in range(self.world_size):  # ask for every fork first: they start in parallel
            mine, theirs = socket.socketpair()
            forkserver.send_to_server(theirs)
            self.conns[rank] = Connection(mine.detach())
        for rank in range(self.world_size):
            self._start(rank)
        return self._collect()

    def _start(self, rank):
        conn = self.conns[rank]
        try:
            self.pids[rank] = pickle.loads(conn.recv_bytes())
        except EOFError:
            raise SpawnError("the launcher's fork server exited before starting rank "
                             f"{rank}; run the cell again (it starts a new one).") from None
        name = os.path.join(forkserver.tmpdir(), f"{uuid.uuid4().hex}-rank{rank}")
        self.outputs[rank], self.stacks[rank] = name + ".log", name + ".stack"
        env = dict(self.env, RANK=str(rank), LOCAL_RANK=str(rank))
        conn.send_bytes(pickle.dumps(dict(self.base, rank=rank, env=env, out_path=self.outputs[rank],
                                          stack_path=self.stacks[rank])))

    def _collect(self):
        deadline = time.monotonic() + self.timeout
        values, errors = {}, {}
        waiting = dict(self.conns)
        first_error_at = None
        while waiting:
            now = time.monotonic()
            limit = deadline if first_error_at is None else min(deadline, first_error_at + GRACE_S)
            if now >= limit:
                break
            for conn in wait(list(waiting.values()), timeout=limit - now):
                rank = next(r for r, c in waiting.items() if c is conn)
                del waiting[rank]
                try:
                    reply = pickle.loads(conn.recv_bytes())
                except EOFError:
                    reply = ("died",)
                except Exception as e:  # noqa: BLE001 - e.g. a value whose class is not importable here
                    reply = ("error", type(e).__name__, f"its return value could not be received: {e}",
                             [], None)
                if reply[0] == "ok":
                    values[rank] = reply[1]
                else:
                    errors[rank] = reply
                    first_error_at = first_error_at or time.monotonic()
        if errors:
            raise self._error(errors)
        if waiting:
            raise self._timeout(sorted(waiting), sorted(values))
        return [values[r] for r in range(self.world_size)]

    def _error(self, errors):
        """Report the cause: the lowest rank that died or raised for a reason of its own."""
        causes = [r for r in sorted(errors) if errors[r][0] == "died"
                  or not any(p in errors[r][2] for p in PEER_LOST)]
        rank = (causes or sorted(errors))[0]
        reply = errors[rank]
        others = [r for r in sorted(errors) if r != rank]
        also = f" (ranks {others} failed too)" if others else ""
        if reply[0] == "died":
            last = _last_lines(self.outputs[rank])
            err = SpawnError(f"rank {rank} of {self.world_size} died before returning a value{also}."
                             + (f"\nIts last output:\n{last}" if last else ""))
        else:
            _, kind, message, frames, original = reply
            tb = stacks.format_frames(frames)
            err = SpawnError(f"rank {rank} of {self.world_size} raised {kind}: {message}{also}\n\n"
                             f"Traceback of rank {rank} (most recent call last):\n{tb}")
            err.original = original
        err.rank = rank
        return err

    def _timeout(self, stuck, done):
        lines = [f"spawn timed out after {self.timeout:g} s: rank(s) {stuck} of {self.world_size} "
                 f"had not finished" + (f" (rank(s) {done} had returned)." if done else ".")]
        found = stacks.capture({rank: (self.pids[rank], self.stacks[rank]) for rank in stuck})
        for rank in stuck:
            last = _last_lines(self.outputs[rank])
            lines.append(f"Last output of rank {rank}: " + (f"\n{last}" if last else "(nothing)"))
            lines.append(stacks.describe(rank, found[rank]))
        lines.append("A rank that skips a collective, or a send without its matching recv, hangs "
                     "like this; all ranks have been ended.")
        err = SpawnTimeout("\n".join(lines))
        err.ranks, err.stacks = stuck, found  # stacks: {rank: frames oldest first, or None}
        return err

    def end(self, succeeded=False):
        """Release finished ranks, kill the rest, show what every rank printed, leave nothing behind."""
        for conn in self.conns.values():
            conn.close()  # a rank that has answered exits as soon as it sees this
        if not succeeded:  # ranks still running (an error, a hang, an interrupt) are killed
            for pid in self.pids.values():
                forkserver.kill_group(pid)
            deadline = time.monotonic() + 5
            while any(forkserver.alive(p) for p in self.pids.values()) and time.monotonic() < deadline:
                time.sleep(0.005)
        for rank in sorted(self.outputs):
            _print_labelled(rank, self.outputs[rank])
        for path in [self.store, *self.stacks.values()]:
            if os.path.exists(path):
                os.unlink(path)


def _print_labelled(rank, path):
    try:
        with open(path, errors="replace") as f:
            text = f.read()
        os.unlink(path)
    except FileNotFoundError:
        return
    for line in text.splitlines():
        print(f"[rank {rank}] {line}")


def _last_lines(path, n=5):
    try:
        with open(path, errors="replace") as f:
            return "\n".join("    " + line for line in f.read().splitlines()[-n:])
    except FileNotFoundError:
        return ""


# --------------------------------------------------------------------------------- under torchrun

def under_torchrun():
    """True in a process that torchrun started (and not in one of spawn's own ranks)."""
    env = os.environ
    return all(k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")) \
        and "HELPERS_SPAWN_RANK" not in env


def _run_in_place(fn, world_size, args, backend):
    """Under torchrun this process is already a rank: join the group, run fn, share the values."""
    import torch
    import torch.distributed as dist

    size, rank, local = (int(os.environ[k]) for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK"))
    if world_size is not None and world_size != size:
        raise ValueError(f"torchrun started {size} ranks but spawn was asked for {world_size}; "
                         "pass world_size=None (or the same number) under torchrun.")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}.")
    if not dist.is_initialized():
        backend = resolve_backend(int(os.environ.get("LOCAL_WORLD_SIZE", size)), backend)
        if backend == "nccl":
            torch.cuda.set_device(local)
        dist.init_process_group(backend, device_id=torch.device("cuda", local) if backend == "nccl" else None)
        atexit.register(dist.destroy_process_group)
    value = fn(rank, size, *args)
    from helpers._worker import _to_cpu

    values = [None] * size
    dist.all_gather_object(values, _to_cpu(value))
    return values
