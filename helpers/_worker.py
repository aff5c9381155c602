"""The other side of `helpers.spawn`: a fork server that has imported torch, and the body of a rank.

The notebook process starts `serve()` once, in a freshly executed Python (never a fork of the
notebook, so a parent that initialised CUDA is never forked). The server imports torch, then waits.
For every rank of every launch the notebook sends it one end of a socket pair; the server forks, and
the child runs `_rank()` on that socket: torch is already imported, so a rank costs a fork, not an
import. The server itself never runs torch code, starts no thread and never touches CUDA.

The socket carries, in order: the child's pid (child -> parent), the request (parent -> child), then
("ok", value) or ("error", ...) (child -> parent), then a release (parent -> child, or the parent
closing its end). A rank leaves by os._exit only once the parent has every rank's answer, so a
collective still in flight on a peer never sees a closed socket, and no gloo or NCCL destructor runs
at exit: the teardown noise that can abort a process after its work is done cannot happen.
"""
import gc
import os
import pickle
import signal
import socket
import sys
import threading
import traceback
from multiprocessing.connection import Connection

import cloudpickle

from helpers import stacks


# Imported once by the server, inherited by every rank. torch.distributed.tensor is here because
# cloudpickle lists it as a submodule to import whenever the notebook has loaded it (assert_close
# does) and a function uses `dist` and the name `tensor`: 1-4 s per rank per launch otherwise. The
# rest are what the later lectures' ranks import (DDP, ZeRO, FSDP, pipelining); DDP's constructor and
# torch.optim's first step import torch._dynamo lazily, another 3-5 s per rank on 2 cores.
PRELOAD = ("torch", "torch.distributed", "torch.distributed.tensor", "torch._dynamo",
           "torch.nn.parallel", "torch.optim", "torch.distributed.optim", "torch.distributed.fsdp",
           "torch.distributed.pipelining")


def serve(ctl_fd):
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    # What the ranks inherit is never garbage: collected once here, then frozen out of the collector,
    # so that no rank's full collection walks the preloaded objects (and copies their pages, shared
    # with the server until written) in the middle of a timed round (a 0.37 s stall of one round of
    # lecture 07's step, which made a wrong machine's model pass; gc.freeze's documented use).
    gc.collect()
    gc.freeze()

    ctl = socket.socket(fileno=ctl_fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the ranks: no zombies
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the notebook process decides when ranks end
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 16, 1)
        except OSError:
            return
        if not msg or not fds:  # the notebook process is gone: so is this server
            return
        if os.fork() == 0:
            ctl.close()
            code = 1
            try:
                code = _rank(fds[0])
            finally:
                os._exit(code)
        os.close(fds[0])


def _rank(fd):
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.setsid()  # its own process group, so the launcher can end it and anything it started
    conn = Connection(fd)
    conn.send_bytes(pickle.dumps(os.getpid()))
    req = pickle.loads(conn.recv_bytes())

    out = os.open(req["out_path"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(out, 1)  # C-level output (gloo, NCCL warnings) lands in the same file as print()
    os.dup2(out, 2)
    os.close(out)
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    os.environ.clear()
    os.environ.update(req["env"])
    sys.path[:] = req["sys_path"]
    os.chdir(req["cwd"])
    stacks.listen(req["stack_path"])  # on a hang the launcher asks where this rank waits

    # The parent closing its end (done, or killed) ends this rank, whatever it is doing.
    threading.Thread(target=_exit_when_released, args=(conn,), daemon=True).start()
    try:
        value = _run(req)
        # by value, so an object of a class defined in a notebook cell can travel back too
        reply = cloudpickle.dumps(("ok", value), protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the notebook
        reply = _error_reply(e)
    sys.stdout.flush()
    sys.stderr.flush()
    conn.send_bytes(reply)
    threading.Event().wait()  # until released: _exit_when_released ends the process


def _exit_when_released(conn):
    try:
        conn.recv_bytes()
    except (EOFError, OSError):
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _run(req):
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(req["threads"])
    fn, args = cloudpickle.loads(req["payload"])
    rank, world_size, backend = req["rank"], req["world_size"], req["backend"]
    if backend == "nccl":  # the rank's GPU, named to the group (device_id): no barrier has to guess it
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, store=dist.FileStore(req["store"], world_size), rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=req["timeout"]),
                            device_id=torch.device("cuda", rank) if backend == "nccl" else None)
    value = fn(rank, world_size, *args)
    return _to_cpu(value)


def _to_cpu(value):
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return type(value)((k, _to_cpu(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_to_cpu(v) for v in value)
    return value


def _error_reply(e):
    frames = [(f.filename, f.lineno, f.name, f.line) for f in traceback.extract_tb(e.__traceback__)]
    message = str(e)
    try:
        return cloudpickle.dumps(("error", type(e).__name__, message, frames, e))
    except Exception:  # noqa: BLE001 - an exception that cannot travel is described instead
        return pickle.dumps(("error", type(e).__name__, message, frames, None))


if __name__ == "__main__":
    serve(int(sys.argv[1]))
