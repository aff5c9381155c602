"""The lectures follow the same conventions: checked by reading the notebooks' JSON and the solutions.

Each lecture names the one before and after it; has the same parameters (WORLD_SIZE, SMOKE,
CHECK_SOLUTIONS, other knobs in UPPER_CASE, never reassigned by a later cell) and set-up (helpers
imported, plots.style(), the machine banner after validation); prints results with helpers.report;
ends with at least three exercises graded by checks.check, whose reference solutions live in
notebooks/solutions/NN_solutions.py, out of the student's notebook, and are asserted by the last cell
when CHECK_SOLUTIONS is True; tags one cell `key-figure` with a caption. The README's lecture table
lists the same lectures in order, and images/ holds what `make images` wrote from one executed run.
"""
import ast
import json
import re
from pathlib import Path

import pytest

from helpers.site import images

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))


def cells(path):
    return [(c["cell_type"], "".join(c["source"]), c["metadata"].get("tags", []))
            for c in json.loads(path.read_text())["cells"]]


def code(path):
    return "\n".join(src for kind, src, _ in cells(path) if kind == "code")


def exercises(path):
    """The cells from the '## ... Exercises' heading to the end."""
    all_cells = cells(path)
    start = [i for i, (kind, src, _) in enumerate(all_cells)
             if kind == "markdown" and re.search(r"^#+ .*Exercises", src, re.M)]
    assert start, f"{path.name}: no '## Exercises' heading"
    return all_cells[start[-1]:]


def functions(source):
    return {n.name: n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)}


def is_stub(fn):
    """A function left for the student: its body does nothing but return None."""
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return all(isinstance(s, ast.Return) and (s.value is None or
                                              (isinstance(s.value, ast.Constant) and s.value.value is None))
               for s in body)


by_name = pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)


def test_every_lecture_is_here():
    assert [p.name[:2] for p in NOTEBOOKS] == [f"{i:02d}" for i in range(17)]


@pytest.mark.parametrize("i", range(len(NOTEBOOKS)), ids=lambda i: NOTEBOOKS[i].name)
def test_first_cell_names_the_previous_and_next_lecture(i):
    kind, first, _ = cells(NOTEBOOKS[i])[0]
    named = set(re.findall(r"\d\d_[a-z0-9_]+\.ipynb", first))
    neighbours = {p.name for p in NOTEBOOKS[max(i - 1, 0):i + 2]} - {NOTEBOOKS[i].name}
    assert kind == "markdown" and named == neighbours, \
        f"the first cell names {sorted(named)}; it should name exactly {sorted(neighbours)}"
    assert re.search(r"Previous:\s", first) and re.search(r"Next:\s", first)
    linked = set(re.findall(r"\]\((\d\d_[a-z0-9_]+\.ipynb)\)", first))
    assert linked == neighbours, f"the neighbours are links (in Lab they open the notebook, on the site its page): {sorted(linked)}"


@by_name
def test_parameters_cell_has_the_common_names_in_upper_case(path):
    params = [src for kind, src, tags in cells(path) if "parameters" in tags]
    assert len(params) == 1, "exactly one cell is tagged 'parameters'"
    names = sorted(assigned_names(params[0]))
    assert {"WORLD_SIZE", "SMOKE", "CHECK_SOLUTIONS"} <= set(names)
    assert all(n.isupper() for n in names), f"knobs are UPPER_CASE: {names}"


@by_name
def test_papermill_reads_the_parameters_cell_without_a_warning(path, caplog):
    """papermill parses the parameters cell line by line (`papermill --help-notebook`, and every
    headless run) and warns 'Unable to parse line' at a line it cannot read, e.g. a comment holding
    '=' after a tuple assignment."""
    import papermill

    with caplog.at_level("WARNING", logger="papermill"):
        papermill.inspect_notebook(str(path))
    assert not caplog.records, [r.getMessage() for r in caplog.records]


def assigned_names(source):
    """Names a cell binds in the notebook's namespace (`X = ...`, `X, Y = ...`, `X += ...`, `for X in ...`)."""
    def bound(target):  # a name, or the names of a tuple/list target; not `x[i] = ...` or `x.a = ...`
        if isinstance(target, ast.Name):
            return {target.id}
        if isinstance(target, ast.Starred):
            return bound(target.value)
        if isinstance(target, (ast.Tuple, ast.List)):
            return set().union(*map(bound, target.elts))
        return set()

    out, todo = set(), list(ast.parse(source).body)
    while todo:  # the cell's statements, inside `if`/`for`/`with` too, but not inside functions or classes
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
        for target in filter(None, targets):
            out |= bound(target)
        todo += [child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt)]
    return out


@by_name
def test_no_cell_overrides_a_knob(path):
    """A knob keeps the value the student (or papermill) gave it; SMOKE's smaller sizes and other derived
    values get names of their own (lower case), so no cell silently undoes a parameter."""
    all_cells = cells(path)
    params = next(i for i, (_, _, tags) in enumerate(all_cells) if "parameters" in tags)
    knobs = assigned_names(all_cells[params][1])
    for i, (kind, src, _) in enumerate(all_cells[params + 1:], params + 1):
        if kind == "code":
            assert not knobs & assigned_names(src), \
                f"cell {i} assigns the knob(s) {sorted(knobs & assigned_names(src))}; give the derived value its own name"


@by_name
def test_same_setup_style_banner_and_reporting(path):
    source = code(path)
    imported = re.search(r"^from helpers import (.+)$", source, re.M)
    assert imported and {"checks", "machine", "plots", "report"} <= set(imported[1].replace(" ", "").split(","))
    assert re.search(r"^from helpers\.spawn import .*\bspawn\b", source, re.M)
    assert "plots.style()" in source
    all_cells = cells(path)
    params = next(i for i, (_, _, tags) in enumerate(all_cells) if "parameters" in tags)
    validation = all_cells[params + 1][1]
    assert "checks." in validation and "print(machine.banner(" in validation, \
        "the cell after the parameters validates them with helpers.checks, then prints machine.banner(...)"
    assert "report.table(" in source or "report.by_rank(" in source


@by_name
def test_at_least_three_exercises_each_graded_by_checks_check(path):
    section = exercises(path)
    text = "\n".join(src for kind, src, _ in section if kind == "markdown")
    assert len(set(re.findall(r"\*\*Exercise (\d+)", text))) >= 3
    assert sum(src.count("checks.check(") for kind, src, _ in section if kind == "code") >= 3


@by_name
def test_solutions_live_apart_and_the_last_cell_asserts_them(path):
    nn = path.name[:2]
    solutions = NOTEBOOK_DIR / "solutions" / f"{nn}_solutions.py"
    assert solutions.exists(), f"{solutions} is missing"
    kind, last, _ = cells(path)[-1]
    assert kind == "code" and re.search(r"^if CHECK_SOLUTIONS:", last, re.M), "the last cell grades the solutions"
    assert f'import_module("solutions.{nn}_solutions")' in last and "assert " in last
    in_notebook = functions(code(path))
    for name in functions(solutions.read_text()):
        if name in in_notebook:
            assert is_stub(in_notebook[name]), f"{path.name} gives away the solution of {name}()"


def test_the_readme_lists_the_same_lectures_in_order():
    """The README's table, the site's index and its sidebar (tests/test_site.py) list the same lectures."""
    rows = re.findall(r"^\| (\d\d) \| `notebooks/(\d\d_[a-z0-9_]+\.ipynb)` \|", (ROOT / "README.md").read_text(), re.M)
    assert [name for _, name in rows] == [p.name for p in NOTEBOOKS], "the README's lecture table lists notebooks/ in order"
    assert all(nn == name[:2] for nn, name in rows)


def folded(path):
    """The code cells folded on the site (tag hide-input) or in JupyterLab (source_hidden): for
    each, whether it is folded in both and says what it draws in its first lines, and its head."""
    out = []
    for c in json.loads(path.read_text())["cells"]:
        tags, hidden = c["metadata"].get("tags", []), c["metadata"].get("jupyter", {}).get("source_hidden")
        if c["cell_type"] == "code" and ("hide-input" in tags or hidden):
            head = "".join(c["source"]).splitlines()[:2]
            out.append(("hide-input" in tags and hidden is True and any("# figure: " in line for line in head),
                        head[0][:60]))
    return out


@by_name
def test_a_folded_cell_is_folded_on_the_site_and_in_lab_and_says_what_it_draws(path):
    assert all(ok for ok, _ in folded(path)), [head for ok, head in folded(path) if not ok]


def test_figure_cells_are_folded():
    assert sum(len(folded(p)) for p in NOTEBOOKS) >= 10


@by_name
def test_one_cell_draws_the_key_figure_and_has_a_caption(path):
    tagged = [c for c in json.loads(path.read_text())["cells"] if images.TAG in c["metadata"].get("tags", [])]
    assert len(tagged) == 1 and tagged[0]["cell_type"] == "code", f"one code cell is tagged {images.TAG!r}"
    assert len(tagged[0]["metadata"].get("caption", "")) > 20, "the key figure's cell has a caption in its metadata"


def test_images_are_the_key_figures_of_one_run_and_the_readme_shows_them():
    """images/ is written by `make images`, never by hand: one small PNG per lecture, figures.json names the
    machine and the date of each, the captions are the lectures' own, and the README's block is the one
    helpers.site.images writes from figures.json."""
    figures = images.kept()
    assert list(figures) == [p.stem for p in NOTEBOOKS], "images/figures.json has one entry per lecture, in order"
    for path in NOTEBOOKS:
        entry, png = figures[path.stem], images.FOLDER / f"{path.stem}.png"
        assert png.exists() and png.stat().st_size < 200_000, f"{png.name} is missing or over 200 kB"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        caption = images.key_cell(json.loads(path.read_text()))["metadata"]["caption"]
        assert entry["caption"] == caption, f"{png.name}'s caption is not the lecture's: run make images"
        assert "cores" in entry["machine"] and re.fullmatch(r"\d{4}-\d\d-\d\d", entry["date"])
    assert sorted(p.name for p in images.FOLDER.iterdir()) == sorted([f"{p.stem}.png" for p in NOTEBOOKS] + ["figures.json"])
    assert images.readme_block(figures) in (ROOT / "README.md").read_text(), \
        "the README's picture table is not what `make images` writes from images/figures.json"
