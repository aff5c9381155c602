"""The set-up files agree with each other: pip's list, conda's list, CI and the README."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONDA_NAMES = {"pytorch": "torch"}  # conda-forge name -> PyPI name


def requirement(line):
    name, op, version = re.match(r"([A-Za-z0-9_.\-]+)\s*(==|>=)?\s*([\w.]*)", line).groups()
    return name.lower().replace("_", "-"), op, version


def pip_list():
    lines = [l.split("#")[0].strip() for l in (ROOT / "requirements.txt").read_text().splitlines()]
    return {n: (op, v) for n, op, v in map(requirement, filter(None, lines))}


def conda_list():
    text = (ROOT / "environment.yml").read_text().split("dependencies:", 1)[1]
    deps = re.findall(r"^\s+-\s+([^\s#]+)", text, re.M)
    out = {}
    for dep in deps:
        name, op, version = requirement(dep)
        if name not in ("python", "pip"):
            out[CONDA_NAMES.get(name, name)] = (op, version)
    return out


def test_pip_and_conda_list_the_same_packages():
    pip, conda = pip_list(), conda_list()
    assert sorted(pip) == sorted(conda), (f"only in requirements.txt: {sorted(set(pip) - set(conda))}; "
                                          f"only in environment.yml: {sorted(set(conda) - set(pip))}")


def test_conda_asks_for_at_least_the_versions_pip_pins():
    pip, conda = pip_list(), conda_list()
    for name, (op, version) in pip.items():
        assert conda[name][1] == version, f"{name}: requirements.txt has {version}, environment.yml {conda[name]}"


def test_the_default_torch_satisfies_the_requirement():
    default = re.search(r"^TORCH\s*\?=\s*torch==([\d.]+)", (ROOT / "Makefile").read_text(), re.M)
    assert default, "the Makefile sets an overridable TORCH ?= torch==X.Y.Z"
    op, minimum = pip_list()["torch"]
    as_tuple = lambda v: tuple(int(x) for x in v.split("."))  # noqa: E731
    assert op == ">=" and as_tuple(default.group(1)) >= as_tuple(minimum)


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make html" in readme and "make lab" in readme


def test_make_bench_runs_every_script_in_bench():
    listed = re.search(r"for script in ([\w ]+); do", (ROOT / "Makefile").read_text())
    assert listed, "the Makefile's bench target loops over the scripts of bench/"
    scripts = {p.stem for p in (ROOT / "bench").glob("*.py")}
    assert set(listed[1].split()) == scripts, f"make bench runs {listed[1].split()}, bench/ holds {sorted(scripts)}"
