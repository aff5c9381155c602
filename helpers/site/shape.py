"""The shape of a lecture, measured: how long it takes to read and where code does what prose should.

    python -m helpers.site.shape                 # one line per lecture
    python -m helpers.site.shape notebooks/02_ring_math.ipynb

The reading time is estimated as CONTRIBUTING.md (and ../shared/checks/lecture-shape) estimate it:
prose at 150 words a minute (technical text, with formulas) plus code at 6 lines a minute, optional
sections included. tests/test_shape.py holds every lecture to the budgets below; a lecture not yet
rewritten in this shape is listed there with the rules it does not meet yet.
"""
import ast
import json
import re
import sys
from pathlib import Path

MINUTES = 90            # one sitting
CELL_LINES = 60         # lines of one code cell
LINE_CHARS = 88         # the site's code column
BEFORE_SECTION_1 = 25   # lines of code before "## 1"
PRINTED_WORDS = 20      # words of text one printing call may write (a label, not a paragraph)
PRINTERS = {"print", "table", "by_rank", "say", "Markdown", "display", "note", "verdict", "takeaway"}
NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def cells(path):
    return [(c["cell_type"], "".join(c["source"])) for c in json.loads(Path(path).read_text())["cells"]]


def parse(source):
    """The cell's code as a tree, IPython's % and ! lines left out; None if it does not parse."""
    src = "\n".join(l for l in source.splitlines() if not l.lstrip().startswith(("%", "!")))
    try:
        return ast.parse(src)
    except SyntaxError:
        return None


def _printer(node):
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (f.id if isinstance(f, ast.Name) else
                                           f.attr if isinstance(f, ast.Attribute) else "") in PRINTERS


def _words(node):
    return sum(len(re.findall(r"[A-Za-z]{2,}", sub.value)) for sub in ast.walk(node)
               if isinstance(sub, ast.Constant) and isinstance(sub.value, str))


def _is_text(node):
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


def printed(tree):
    """[(words, chooses)] for each printing call: the words of text it writes, and whether a
    conditional expression (or an `x or "text"`) chooses between texts inside it (a verdict
    written by code)."""
    out = []
    for node in ast.walk(tree):
        if _printer(node):
            in_text = any(isinstance(sub, ast.IfExp) for js in ast.walk(node) if isinstance(js, ast.JoinedStr)
                          for sub in ast.walk(js))
            picks_text = any((isinstance(sub, ast.IfExp) and (_is_text(sub.body) or _is_text(sub.orelse)))
                             or (isinstance(sub, ast.BoolOp) and any(_is_text(v) for v in sub.values))
                             for sub in ast.walk(node))   # "a if c else b", "x or 'no GPU here'"
            out.append((_words(node), in_text or picks_text))
    return out


def definitions(path):
    """{name: source dump} of the functions and classes a lecture defines at top level, private
    names (_x) and the exercises' checks (check_x after the "Exercises" heading) aside."""
    out, exercises = {}, False
    for kind, src in cells(path):
        exercises = exercises or (kind == "markdown" and re.search(r"^#+ .*Exercises", src, re.M))
        tree = parse(src) if kind == "code" else None
        for node in (tree.body if tree else []):
            mine = not node.name.startswith("_") if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else False
            if mine and not (exercises and node.name.startswith("check_")):
                out[node.name] = ast.dump(node)
    return out


def shape(path):
    """The numbers of one lecture (see the module's docstring)."""
    cs = cells(path)
    prose = sum(len(src.split()) for kind, src in cs if kind == "markdown")
    code = [src for kind, src in cs if kind == "code"]
    lines = [len(src.splitlines()) for src in code]
    before = 0
    for kind, src in cs:
        if kind == "markdown" and re.search(r"^##\s*1\b", src, re.M):
            break
        before += len(src.splitlines()) if kind == "code" else 0
    calls = [p for src in code for p in (printed(parse(src)) if parse(src) else [])]
    return {"prose words": prose, "code lines": sum(lines), "code cells": len(lines),
            "longest cell": max(lines, default=0), "cells over 60": sum(n > CELL_LINES for n in lines),
            "lines over 88": sum(len(l) > LINE_CHARS for src in code for l in src.splitlines()),
            "before section 1": before, "printed words": sum(w for w, _ in calls),
            "wordy prints": sum(w > PRINTED_WORDS for w, _ in calls),
            "chosen texts": sum(c for _, c in calls),
            "minutes": prose / 150 + sum(lines) / 6}


def main(paths):
    paths = paths or sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    rows = [{"lecture": Path(p).stem, **shape(p)} for p in paths]
    from helpers.report import table

    table(rows, list(rows[0]), floatfmt="{:.0f}")


if __name__ == "__main__":
    main(sys.argv[1:])
