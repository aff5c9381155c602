"""Teaching pieces that a later lecture reuses: one definition, shown where it is taught (d2l's #@save).

A code cell of notebooks/NN_topic.ipynb whose first line is `#@save` holds a piece that later lectures
reuse (lecture 02's ring all-reduce, lecture 00's ping-pong). `python -m helpers.site.saved` writes the
saved cells of every lecture, in order, to notebooks/course/topic.py, preceded by the lecture's own
import lines that they use; a later lecture imports them from there
(`from course.ring_math import ring_all_reduce`), and so do its ranks (spawn gives them the
notebook's folder). tests/test_saved.py fails when a module differs from what its lecture shows, so
the code a student reads in lecture 02 is the code lecture 03 runs.

This module reads notebooks as files; it never imports one, and holds no lecture code itself.
"""
import ast
import builtins
import json
import sys
from pathlib import Path

MARK = "#@save"
NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
PACKAGE = NOTEBOOKS / "course"


def saved_cells(path):
    """The source of every code cell of a lecture that starts with #@save (without that line)."""
    out = []
    for cell in json.loads(Path(path).read_text())["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "code" and src.lstrip().startswith(MARK):
            out.append(src.lstrip()[len(MARK):].lstrip("\n").rstrip() + "\n")
    return out


def module_name(path):
    """notebooks/02_ring_math.ipynb -> 'ring_math'."""
    return Path(path).stem.split("_", 1)[1]


def _imports(path):
    """The lecture's top-level import statements: [(names they bind, statement's source)]."""
    out = []
    for cell in json.loads(Path(path).read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        src = "\n".join(l for l in "".join(cell["source"]).splitlines() if not l.lstrip().startswith(("%", "!")))
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    if isinstance(node, ast.Import):
                        text = f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
                    else:
                        text = f"from {node.module} import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
                    out.append((bound, text))
    return out


def _free_names(tree):
    """Names the code reads at module level or inside functions that it does not bind itself."""
    bound, used = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
            if not isinstance(node, ast.ClassDef):
                a = node.args
                bound |= {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
                bound |= {x.arg for x in (a.vararg, a.kwarg) if x}
        elif isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, (ast.Store, ast.Del)) else used).add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {a.asname or a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return used - bound - set(dir(builtins))


def module_text(path):
    """The module a lecture's saved cells make, or None when it saves nothing."""
    cells = saved_cells(path)
    if not cells:
        return None
    body = "\n\n".join(c.rstrip() for c in cells) + "\n"
    free = _free_names(ast.parse(body))
    lines, seen = [], set()
    for bound, text in _imports(path):
        if bound in free and text not in seen:
            lines.append(text)
            seen.add(text)
            free.discard(bound)
    if free:
        raise NameError(f"{Path(path).name}: the #@save cells use {sorted(free)}, which no saved cell "
                        "defines and no import line of the lecture binds: save the cell that defines them.")
    plain = sorted(l for l in lines if l.startswith("import "))
    grouped = {}
    for line in lines:
        if line.startswith("from "):
            module, name = line[5:].split(" import ", 1)
            grouped.setdefault(module, []).append(name)
    froms = [f"from {m} import {', '.join(sorted(names))}" for m, names in sorted(grouped.items())]
    head = (f'"""Lecture {Path(path).name[:2]}\'s pieces that later lectures reuse, exactly as '
            f"notebooks/{Path(path).name} shows them\n(its cells marked {MARK}). Written by "
            '`python -m helpers.site.saved`: edit the lecture, then run it again."""\n')
    return head + "\n".join(plain + froms) + "\n\n\n" + body


def expected(notebooks=NOTEBOOKS):
    """{module file: its text} for every lecture that saves something."""
    out = {}
    for path in sorted(Path(notebooks).glob("[0-9][0-9]_*.ipynb")):
        text = module_text(path)
        if text is not None:
            out[PACKAGE / f"{module_name(path)}.py"] = text
    return out


def write(notebooks=NOTEBOOKS):
    """Write notebooks/course/*.py from the lectures; remove modules no lecture saves any more."""
    want = expected(notebooks)
    PACKAGE.mkdir(exist_ok=True)
    init = PACKAGE / "__init__.py"
    if not init.exists():
        init.write_text('"""The lectures\' reusable pieces: one module per lecture, written by '
                        '`python -m helpers.site.saved`."""\n')
    for old in PACKAGE.glob("*.py"):
        if old.name != "__init__.py" and old not in want:
            old.unlink()
    for path, text in want.items():
        path.write_text(text)
    return sorted(want)


if __name__ == "__main__":
    for written in write():
        print(f"wrote {written.relative_to(NOTEBOOKS.parent)}", file=sys.stdout)
