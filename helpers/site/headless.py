"""Running a lecture headless, as CI (tests/test_notebooks.py), `make html` (helpers.site) and
bench/series.py do: papermill, with one fix in the client beneath it, and the kernel reached over
unix sockets instead of TCP ports (_ipc_kernel_manager says why).

The fix. A lecture with an ipywidgets `interact` (lecture 02's ring, stepped by a slider) sometimes
stalled headless under load: the kernel idle, the notebook client waiting until the cell's timeout.
Caught in the act (py-spy and gdb on the client, 2026-11-25): nbclient's task for the cell waited in
`shell_channel.get_msg(timeout)`, an asyncio poll of the shell socket, while that socket already held
the kernel's execute_reply (zmq's EVENTS read POLLIN) and the event loop slept with no wake-up due.
zmq signals a socket's readiness through a file descriptor that fires on an edge, and the edge was
lost: nbclient's stand-in for the Output widget that `interact` draws into writes to the same shell
socket (a synchronous send, in the middle of the iopub handling) while the poll is pending
(jupyter/nbclient#312 reports the same stall). Any later wake-up of the loop let it go on.

The cure here does not depend on which send lost which edge: jupyter_client's asyncio get_msg polls in
slices of at most SLICE_S, and every new poll first asks the socket for its events, so a message whose
wake-up was lost is read within SLICE_S instead of never. A message that arrives normally is read as
soon as it arrives, as before.
"""
import time

SLICE_S = 0.5
UNPATCHED = {}   # jupyter_client's own get_msg, kept for the tests' negative control


def _patch_client():
    """jupyter_client's asyncio channels poll in slices (idempotent)."""
    from queue import Empty

    from jupyter_client.channels import AsyncZMQSocketChannel

    if getattr(AsyncZMQSocketChannel.get_msg, "sliced", False):
        return
    UNPATCHED["get_msg"] = AsyncZMQSocketChannel.get_msg

    async def get_msg(self, timeout=None):
        """A message if one is ready within `timeout` seconds (None: wait), polled in slices."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = SLICE_S if deadline is None else min(SLICE_S, deadline - time.monotonic())
            if await self.socket.poll(max(0, int(left * 1000))):
                return await self._recv()
            if deadline is not None and time.monotonic() >= deadline:
                raise Empty

    get_msg.sliced = True
    AsyncZMQSocketChannel.get_msg = get_msg


def _ipc_kernel_manager(folder):
    """jupyter_client's kernel manager reaching its kernel over unix sockets in a folder of its own,
    not TCP ports: over TCP the client picks five free ports and the kernel binds them a moment
    later, and a process beside it (a gloo store, torchrun's rendezvous: `make test` runs lectures
    beside those) can take one in between: the kernel died with "Address already in use" and the
    lecture failed after 60 s (bench/series.py's run of 2026-12-07). folder: where the sockets go."""
    import os

    from jupyter_client import AsyncKernelManager

    class IPCKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.transport = "ipc"
            self.ip = os.path.join(folder, "ipc")          # its sockets: folder/ipc-N

    return IPCKernelManager


def execute(src, dst, parameters=None, timeout=300, save_each_cell=False):
    """Run notebook `src` with papermill (its folder as working directory), writing `dst`; raises
    papermill's errors. `timeout`: seconds a cell may take before it fails."""
    import shutil
    import tempfile
    from pathlib import Path

    import papermill

    _patch_client()
    folder = tempfile.mkdtemp(prefix="kernel-")
    try:
        return papermill.execute_notebook(str(src), str(dst), parameters=parameters or {},
                                          cwd=str(Path(src).parent), kernel_name="python3",
                                          progress_bar=False, log_output=False,
                                          execution_timeout=timeout,
                                          request_save_on_cell_execute=save_each_cell,
                                          kernel_manager_class=_ipc_kernel_manager(folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
