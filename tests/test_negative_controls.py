"""The negative-control rule (CONTRIBUTING.md, "An assertion can fail"), held by reading the code.

A lecture's key assertion is a function named `assert_*` in its taught code (notebooks/course/) or
its machinery (notebooks/machinery/): the lecture calls it on its run, and its tests call it again on
a run or model made wrong on purpose, which must fail it. Here: every such function is called inside
a `with pytest.raises(...)` block of some file in tests/, directly or through a function of that
test file (a test's `_check` that calls the lecture's assertion). A negative control: an assertion
that only right runs call is reported.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLACES = [ROOT / "notebooks" / "course", ROOT / "notebooks" / "machinery"]


def _called(node):
    """Names of everything called under `node` (f(...) and x.f(...) both give "f")."""
    out = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            f = sub.func
            out.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    return out


def key_assertions(sources):
    """{name: [where]} of the functions named assert_* in the given {where: source}."""
    out = {}
    for where, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("assert_"):
                out.setdefault(node.name, []).append(where)
    return out


def failed_on_purpose(test_sources):
    """Names called inside a `with pytest.raises(...)` block of any test source, following the
    calls into the functions that test file defines."""
    out = set()
    for source in test_sources:
        tree = ast.parse(source)
        local = {n.name: _called(n) for n in tree.body if isinstance(n, ast.FunctionDef)}

        def reach(names, seen=frozenset()):
            found = set(names)
            for n in names & local.keys() - seen:
                found |= reach(local[n], seen | {n})
            return found

        for node in ast.walk(tree):
            if isinstance(node, ast.With) and any(
                    isinstance(i.context_expr, ast.Call)
                    and getattr(i.context_expr.func, "attr", "") == "raises" for i in node.items):
                out |= reach(_called(node))
    return out


def uncovered(sources, test_sources):
    """The key assertions no test calls where it expects them to fail: {name: [where]}."""
    covered = failed_on_purpose(test_sources)
    return {n: w for n, w in key_assertions(sources).items() if n not in covered}


def _ours():
    sources = {str(p.relative_to(ROOT)): p.read_text() for place in PLACES for p in place.rglob("*.py")}
    tests = [p.read_text() for p in (ROOT / "tests").glob("test_*.py")]
    return sources, tests


def test_there_are_key_assertions():
    assert len(key_assertions(_ours()[0])) >= 20


def test_every_key_assertion_has_a_negative_control():
    missing = uncovered(*_ours())
    assert not missing, ("key assertions no test makes fail (call each inside pytest.raises on a run "
                         f"made wrong on purpose): {missing}")


LECTURE = '''
def assert_near(got, want, tol):
    assert abs(got - want) <= tol

def assert_orphan(x):
    assert x
'''
TESTS = '''
import pytest

def _check(got):
    assert_near(got, 1.0, 0.1)

def test_right():
    _check(1.0)
    assert_orphan(True)

def test_wrong_fails():
    with pytest.raises(AssertionError):
        _check(2.0)
'''


def test_an_assertion_that_only_right_runs_call_is_reported():
    assert uncovered({"lecture.py": LECTURE}, [TESTS]) == {"assert_orphan": ["lecture.py"]}
    # and one reached only through the test file's own function counts as failed on purpose
    assert "assert_near" in failed_on_purpose([TESTS])
