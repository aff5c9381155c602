"""The launcher's contract (DESIGN.md, `helpers/spawn.py`), one test or more per bullet."""
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist

from helpers import forkserver
from helpers import spawn as launcher
from helpers import stacks
from helpers.spawn import SpawnError, SpawnTimeout, spawn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def alive(pid):
    return forkserver.alive(pid)


def wait_gone(pids, within=5.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.02)
    return False


def read_pids(folder, n, within=30.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        files = [f for f in os.listdir(folder) if f.endswith(".pid")]
        if len(files) == n:
            time.sleep(0.05)
            return [int(open(os.path.join(folder, f)).read()) for f in files]
        time.sleep(0.05)
    raise AssertionError(f"expected {n} pid files in {folder}, found {os.listdir(folder)}")


def write_pid(folder, rank):
    with open(os.path.join(folder, f"{rank}.pid.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.rename(os.path.join(folder, f"{rank}.pid.tmp"), os.path.join(folder, f"{rank}.pid"))


# ----------------------------------------------------------------------------- values and group

def test_values_come_back_in_rank_order_with_tensors_on_the_cpu():
    def fn(rank, world_size, scale):
        time.sleep(0.03 * (world_size - rank))  # the last rank finishes first
        return {"rank": rank, "t": torch.full((3,), float(rank)) * scale, "pid": os.getpid()}

    out = spawn(fn, 4, args=(2.0,))
    assert [o["rank"] for o in out] == [0, 1, 2, 3]
    assert wait_gone([o["pid"] for o in out])  # released ranks leave by themselves
    for r, o in enumerate(out):
        assert o["t"].device.type == "cpu"
        assert torch.equal(o["t"], torch.full((3,), 2.0 * r))


def test_the_default_group_is_ready_and_collectives_work():
    def fn(rank, world_size):
        t = torch.tensor([float(rank + 1)], dtype=torch.float64)
        dist.all_reduce(t)
        return dist.is_initialized(), dist.get_rank(), dist.get_world_size(), dist.get_backend(), t

    out = spawn(fn, 3)
    for rank, (ready, r, ws, backend, t) in enumerate(out):
        assert (ready, r, ws, backend) == (True, rank, 3, "gloo")
        assert t.item() == 6.0


def test_a_single_rank_works():
    assert spawn(lambda rank, world_size: (rank, world_size), 1) == [(0, 1)]


def test_values_of_tens_of_megabytes_arrive_intact():
    n = 8 * 2**20  # 32 MiB of float32 per rank

    def fn(rank, world_size, n):
        g = torch.Generator().manual_seed(rank)
        return torch.randn(n, generator=g)

    out = spawn(fn, 4, args=(n,))
    for rank, t in enumerate(out):
        assert torch.equal(t, torch.randn(n, generator=torch.Generator().manual_seed(rank)))


def test_args_reach_every_rank_unchanged():
    x = torch.arange(10, dtype=torch.float64)
    out = spawn(lambda rank, world_size, x, word: (x.sum().item(), word), 2, args=(x, "hello"))
    assert out == [(45.0, "hello")] * 2


# --------------------------------------------------------------------------------------- output

def test_output_is_labelled_by_rank_in_rank_order(capsys):
    def fn(rank, world_size):
        time.sleep(0.05 * (world_size - rank))  # rank 3 prints first in time
        print(f"python print from {rank}")
        print(f"stderr from {rank}", file=sys.stderr)
        os.write(1, f"C-level write from {rank}\n".encode())  # what gloo or NCCL would print

    spawn(fn, 4)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[rank")]
    expected = []
    for r in range(4):
        expected += [f"[rank {r}] python print from {r}", f"[rank {r}] stderr from {r}",
                     f"[rank {r}] C-level write from {r}"]
    assert lines == expected


# --------------------------------------------------------------------------------------- failures

def test_a_raising_rank_is_named_with_its_traceback_and_the_others_are_ended(tmp_path):
    def fn(rank, world_size, folder):
        write_pid(folder, rank)
        if rank == 2:
            raise ValueError("bad shard on purpose")
        dist.barrier()  # the others would wait for rank 2 forever

    with pytest.raises(SpawnError) as info:
        spawn(fn, 4, args=(str(tmp_path),), timeout=60)
    message = str(info.value)
    assert "rank 2 of 4 raised ValueError: bad shard on purpose" in message
    assert 'raise ValueError("bad shard on purpose")' in message and "in fn" in message
    assert "_worker.py" not in message
    assert info.value.rank == 2 and isinstance(info.value.original, ValueError)
    assert wait_gone(read_pids(tmp_path, 4))


def test_the_lowest_failing_rank_is_reported_when_all_fail():
    def fn(rank, world_size):
        time.sleep(0.02 * (world_size - rank))
        raise RuntimeError(f"rank {rank} failed")

    with pytest.raises(SpawnError, match=r"rank 0 of 3 raised RuntimeError: rank 0 failed "
                                         r"\(ranks \[1, 2\] failed too\)"):
        spawn(fn, 3)


def test_a_hang_ends_within_the_timeout_naming_the_ranks_that_had_not_finished(tmp_path):
    def fn(rank, world_size, folder):
        write_pid(folder, rank)
        print(f"rank {rank} before the barrier")
        if rank != 1:  # rank 1 skips the collective: everyone else waits for it
            dist.barrier()

    start = time.monotonic()
    with pytest.raises(SpawnTimeout) as info:
        spawn(fn, 4, args=(str(tmp_path),), timeout=3)
    assert time.monotonic() - start < 3 + 5
    message = str(info.value)
    assert "rank(s) [0, 2, 3] of 4 had not finished" in message
    assert "rank(s) [1] had returned" in message
    assert "rank 2 before the barrier" in message
    assert info.value.ranks == [0, 2, 3]
    assert wait_gone(read_pids(tmp_path, 4))


def test_a_hang_shows_where_each_stuck_rank_was_waiting_and_leaves_no_file(tmp_path):
    def skips_a_collective(rank, world_size, folder):
        write_pid(folder, rank)
        t = torch.ones(1)
        if rank != 1:  # rank 1 returns: ranks 0 and 2 wait in the all-reduce for it
            dist.all_reduce(t)
        return rank

    start = time.monotonic()
    with pytest.raises(SpawnTimeout) as info:
        spawn(skips_a_collective, 3, args=(str(tmp_path),), timeout=3)
    assert time.monotonic() - start < 3 + 5
    message = str(info.value)
    for rank in (0, 2):
        where = message.split(f"Rank {rank} was waiting in (most recent call last):\n")[1]
        assert where.startswith(f'  File "{__file__}", line ')  # the user's frame comes first
        assert "in skips_a_collective\n    dist.all_reduce(t)\n" in where
        assert where.index("dist.all_reduce(t)") < where.index(", in all_reduce\n")  # torch's, below
    assert "Rank 1" not in message  # it had returned: nothing to show
    assert "_worker.py" not in message
    assert wait_gone(read_pids(tmp_path, 3))
    assert not [f for f in os.listdir(forkserver.tmpdir()) if f.endswith(".stack")]


def test_a_stack_dump_is_read_as_the_frames_of_the_thread_that_ran_fn():
    worker = os.path.join(ROOT, "helpers", "_worker.py")
    torch_dir = os.path.dirname(torch.__file__)
    dump = textwrap.dedent(f"""\
        Thread 0x00007f0000000002 (most recent call first):
          File "{worker}", line 98 in _exit_when_released

        Current thread 0x00007f0000000001 (most recent call first):
          File "{torch_dir}/d.py", line 4 in wait
          File "{torch_dir}/c.py", line 3 in c
          File "{torch_dir}/b.py", line 2 in b
          File "{torch_dir}/a.py", line 1 in a
          File "/a/notebook/cell.py", line 10 in fn
          File "{worker}", line 120 in _run
          File "{worker}", line 85 in _rank
          File "<frozen runpy>", line 88 in _run_code
        """)
    frames = stacks.fn_frames(dump)
    assert [(name, line) for _, line, name, _ in frames] == [("fn", 10), ("a", 1), ("b", 2), ("c", 3),
                                                              ("wait", 4)]
    text = stacks.describe(3, frames).splitlines()
    assert text[0] == "Rank 3 was waiting in (most recent call last):"
    assert text[1] == '  File "/a/notebook/cell.py", line 10, in fn'
    assert text[2] == "  ... (library frames not shown: 1)"  # of torch's 4, the last 3 are shown
    assert [line.split()[-1] for line in text[3:]] == ["b", "c", "wait"]
    assert stacks.fn_frames("Thread 0x1 (most recent call first):\n  <no Python frame>\n") is None
    assert stacks.describe(1, None) == ("Rank 1: its stack could not be read (it had ended, or was "
                                        "no longer in fn).")


def test_a_rank_that_dies_before_returning_is_a_failure(tmp_path):
    def fn(rank, world_size, folder):
        write_pid(folder, rank)
        dist.barrier()  # every rank is past its start-up (gloo's connections) and wrote its pid
        if rank == 1:
            print("about to die")
            os._exit(3)
        dist.barrier()

    with pytest.raises(SpawnError, match="rank 1 of 3 died before returning a value") as info:
        spawn(fn, 3, args=(str(tmp_path),), timeout=60)
    assert "about to die" in str(info.value)
    assert wait_gone(read_pids(tmp_path, 3))


def test_a_rank_that_aborts_after_returning_does_not_fail_the_run():
    # What gloo teardown has been seen to do: abort a process after its work is done.
    def fn(rank, world_size):
        import threading

        if rank == 0:
            threading.Thread(target=lambda: (time.sleep(0.2), os.abort())).start()
        else:
            time.sleep(1.0)  # still working when rank 0 aborts
        return rank

    assert spawn(fn, 2) == [0, 1]


def test_a_value_that_cannot_be_sent_back_is_named():
    with pytest.raises(SpawnError, match="rank 0 of 1 raised"):
        spawn(lambda rank, world_size: (x for x in range(3)), 1)


# ------------------------------------------------------------------------------- bad arguments

@pytest.mark.parametrize("kwargs, words", [
    (dict(world_size=0), "at least 1"),
    (dict(world_size=-2), "at least 1"),
    (dict(world_size=2.5), "whole number"),
    (dict(world_size="4"), "whole number"),
    (dict(world_size=True), "whole number"),
    (dict(world_size=2, backend="mpi"), "backend must be one of"),
    (dict(world_size=2, timeout=0), "timeout must be a positive"),
    (dict(world_size=2, threads=0), "threads"),
    (dict(world_size=2, fn=42), "needs a function"),
    (dict(world_size=None, backend="nccl"), "nccl needs one GPU per rank"),
    (dict(world_size=2, args=(__import__("threading").Lock(),)), "cannot be sent to the ranks"),
])
def test_bad_arguments_are_refused_before_any_process_starts(monkeypatch, kwargs, words):
    if kwargs.get("backend") == "nccl":
        kwargs["world_size"] = launcher.gpu_count() + 1
    started = []
    monkeypatch.setattr(forkserver, "server", lambda: started.append(1))
    fn = kwargs.pop("fn", lambda rank, world_size: None)
    with pytest.raises(ValueError, match=words):
        spawn(fn, **kwargs)
    assert started == []


# ---------------------------------------------------------------------------- how ranks start

def test_ranks_are_forks_of_a_server_that_imported_torch_not_of_the_caller():
    def fn(rank, world_size):
        return os.getppid(), torch.cuda.is_initialized()

    out = spawn(fn, 2)
    server = forkserver.server_pid()
    assert server is not None and server != os.getpid()
    assert all(ppid == server for ppid, _ in out)
    assert not any(cuda for _, cuda in out)
    if sys.platform.startswith("linux"):
        cmdline = open(f"/proc/{server}/cmdline").read().split("\0")
        assert "helpers._worker" in cmdline  # a freshly executed Python, not a fork of this one
        assert "libtorch" in open(f"/proc/{server}/maps").read()  # torch was imported before forking


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (on a CPU machine every other "
                    "test here runs the gloo path)")
def test_on_gpus_auto_means_nccl_one_gpu_per_rank_and_values_come_back_on_the_cpu(capsys):
    def fn(rank, world_size):
        from helpers.spawn import device

        x = torch.full((4,), rank + 1.0, device=device())
        dist.all_reduce(x)
        dist.barrier()
        return x, dist.get_backend(), x.device.type, torch.cuda.current_device()

    k = torch.cuda.device_count()
    out = spawn(fn, k)
    for rank, (x, backend, where, gpu) in enumerate(out):
        assert (backend, where, gpu, x.device.type) == ("nccl", "cuda", rank, "cpu")
        assert torch.equal(x, torch.full((4,), k * (k + 1) / 2))
    # init_process_group was told each rank's GPU (device_id), so barrier() has nothing to guess or warn
    assert "under current context" not in capsys.readouterr().out


def test_ranks_inherit_the_heavy_torch_modules_instead_of_importing_them():
    from helpers._worker import PRELOAD

    def fn(rank, world_size):
        return sorted(sys.modules)

    (modules,) = spawn(fn, 1)
    assert set(PRELOAD) <= set(modules)  # fn itself imports nothing: the fork brought them


def test_one_thread_per_rank_by_default_and_more_on_request():
    threads = lambda rank, world_size: (torch.get_num_threads(), os.environ["OMP_NUM_THREADS"])  # noqa: E731
    assert spawn(threads, 2) == [(1, "1")] * 2
    assert spawn(threads, 2, threads=2) == [(2, "2")] * 2


def test_ranks_get_the_usual_environment_and_meet_without_a_port():
    def fn(rank, world_size):
        keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "HELPERS_SPAWN_STORE")
        return {k: os.environ[k] for k in keys}, "MASTER_PORT" in os.environ

    (a, port_a), (b, port_b) = spawn(fn, 2)
    assert (a["RANK"], b["RANK"], a["WORLD_SIZE"]) == ("0", "1", "2")
    assert a["HELPERS_SPAWN_STORE"] == b["HELPERS_SPAWN_STORE"]  # one file store per launch
    assert not os.path.exists(a["HELPERS_SPAWN_STORE"])  # removed afterwards
    assert not (port_a or port_b)  # nothing listens on a port for the rendezvous
    (c, _), _ = spawn(fn, 2)
    assert c["HELPERS_SPAWN_STORE"] != a["HELPERS_SPAWN_STORE"]


def test_many_launches_in_a_row_all_succeed():
    def fn(rank, world_size):
        dist.barrier()
        return rank

    for _ in range(40):
        assert spawn(fn, 4) == [0, 1, 2, 3]


def _signals_as_new():
    # A child inherits ignored signals and the blocked-signal mask: late in a long pytest run the
    # interrupt test's caller did not react to SIGINT. Start every script as a shell would.
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_script(code, *args, stdout=subprocess.PIPE, **kw):
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], cwd=ROOT,
                            stdout=stdout, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_signals_as_new, **kw)


def test_two_processes_launching_at_once_do_not_collide():
    code = """
        from helpers.spawn import spawn, warm_up
        warm_up()  # as the lectures do: the fork server imports torch while this process does
        import torch, torch.distributed as dist
        def fn(rank, world_size):
            t = torch.ones(1000)
            dist.all_reduce(t)
            return t[0].item()
        for _ in range(8):
            assert spawn(fn, 2) == [2.0, 2.0]
        print("all good")
    """
    procs = [run_script(code) for _ in range(2)]
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0 and "all good" in out, out


def test_interrupting_the_caller_ends_every_rank(tmp_path):
    code = """
        import sys, time, os
        from helpers.spawn import spawn
        def fn(rank, world_size, folder):
            open(os.path.join(folder, f"{rank}.pid"), "w").write(str(os.getpid()))
            time.sleep(120)
        try:
            spawn(fn, 3, args=(sys.argv[1],))
        except KeyboardInterrupt:
            print("interrupted")
    """
    # The caller's output goes to a file, and the test waits for the caller itself, not for its stdout
    # to close: the fork server the caller started shares that stdout and leaves about a second later.
    with open(tmp_path / "out.txt", "w") as out_file:
        p = run_script(code, str(tmp_path), stdout=out_file)
    pids = read_pids(tmp_path, 3)
    p.send_signal(signal.SIGINT)
    p.wait(timeout=30)
    out = (tmp_path / "out.txt").read_text()
    assert "interrupted" in out, out
    assert wait_gone(pids)


def test_a_caller_that_is_killed_takes_its_ranks_with_it(tmp_path):
    code = """
        import sys, time, os
        from helpers.spawn import spawn
        def fn(rank, world_size, folder):
            open(os.path.join(folder, f"{rank}.pid"), "w").write(str(os.getpid()))
            time.sleep(120)
        spawn(fn, 2, args=(sys.argv[1],))
    """
    p = run_script(code, str(tmp_path))
    pids = read_pids(tmp_path, 2)
    p.kill()
    p.wait()
    assert wait_gone(pids)


# ----------------------------------------------------------------------------------- torchrun

def test_under_torchrun_it_joins_the_group_and_runs_in_place(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        import torch.distributed as dist
        from helpers.spawn import spawn
        def fn(rank, world_size):
            return rank, world_size, dist.get_backend(), os.getpid()
        out = spawn(fn, 2)
        with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".txt"), "w") as f:
            f.write(repr((os.getpid(), out)))
    """))
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", str(script), str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    for rank in (0, 1):
        pid, values = eval((tmp_path / f"{rank}.txt").read_text())  # noqa: S307 - our own repr
        assert [v[:3] for v in values] == [(0, 2, "gloo"), (1, 2, "gloo")]
        assert values[rank][3] == pid  # fn ran in the torchrun worker itself


# ----------------------------------------------------------------------------- a Jupyter kernel

@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """One Jupyter kernel for the tests below, as one notebook's cells share theirs (a kernel and its
    fork server cost 4-5 s to start); each test writes its pid files to its own folder."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", cwd=str(tmp_path_factory.mktemp("kernel")))
    try:
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def run_in_a_kernel(kernel, *cells):
    """Execute the cells in the kernel, as a notebook runs them; the text each printed."""
    _, kc = kernel
    texts = []
    for src in cells:
        out = []
        reply = kc.execute_interactive(textwrap.dedent(src), timeout=120, output_hook=lambda msg: out.append(
            msg["content"]["text"]) if msg["msg_type"] == "stream" else None)
        assert reply["content"]["status"] == "ok", reply["content"]
        texts.append("".join(out))
    return texts


def test_a_function_defined_in_a_notebook_cell_runs_in_a_real_kernel(kernel):
    out = run_in_a_kernel(kernel,
        """
        from helpers.spawn import spawn, warm_up, SpawnError
        warm_up()
        import torch, torch.distributed as dist
        OFFSET = 10.0
        def helper(x):
            return x + OFFSET
        """,
        """
        from dataclasses import dataclass
        @dataclass
        class Point:
            rank: int
            total: float
        def fn(rank, world_size, x):
            t = torch.tensor([helper(float(rank))])
            dist.all_reduce(t)
            print(f"sum is {t.item()}")
            return Point(rank, t.item() * x)
        values = spawn(fn, 2, args=(3.0,))
        assert [(p.rank, p.total) for p in values] == [(0, 63.0), (1, 63.0)], values
        print("values", [p.total for p in values])
        """,
        """
        def broken(rank, world_size):
            raise KeyError("missing on purpose")
        try:
            spawn(broken, 2)
        except SpawnError as e:
            print(e)
        """,
    )
    assert out[1].splitlines() == ["[rank 0] sum is 21.0", "[rank 1] sum is 21.0", "values [63.0, 63.0]"]
    assert "rank 0 of 2 raised KeyError" in out[2] and 'raise KeyError("missing on purpose")' in out[2]


def test_a_hang_in_a_real_kernel_shows_the_line_of_the_cell_where_a_rank_waits(kernel, tmp_path):
    out = run_in_a_kernel(kernel,
        "from helpers.spawn import spawn, warm_up, SpawnTimeout; warm_up()",
        f"""
        import os, torch, torch.distributed as dist
        def skips_a_collective(rank, world_size):
            open(os.path.join({str(tmp_path)!r}, f"{{rank}}.pid"), "w").write(str(os.getpid()))
            t = torch.ones(1)
            if rank == 0:
                dist.all_reduce(t)  # rank 1 never joins
        try:
            spawn(skips_a_collective, 2, timeout=3)
        except SpawnTimeout as e:
            print(e)
        """,
    )
    assert "Rank 0 was waiting in (most recent call last):\n" in out[1], out[1]
    assert re.search(r'File ".*ipykernel.*", line \d+, in skips_a_collective\n'
                     r'    dist.all_reduce\(t\)  # rank 1 never joins\n', out[1]), out[1]
    assert "Rank 1" not in out[1]
    assert wait_gone(read_pids(tmp_path, 2))


def test_interrupting_the_kernel_ends_every_rank(kernel, tmp_path):
    km, kc = kernel
    run_in_a_kernel(kernel, "from helpers.spawn import spawn, warm_up; warm_up()")
    code = textwrap.dedent(f"""
        import os, time
        def fn(rank, world_size):
            open(os.path.join({str(tmp_path)!r}, f"{{rank}}.pid"), "w").write(str(os.getpid()))
            time.sleep(120)
        spawn(fn, 3)
    """)
    msg_id = kc.execute(code)
    pids = read_pids(tmp_path, 3)
    km.interrupt_kernel()
    while True:
        reply = kc.get_shell_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    assert wait_gone(pids)
