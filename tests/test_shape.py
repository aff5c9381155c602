"""Every lecture in the shape CONTRIBUTING.md describes, measured by helpers.site.shape: one sitting, short
cells and lines, a short set-up, no verdicts written by code, one definition per name.

Lectures not yet rewritten in this shape are listed in NOT_YET with the rules they do not meet yet
and the issue that rewrites them; that issue removes the entry. A listed lecture still may not get
worse on a rule it meets, and a rule it meets no longer must leave the list (so the list only shrinks).
"""
from pathlib import Path

import pytest

from helpers.site import shape

NOTEBOOKS = sorted(shape.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
RULES = {  # rule: (what helpers.site.shape measures, the most it may be)
    "one sitting": ("minutes", shape.MINUTES),
    "short cells": ("cells over 60", 0),
    "short lines": ("lines over 88", 0),
    "short set-up": ("before section 1", shape.BEFORE_SECTION_1),
    "no paragraphs printed by code": ("wordy prints", 0),
    "no verdicts chosen by code": ("chosen texts", 0),
}
ALL = set(RULES)
NOT_YET = {}  # lecture: (issue, rules it does not meet yet); every lecture meets them now
# Names defined differently in several lectures of which at most one is rewritten: the rewritten one
# owns the piece (#@save), and the issue that rewrites the others makes them import it.
DRIFT_NOT_YET = set()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_lecture_has_the_shape(path):
    measured = shape.shape(path)
    issue, excused = NOT_YET.get(path.stem, (None, set()))
    broken = {rule: measured[key] for rule, (key, most) in RULES.items() if measured[key] > most}
    assert set(broken) <= excused, (
        f"{path.name}: " + "; ".join(f"{rule}: {RULES[rule][0]} = {broken[rule]:.0f}, at most {RULES[rule][1]}"
                                     for rule in sorted(set(broken) - excused)))
    assert excused <= set(broken), (f"{path.name} now meets {sorted(excused - set(broken))}: remove them "
                                    f"from NOT_YET in tests/test_shape.py")


def test_no_name_is_defined_differently_in_two_lectures():
    """A piece reused by a later lecture is imported from notebooks/course/ (helpers.site.saved), not copied."""
    seen = {}
    for path in NOTEBOOKS:
        for name, dump in shape.definitions(path).items():
            seen.setdefault(name, {}).setdefault(dump, []).append(path.stem[:2])
    drift = {name: sorted(sum(v.values(), [])) for name, v in seen.items() if len(v) > 1}
    rewritten = {name: where for name, where in drift.items()
                 if name not in DRIFT_NOT_YET
                 or sum(f"{nn}_" not in " ".join(NOT_YET) for nn in set(where)) > 1}
    assert not rewritten, f"defined differently in several lectures (name: lectures): {rewritten}"
    assert DRIFT_NOT_YET <= set(drift), f"no longer drifting, remove from DRIFT_NOT_YET: {DRIFT_NOT_YET - set(drift)}"


def test_the_meter_sees_what_it_measures(tmp_path):
    """A negative control: a made-up lecture that breaks every rule is measured as breaking it."""
    import json

    long_cell = "\n".join(f"x{i} = {i}" for i in range(61))
    verdict = 'print("the ring is faster" if fast else "the ring is slower")\nprint(x or "no GPU")'
    paragraph = "print('" + " ".join(["ab"] * 25) + "')"
    nb = {"cells": [{"cell_type": "code", "source": long_cell, "metadata": {}},
                    {"cell_type": "code", "source": "y = '" + "a" * 90 + "'", "metadata": {}},
                    {"cell_type": "markdown", "source": "## 1. First", "metadata": {}},
                    {"cell_type": "code", "source": verdict + "\n" + paragraph, "metadata": {}},
                    {"cell_type": "markdown", "source": " ".join(["word"] * 14000), "metadata": {}}]}
    path = tmp_path / "99_made_up.ipynb"
    path.write_text(json.dumps(nb))
    got = shape.shape(path)
    assert got["cells over 60"] == 1 and got["lines over 88"] == 1 and got["before section 1"] == 62
    assert got["chosen texts"] == 2 and got["wordy prints"] == 1 and got["minutes"] > 90
    assert Path(shape.__file__).name == "shape.py"


def test_a_check_counts_as_a_definition_outside_the_exercises(tmp_path):
    """The drift rule's negative control: an exercise's check_x is the lecture's own, any other
    function (a check_x that checks the lecture's code included) must have one definition."""
    import json

    nb = {"cells": [{"cell_type": "code", "source": "def check_ring(r):\n    return r", "metadata": {}},
                    {"cell_type": "markdown", "source": "## 9. Exercises", "metadata": {}},
                    {"cell_type": "code", "source": "def check_sum(f):\n    return f(1)", "metadata": {}},
                    {"cell_type": "code", "source": "def _helper():\n    pass", "metadata": {}}]}
    path = tmp_path / "98_made_up.ipynb"
    path.write_text(json.dumps(nb))
    assert sorted(shape.definitions(path)) == ["check_ring"]
