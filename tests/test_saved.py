"""One definition per teaching piece: what a lecture shows in its #@save cells is what later lectures
import from notebooks/course/ (helpers.site.saved), byte for byte."""
import json

import pytest

from helpers.site import saved


def test_every_course_module_is_what_its_lecture_shows():
    want = saved.expected()
    have = {p: p.read_text() for p in saved.PACKAGE.glob("*.py") if p.name != "__init__.py"}
    assert sorted(have) == sorted(want), ("notebooks/course/ does not hold one module per lecture that saves "
                                          "cells: run `python -m helpers.site.saved`")
    for path, text in want.items():
        assert have[path] == text, (f"{path.name} differs from the #@save cells of its lecture: edit the "
                                    "lecture, then run `python -m helpers.site.saved`")


def _lecture(tmp_path, *cells):
    nb = {"cells": [{"cell_type": "code", "source": src, "metadata": {}} for src in cells]}
    path = tmp_path / "07_made_up.ipynb"
    path.write_text(json.dumps(nb))
    return path


def test_a_saved_cell_brings_the_imports_it_uses_and_only_those(tmp_path):
    path = _lecture(tmp_path, "import math\nimport torch\nimport torch.distributed as dist\nfrom helpers import plots",
                    "#@save\nSCRATCH = {}\n\ndef double(x):\n    return dist.get_rank() * math.pi * x",
                    "print(double(2))")
    text = saved.module_text(path)
    assert "import math\nimport torch.distributed as dist\n" in text
    assert "import torch\n" not in text and "plots" not in text and "print(double" not in text
    assert text.endswith("SCRATCH = {}\n\ndef double(x):\n    return dist.get_rank() * math.pi * x\n")
    assert saved.module_name(path) == "made_up"


def test_a_saved_cell_that_needs_an_unsaved_one_is_refused(tmp_path):
    """A negative control: the module would fail where it is imported, so it is not written."""
    path = _lecture(tmp_path, "LIMIT = 3", "#@save\ndef clip(x):\n    return min(x, LIMIT)")
    with pytest.raises(NameError, match="LIMIT"):
        saved.module_text(path)


def test_a_changed_module_fails_the_check(tmp_path, monkeypatch):
    """The first test fails when the shown and the imported code differ."""
    path = _lecture(tmp_path, "#@save\ndef one():\n    return 1")
    monkeypatch.setattr(saved, "PACKAGE", tmp_path / "course")
    saved.write(tmp_path)
    module = tmp_path / "course" / "made_up.py"
    assert module.read_text() == saved.expected(tmp_path)[module]
    module.write_text(module.read_text().replace("return 1", "return 2"))
    assert module.read_text() != saved.expected(tmp_path)[module]
