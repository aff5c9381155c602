"""Every lecture executed headless, as CI and instructors run them, and the notebook conventions."""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# Lectures whose issue asks for more than the default world size in CI.
EXTRA_RUNS = {"01_collectives.ipynb": [{"WORLD_SIZE": 2}, {"WORLD_SIZE": 3}],
              "11_sequence_context_parallel.ipynb": [{"WORLD_SIZE": 2}, {"WORLD_SIZE": 3}],
              "12_expert_parallel.ipynb": [{"WORLD_SIZE": 2}, {"WORLD_SIZE": 3}]}
# Lectures that assert no timing (counts, values, a barrier's order, hangs, simulations): `make test`
# runs them in its first phase beside other untimed tests, marked untimed, or beside (the stream of
# tests that mostly wait) where the lecture mostly waits too; every other lecture times something and
# runs alone in the second phase (the Makefile).
UNTIMED = {"10": "bytes counted, values in float64 and fp16/bf16",
           "11": "bytes and flops counted, values", "12": "values and split matrices counted",
           "13": "values and bytes counted per mesh dimension",
           "16": "values after a restart; Young's interval simulated with the measured cost C as its input"}
WAITING = {"01": "values, a barrier's order (a lower bound), and two hangs it waits for"}
# Extra runs of untimed lectures that run in the beside stream instead, to even out `make test`'s
# first phase (the stream of untimed lectures took 303 s there, the beside stream 243 s).
BALANCED = {"12_expert_parallel.ipynb-WORLD_SIZE=3"}
CELL_TIMEOUT_S = 300  # a cell that hangs fails the run (and names itself) instead of stalling CI


def cells(path):
    return json.loads(path.read_text())["cells"]


def parameters_cell(path):
    for cell in cells(path):
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            return "".join(cell["source"])
    return None


def runs():
    out = []
    for path in NOTEBOOKS:
        marks = [pytest.mark.untimed] if path.name[:2] in UNTIMED else \
            [pytest.mark.beside] if path.name[:2] in WAITING else []
        out.append(pytest.param(path, {}, id=path.name, marks=marks))
        for extra in EXTRA_RUNS.get(path.name, []):
            name = "-".join(f"{k}={v}" for k, v in extra.items())
            run = f"{path.name}-{name}"
            out.append(pytest.param(path, extra, id=run,
                                    marks=marks + [pytest.mark.beside] * (run in BALANCED)))
    return out


def test_there_are_lectures():
    assert NOTEBOOKS, "notebooks/ holds no lecture"


@pytest.mark.parametrize("path, extra", runs())
def test_notebook_executes_headless(path, extra, tmp_path, executed_dir):
    import papermill

    from helpers.site import headless

    params = {"SMOKE": True, **extra}
    if re.search(r"^CHECK_SOLUTIONS\s*=", parameters_cell(path) or "", re.M):
        params["CHECK_SOLUTIONS"] = True
    out = (tmp_path if extra else executed_dir) / path.name
    if not extra and out.exists() and "JupyterLab" in json.loads(out.read_text())["metadata"].get("executed_in", ""):
        # tests/test_lab.py ran this lecture in this session with these parameters, top to bottom in
        # JupyterLab, and kept its run here: checked, not executed a second time
        ran = [c for c in json.loads(out.read_text())["cells"]
               if c["cell_type"] == "code" and "".join(c["source"]).strip()]
        errors = [o.get("ename") for c in ran for o in c.get("outputs", []) if o["output_type"] == "error"]
        assert ran and all(c["execution_count"] for c in ran) and not errors, (path.name, errors)
        assert_no_quoted_figures(out)
        return
    try:
        # helpers.site.headless: papermill, with the fix of the client's missed wake-ups (a widget lecture
        # could stall until the cell timeout); the notebook is written once, at the end, instead of
        # twice per cell (140 writes of a growing notebook cost lecture 01 3 s); a failure is reported
        # below from papermill's error, which carries the cell and its traceback.
        headless.execute(path, out, params, timeout=CELL_TIMEOUT_S)
    except papermill.PapermillExecutionError as e:
        source = "\n".join("    " + line for line in e.source.splitlines()[:12])
        tb = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(e.traceback[-12:]))
        pytest.fail(f"{path.name} with {params}: code cell {e.exec_count} (cell index {e.cell_index}) "
                    f"failed with {e.ename}: {e.evalue}\n\nThe cell begins:\n{source}\n\n{tb}",
                    pytrace=False)
    if not extra:
        assert_no_quoted_figures(out)


def assert_no_quoted_figures(executed):
    """CONTRIBUTING.md's rule: no markdown figure repeats a number the lecture prints
    (helpers.site.quoted; a cited constant or a chosen size is allowed there, with its reason)."""
    from helpers.site import quoted
    found = quoted.flagged(json.loads(executed.read_text()), executed.name[:2])
    assert not found, (f"{executed.name}: markdown repeats printed figures (executed cell index, "
                       f"figures): {found}; state the asserted bound or let the output show it")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_clean(path):
    dirty = [i for i, c in enumerate(cells(path)) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, (f"{path.name}: cells {dirty} carry outputs or execution counts; clear them "
                       "(Edit > Clear Outputs of All Cells in JupyterLab) before committing")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_follows_the_conventions(path):
    assert re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", path.name), "file names are NN_topic.ipynb"
    first = cells(path)[0]
    assert first["cell_type"] == "markdown"
    assert "".join(first["source"]).startswith(f"# Lecture {path.name[:2]}:"), \
        "the first cell is the title: '# Lecture NN: ...'"
    params = parameters_cell(path)
    assert params is not None, "one code cell is tagged 'parameters'"
    for knob in ("WORLD_SIZE", "SMOKE"):
        assert re.search(rf"^{knob}\s*=", params, re.M), f"the parameters cell sets {knob}"
    nb = json.loads(path.read_text())
    assert nb["metadata"].get("kernelspec", {}).get("name") == "python3", "the kernel is the environment's python3"
    assert (nb["nbformat"], nb["nbformat_minor"]) >= (4, 5) and all("id" in c for c in nb["cells"]), \
        "nbformat 4.5 with cell ids, as JupyterLab saves it (so a save in Lab changes no more than the edit)"
