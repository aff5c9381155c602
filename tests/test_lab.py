"""The student's way in: `make lab`, a lecture opened in JupyterLab in a browser, run top to bottom.

JupyterLab is started as `make lab` starts it (in notebooks/, with this environment's `jupyter`), with
empty temporary Jupyter and IPython directories so that nothing of the user's leaks in, autosave off
so that the lectures on disk stay without outputs, and `expose_app_in_browser` so that the page has
`window.jupyterapp`. Headless Chromium opens the lecture, offline but for this server, and is driven
over the Chrome DevTools Protocol (the `websocket-client` package that jupyter_server depends on).
Lab's own command `notebook:run-all-cells` runs each lecture in turn, as a new student does; then
the test checks that

- the kernel is this environment's Python (the project kernel, not some other `python3`);
- no cell failed: no error output, no traceback on stderr, every code cell ran;
- every figure rendered (each PNG output has an <img> in its output area that decoded, naturalWidth > 0);
- in a lecture with an interactive figure (`widgets.interact`), the widget view rendered (a slider,
  not "Loading widget..." or an error), and moving the slider with the keyboard, as a student would,
  redraws the figure beside it.

The lectures that run here are those with outputs Lab draws itself, where papermill only records
them: every lecture with ipywidgets (an interact, the planner's controls: each is its own code, and
its slider is moved), and, if those do not already show them, one lecture with a progress line
(helpers.progress, which helpers.bench's sweep uses: a display updated in place) and one with a
display update. Today that is 02 (widgets, a progress line) and 14 (widgets, a display update).
Every lecture runs headless in tests/test_notebooks.py, and for the others Lab's kernel, streams
and figures work as they do here; running more of them twice would put `make test` past its 10
minutes (issue 20).
`make test LAB=all` (the environment variable) runs every lecture here.

The lectures run as CI runs them headless (SMOKE = True, CHECK_SOLUTIONS = True, their own
WORLD_SIZE), set by editing the text of the parameters cell in Lab's notebook model before running.
Lab's run is then that lecture's run in `make test`: the executed notebook, read from Lab's model with
the widgets' state (the widget manager's `saveState`, as a save in Lab writes it), goes where
tests/test_notebooks.py keeps the lectures it executes (the `executed_dir` fixture), and that test
checks it instead of executing the lecture a second time (tests/test_site.py renders it).
Without a Chromium the test skips and says why, as tests/test_site.py does.
"""
import contextlib
import functools
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
import websocket

ROOT = Path(__file__).resolve().parents[1]
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
         "--disable-background-networking", "--disable-component-update", "--disable-dev-shm-usage",
         "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "--window-size=1400,1000"]
LECTURES = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
LAB_DRAWS = {"widgets": r"ipywidgets", "progress bars": r"\btqdm\b|bench\.sweep\(", "display updates": r"display\("}


@functools.cache
def code(name):
    return "\n".join("".join(c["source"]) for c in json.loads((ROOT / "notebooks" / name).read_text())["cells"]
                     if c["cell_type"] == "code")


def shows(name, kind):
    """Whether lecture `name`'s code draws this kind of output (a key of LAB_DRAWS)."""
    return re.search(LAB_DRAWS[kind], code(name)) is not None


def lab_lectures():
    """The lectures run in Lab: every one with widgets, and one for each other kind of output Lab draws
    itself that those do not show already (LAB=all: every lecture)."""
    if os.environ.get("LAB") == "all":
        return LECTURES
    chosen = [name for name in LECTURES if shows(name, "widgets")]
    for kind in LAB_DRAWS:
        if not any(shows(name, kind) for name in chosen):
            chosen += [name for name in LECTURES if shows(name, kind)][:1]
    return sorted(chosen)


WIDGET_CODE = "widgets.interact("  # a cell with this draws an interactive figure
RUN_TIMEOUT_S = 240
LAB_RUN = "JupyterLab (tests/test_lab.py)"   # the mark of a lecture run here, in its metadata


def stop(proc):
    """End proc, everything it started (Jupyter's kernels, their ranks) and its process group."""
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    proc.send_signal(signal.SIGTERM)  # Jupyter shuts its kernels down on SIGTERM
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        pass
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def wait_for(check, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on notebooks/ as `make lab` starts it, on a free port: its base URL."""
    home = tmp_path_factory.mktemp("jupyter")
    user = home / "config/lab/user-settings"
    for plugin, setting in (("@jupyterlab/docmanager-extension", '{"autosave": false}'),
                            ("@jupyter-widgets/jupyterlab-manager", '{"saveState": true}')):
        (user / plugin).mkdir(parents=True)
        (user / plugin / "plugin.jupyterlab-settings").write_text(setting)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_DATA_DIR=str(home / "data"),
               JUPYTER_RUNTIME_DIR=str(home / "runtime"), IPYTHONDIR=str(home / "ipython"))
    token = secrets.token_hex(16)
    cmd = [str(Path(sys.executable).with_name("jupyter")), "lab", "--no-browser", "--port=0",
           f"--IdentityProvider.token={token}", "--LabApp.expose_app_in_browser=True"]
    if os.getuid() == 0:
        cmd.append("--allow-root")
    log = open(home / "lab.log", "w")
    proc = subprocess.Popen(cmd, cwd=ROOT / "notebooks", env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        info = home / "runtime" / f"jpserver-{proc.pid}.json"
        wait_for(lambda: info.exists() or proc.poll() is not None, 60, "JupyterLab to start")
        assert proc.poll() is None, "JupyterLab exited:\n" + (home / "lab.log").read_text()[-3000:]
        time.sleep(0.5)  # the info file is written just after the server listens
        yield {"url": f"http://127.0.0.1:{json.loads(info.read_text())['port']}", "token": token}
    finally:
        stop(proc)
        log.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless Chromium with its DevTools endpoint on a free port: that endpoint's URL."""
    exe = os.environ.get("CHROMIUM") or next(filter(None, map(shutil.which, BROWSERS)), None)
    if not exe:
        pytest.skip("no Chromium to drive JupyterLab with (looked for " + ", ".join(BROWSERS) + "); "
                    "install Debian's chromium package as .ci/run does: apt-get install chromium")
    profile = tmp_path_factory.mktemp("chromium")
    proc = subprocess.Popen([exe, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
                             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        port_file = profile / "DevToolsActivePort"  # Chromium writes the port it picked here
        wait_for(lambda: port_file.exists() and port_file.read_text().strip(), 60, "Chromium to start")
        yield f"http://127.0.0.1:{port_file.read_text().split()[0]}"
    finally:
        stop(proc)


class Tab:
    """A browser tab, driven over the DevTools protocol: js() evaluates an expression in the page."""

    def __init__(self, devtools, url):
        request = urllib.request.Request(f"{devtools}/json/new?about:blank", method="PUT")
        self.target = json.load(urllib.request.urlopen(request, timeout=30))
        self.devtools = devtools
        self.ws = websocket.create_connection(self.target["webSocketDebuggerUrl"], timeout=120,
                                              suppress_origin=True)
        self.calls = 0
        self.send("Page.navigate", url=url)

    def send(self, method, **params):
        self.calls += 1
        self.ws.send(json.dumps({"id": self.calls, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.calls:
                assert "error" not in reply, f"{method}: {reply['error']}"
                return reply["result"]

    def js(self, expression):
        result = self.send("Runtime.evaluate", expression=expression, awaitPromise=True,
                           returnByValue=True)
        assert "exceptionDetails" not in result, f"in the page: {result['exceptionDetails']}\n{expression}"
        return result["result"].get("value")

    def key(self, key, code):
        for kind in ("keyDown", "keyUp"):
            self.send("Input.dispatchKeyEvent", type=kind, key=key, code=code, windowsVirtualKeyCode=39)

    def close(self):
        self.ws.close()
        urllib.request.urlopen(f"{self.devtools}/json/close/{self.target['id']}", timeout=30).read()


def panel(name):
    """In the page: the notebook panel (NotebookPanel) of notebooks/name, or undefined."""
    return (f"(window.jupyterapp && Array.from(jupyterapp.shell.widgets('main'))"
            f".find(w => w.context && w.context.path === {json.dumps(name)}))")


def kernel_idle(name):
    return f"((p) => !!p && p.sessionContext.session?.kernel?.status === 'idle')({panel(name)})"


# In the page: each code cell's outputs as saved, and what its output area shows.
REPORT = """%s.content.widgets.filter(c => c.model.type === 'code').map(c => ({
    source: c.model.sharedModel.getSource(), count: c.model.executionCount,
    outputs: c.model.outputs.toJSON(), text: c.node.querySelector('.jp-OutputArea').innerText,
    images: Array.from(c.node.querySelectorAll('.jp-OutputArea img')).map(i => i.naturalWidth),
    sliders: c.node.querySelectorAll('.jupyter-widgets.widget-slider .noUi-handle').length}))"""


@contextlib.contextmanager
def opened(lab, browser, name):
    """notebooks/name open in Lab in a new tab, its kernel started; afterwards shut down, closed."""
    tab = Tab(browser, f"{lab['url']}/lab/tree/{name}?reset&token={lab['token']}")
    try:
        wait_for(lambda: tab.js(kernel_idle(name)), 120, f"{name} to open in JupyterLab with a kernel")
        yield tab
    finally:
        tab.js(f"""(async (p) => {{ if (!p) return;
                   p.context.model.dirty = false;  // leave without the unsaved-changes question
                   await p.sessionContext.shutdown(); }})({panel(name)})""")
        tab.close()


def run_all(tab, name, timeout=RUN_TIMEOUT_S):
    """Run every cell of the open lecture with Lab's own command, with the parameters CI gives it
    headless (SMOKE and CHECK_SOLUTIONS on, its own WORLD_SIZE); the per-code-cell report."""
    assert tab.js(f"""(() => {{
      const cell = {panel(name)}.content.widgets.find(c => (c.model.getMetadata('tags') || []).includes('parameters'));
      const text = cell.model.sharedModel.getSource();
      const ci = text.replace(/^SMOKE = False/m, 'SMOKE = True').replace(/^CHECK_SOLUTIONS = False/m, 'CHECK_SOLUTIONS = True');
      cell.model.sharedModel.setSource(ci);
      return /^SMOKE = True/m.test(ci) && ci !== text; }})()"""), f"{name}: no `SMOKE = False` to set"
    tab.js("""window.ranAll = null; jupyterapp.commands.execute('notebook:run-all-cells')
              .then(ok => { window.ranAll = 'done'; }, e => { window.ranAll = String(e); })""")
    wait_for(lambda: tab.js(f"window.ranAll !== null && {kernel_idle(name)}"), timeout,
             f"{name} to run to the end")
    assert tab.js("window.ranAll") == "done", f"notebook:run-all-cells failed: {tab.js('window.ranAll')}"
    return tab.js(REPORT % panel(name))


def executed(tab, name):
    """The lecture as it ran in Lab, as a notebook (nbformat's JSON), with the widgets' state that a
    save in Lab writes (the widget manager answers the save's "started" signal, saveState on)."""
    nb = json.loads(tab.js(f"""((p) => {{ p.context.saveState.emit('started');
                               return JSON.stringify(p.context.model.toJSON()); }})({panel(name)})"""))
    nb["metadata"]["executed_in"] = LAB_RUN
    return nb


def failures(cells):
    """What went wrong in the cells of a report: errors, tracebacks on stderr, cells that did not run."""
    found = []
    for i, cell in enumerate(cells):
        where = f"code cell {i} ({cell['source'][:60]!r})"
        for out in cell["outputs"]:
            if out["output_type"] == "error":
                found.append(f"{where}: {out['ename']}: {out['evalue']}")
            elif out.get("name") == "stderr" and "Traceback" in "".join(out["text"]):
                found.append(f"{where}: a traceback on stderr:\n{''.join(out['text'])[-1500:]}")
        if cell["source"].strip() and cell["count"] is None:
            found.append(f"{where} did not run")
        if any(width == 0 for width in cell["images"]):
            found.append(f"{where}: an image that did not render")
    return found


def test_every_lecture_is_found_and_those_that_draw_widgets_run_here():
    assert len(LECTURES) >= 9, f"tests/test_lab.py finds only {LECTURES} in notebooks/"
    widgets = [n for n in LECTURES if WIDGET_CODE in (ROOT / "notebooks" / n).read_text()]
    assert widgets and set(widgets) <= set(lab_lectures()), f"the lectures with an interact ({widgets}) run in Lab"
    for kind in LAB_DRAWS:
        if any(shows(n, kind) for n in LECTURES):
            assert any(shows(n, kind) for n in lab_lectures()), f"no lecture run in Lab shows {kind}"


@pytest.mark.parametrize("name", lab_lectures(), ids=lambda n: n[:2])
def test_lecture_runs_in_lab(browser, lab, name, executed_dir):  # browser first: without one it skips
    with opened(lab, browser, name) as tab:
        cells = run_all(tab, name)
        assert not failures(cells), f"{name} in JupyterLab:\n" + "\n".join(failures(cells))
        nb = executed(tab, name)            # before a slider moves: the state the outputs show
        assert nb["metadata"].get("widgets") or not shows(name, "widgets"), f"{name}: no widget state"
        for i, cell in enumerate(cells):
            pngs = sum("image/png" in out.get("data", {}) for out in cell["outputs"])
            assert len(cell["images"]) >= pngs, \
                f"{name}, code cell {i}: {pngs} figures in its outputs, {len(cell['images'])} drawn"

        prefix = tab.js(f"""(async () => {{
          const future = {panel(name)}.sessionContext.session.kernel.requestExecute({{code: 'import sys; print(sys.prefix)'}});
          let text = '';
          future.onIOPub = msg => {{ if (msg.header.msg_type === 'stream') text += msg.content.text; }};
          await future.done;
          return text.trim(); }})()""")
        assert Path(prefix).resolve() == Path(sys.prefix).resolve(), \
            f"the notebook's kernel runs in {prefix}, not in this project's environment {sys.prefix}"

        for i, cell in enumerate(cells):
            if WIDGET_CODE in cell["source"]:
                check_widget(tab, name, i, cell)
    (executed_dir / name).write_text(json.dumps(nb))  # the lecture's run (tests/test_notebooks.py)


def check_widget(tab, name, i, cell):
    """The interact of code cell i shows a slider and a figure, and moving the slider redraws it."""
    shown = cell["text"]
    assert cell["sliders"] and "Loading widget" not in shown and "Error displaying" not in shown, \
        f"the widget of {name}, code cell {i}, did not render; its output reads {shown!r}"
    node = f"{panel(name)}.content.widgets.filter(c => c.model.type === 'code')[{i}].node"
    figure = f"(({node}).querySelector('.widget-output img') || {{}}).src"
    before = tab.js(figure)
    assert before, f"the interactive figure of {name}, code cell {i}, is missing"
    tab.js(f"(h => {{ h.scrollIntoView(); h.focus(); }})(({node}).querySelector('.widget-slider .noUi-handle'))")
    tab.key("ArrowRight", "ArrowRight")  # as a student moves a focused slider
    wait_for(lambda: tab.js(f"!!({figure}) && ({figure}) !== {json.dumps(before)}"), 30,
             f"the figure of {name}, code cell {i}, to change when its slider moved")
