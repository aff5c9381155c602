"""The house as a newcomer should find it (CONTRIBUTING.md, "The rooms"), held by its import graph.

Three places hold code that no lecture teaches:
- the kit, `helpers/` (not `helpers/site/`): what every lecture needs and none teaches (spawn, the
  instruments, timing, cost, plots, report, checks, tiny models, the nccl-tests sweep). It never knows
  which lecture calls it: it imports no lecture's machinery, no taught code and no site tooling.
- `helpers/site/`: the tooling around the notebooks (executing them, the site, images, #@save modules,
  a lecture's shape). It imports the kit only.
- `notebooks/machinery/`: each lecture's measuring machinery, in a module (or, for the planner, a
  package) named after its lecture, lNN_topic. A lecture's machinery is imported by its own lecture
  (notebook, #@save module, tests, solutions, programs), by the later lectures that reuse it, and by
  `bench/`; never by an earlier lecture, the kit or the site tooling.

The graph has no circle, and no file of the kit, the site tooling or the machinery is over 300 lines.
Every `import` counts, at the top of a module or inside a function (a lazy import is still a
dependency); an import of a package's name counts as one of the module it names (`from
machinery.l14_planner import paper` imports machinery.l14_planner.paper).
"""
import ast
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
MAX_LINES = 300
OURS = ("helpers", "machinery", "course")
# Test files not named test_lecture_NN that test one lecture's machinery: their lecture.
LECTURE_OF_TEST = {"test_planner.py": 14, "test_planner_memory.py": 14, "test_fake_mesh.py": 14,
                   "test_nd3d.py": 13, "test_zero_wrappers.py": 6, "test_cluster.py": 13}


def _modules():
    """{dotted name: path} of every Python module the project imports by name."""
    out = {}
    for base, folder in (("helpers", ROOT / "helpers"), ("machinery", NOTEBOOKS / "machinery"),
                         ("course", NOTEBOOKS / "course")):
        for p in folder.rglob("*.py"):
            parts = [base, *p.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


MODULES = _modules()


def _sources():
    """(node name, Python source) of every place that imports: modules, notebooks, programs, tests, bench."""
    for name, path in MODULES.items():
        yield name, path, path.read_text()
    for p in sorted(NOTEBOOKS.glob("*.ipynb")):
        cells = json.loads(p.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        yield f"notebook {p.stem}", p, re.sub(r"^\s*[%!].*$", "", code, flags=re.M)  # magics are not Python
    for folder, label in ((NOTEBOOKS, "program"), (NOTEBOOKS / "solutions", "solutions"),
                          (ROOT / "tests", "tests"), (ROOT / "bench", "bench")):
        for p in sorted(folder.glob("*.py")):
            yield f"{label} {p.stem}", p, p.read_text()


def _package(name, path):
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imports(name, path, source):
    """The project modules this source imports."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = _package(name, path).split(".")
                base = ".".join(pkg[:len(pkg) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES and "." in t:
                t = t.rpartition(".")[0]
            if t in MODULES and t != name:
                out.add(t)
    return out


def graph():
    return {name: imports(name, path, src) for name, path, src in _sources()}


def lecture(node, path=None):
    """The lecture a node belongs to (an int), None for the kit, the site tooling, bench and other tests."""
    kind, _, rest = node.partition(" ")
    if node.startswith("machinery."):
        return int(node.split(".")[1][1:3])
    if node.startswith("course."):
        topic = node.split(".")[1]
        found = [p for p in NOTEBOOKS.glob(f"[0-9][0-9]_{topic}.ipynb")]
        return int(found[0].name[:2]) if found else None
    if kind in ("notebook", "solutions"):
        return int(rest[:2])
    if kind == "program":
        return {"nd3d": 13, "ckpt_train": 16}.get(rest)
    if kind == "tests":
        m = re.fullmatch(r"test_lecture_(\d\d)", rest)
        return int(m.group(1)) if m else LECTURE_OF_TEST.get(rest + ".py")
    return None


def violations(edges):
    """Every broken rule of the house, one sentence each."""
    out = []
    for src, targets in sorted(edges.items()):
        site = src.startswith("helpers.site")
        kit = src.startswith("helpers") and not site
        for t in sorted(targets):
            if kit and (not t.startswith("helpers") or t.startswith("helpers.site")):
                out.append(f"{src} is the kit and imports {t}: the kit never knows which lecture calls it")
            elif site and not t.startswith("helpers"):
                out.append(f"{src} is site tooling and imports {t}: it imports the kit only")
            elif t.startswith("machinery."):
                owner, user = lecture(t), lecture(src)
                if not src.startswith("bench ") and (user is None or user < owner):
                    out.append(f"{src} imports {t}, lecture {owner:02d}'s machinery: only lecture {owner:02d}, "
                               "the later lectures that reuse it and bench/ may")
    out += [f"import circle: {' -> '.join(c)}" for c in circles(edges)]
    return out


def circles(edges):
    """The import circles among the project's modules (each once, as a path back to its start)."""
    found, state = [], {}

    def visit(node, trail):
        state[node] = "open"
        for t in sorted(edges.get(node, ())):
            if state.get(t) == "open":
                found.append(trail[trail.index(t):] + [t])
            elif t not in state:
                visit(t, trail + [t])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return found


def test_the_house_keeps_its_rules():
    broken = violations(graph())
    assert not broken, "\n".join(broken)


def test_a_kit_module_importing_a_lecture_s_machinery_breaks_it():
    """The negative control: the same check fails a kit that knows a lecture, an earlier lecture that
    reaches for a later one's machinery, site tooling that imports a lecture, and a circle."""
    edges = graph()
    for src, t, words in (("helpers.timing", "machinery.l05_ddp", "the kit never knows"),
                          ("notebook 03_benchmarking", "machinery.l05_ddp", "only lecture 05"),
                          ("tests test_helpers", "machinery.l05_ddp", "only lecture 05"),
                          ("helpers.site.build", "machinery.l14_planner", "imports the kit only"),
                          ("machinery.l14_planner.counts", "machinery.l14_planner", "import circle")):
        wrong = {**edges, src: edges[src] | {t}}
        assert any(words in v and t in v for v in violations(wrong)), (src, t)


def test_the_graph_sees_the_imports_it_must():
    """The checker reads what it must: lazy imports inside functions, package names, aliases."""
    edges = graph()
    assert "machinery.l05_ddp" in edges["notebook 05_ddp"]
    assert "machinery.l14_planner.counts" in edges["machinery.l14_planner.memory"]
    assert "course.ring_math" in edges["machinery.l14_emulator"]               # imported inside a function
    assert "machinery.l14_planner.paper" in edges["notebook 14_planner"]       # from package import module


def test_each_lecture_s_machinery_is_named_after_its_lecture():
    lectures = {p.name[:2]: p.stem[3:] for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")}
    for entry in sorted((NOTEBOOKS / "machinery").iterdir()):
        if entry.name in ("__init__.py", "__pycache__"):
            continue
        m = re.fullmatch(r"l(\d\d)_(\w+?)(\.py)?", entry.name)
        assert m and m.group(1) in lectures, \
            f"notebooks/machinery/{entry.name}: name it lNN_topic after the lecture it serves"


def test_no_file_is_over_300_lines():
    long = [f"{p.relative_to(ROOT)}: {n} lines" for name, p in MODULES.items() if not name.startswith("course")
            for n in [len(p.read_text().splitlines())] if n > MAX_LINES]
    assert not long, f"split by concern (at most {MAX_LINES} lines a file): " + "; ".join(long)
