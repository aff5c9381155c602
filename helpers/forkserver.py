"""The ranks' processes for helpers/spawn.py: the fork server that makes them (helpers/_worker.py
imports torch once; each rank is a fork of it), the temporary folder of their stores and output
files, the loopback interface gloo binds to, the payload sent to them by value, and whether a rank
is alive or its whole process group killed."""
import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is as good as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


_SERVER = None  # (Popen, control socket)
_TMPDIR = None


def server():
    global _SERVER
    if _SERVER is not None and _SERVER[0].poll() is None:
        return _SERVER
    if sys.platform == "win32":
        raise OSError("helpers.spawn forks its ranks and needs Linux or macOS (on Windows, use WSL).")
    mine, theirs = socket.socketpair()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "helpers._worker", str(theirs.fileno())],
                            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env,
                            start_new_session=True, cwd=root)
    theirs.close()
    _SERVER = (proc, mine)
    return _SERVER


def server_pid():
    """The fork server's pid, or None when none is running (for tests and the curious)."""
    return _SERVER[0].pid if _SERVER is not None and _SERVER[0].poll() is None else None


def send_to_server(sock):
    for attempt in range(2):
        proc, ctl = server()
        try:
            socket.send_fds(ctl, [b"r"], [sock.fileno()])
            sock.close()
            return
        except OSError:
            if attempt:
                raise
            proc.kill()  # a server that died or broke its socket is replaced once
            proc.wait()


def tmpdir():
    global _TMPDIR
    if _TMPDIR is None:
        _TMPDIR = tempfile.mkdtemp(prefix="spawn-")
        atexit.register(shutil.rmtree, _TMPDIR, True)
    return _TMPDIR


def loopback_interface():
    names = [name for _, name in socket.if_nameindex()]
    return next((n for n in ("lo", "lo0") if n in names), names[0] if names else "lo")


def dumps_by_value(obj):
    import cloudpickle

    try:
        return cloudpickle.dumps(obj)
    except Exception as e:
        raise ValueError(f"the function or its args cannot be sent to the ranks ({e}). Pass "
                         "tensors, numbers and plain data; create anything else inside fn.") from e
