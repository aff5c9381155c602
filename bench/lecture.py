"""Code that a lecture teaches, read from its notebook, so that a benchmark measures that very code.

A script cannot import a notebook; copying the code into the script would let the two drift apart.
lecture_code() takes the named definitions (functions, classes, and simple `NAME = ...` lines) and
every import from the notebook's code cells, and runs them in a fresh namespace.
"""
import ast
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def notebook(stem):
    """notebooks/<stem>.ipynb, e.g. notebook("05_ddp")."""
    return os.path.join(ROOT, "notebooks", f"{stem}.ipynb")


def lecture_code(path, names, constants=None):
    """The definitions `names` from the notebook at `path`, as a namespace (imports included).

    constants: values for names the definitions use but that the notebook sets from its parameters
    (e.g. {"LR": 0.1}). Raises SystemExit naming what the notebook no longer defines.
    """
    with open(path) as f:
        cells = [c for c in json.load(f)["cells"] if c["cell_type"] == "code"]
    imports, defs = [], {}
    for cell in cells:
        src = "".join(cell["source"])
        for node in ast.parse(src).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                imports.append(ast.get_source_segment(src, node))
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
                defs[node.name] = ast.get_source_segment(src, node)
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 \
                    and getattr(node.targets[0], "id", None) in names:
                defs[node.targets[0].id] = ast.get_source_segment(src, node)
    missing = [n for n in names if n not in defs]
    if missing:
        raise SystemExit(f"{path} no longer defines {missing}; update the benchmark that reads them.")
    stem = os.path.splitext(os.path.basename(path))[0]
    namespace = {"__name__": f"lecture_{stem}", **(constants or {})}
    exec(compile("\n".join(imports + [defs[n] for n in names]), path, "exec"), namespace)
    return namespace
