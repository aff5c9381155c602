"""Lecture 14 (a planner for N-D parallelism): its key measured claim, with negative controls.

The claim (notebooks/14_planner.ipynb, section 4): the planner's step_time on this machine's figures
(measured in the same launch: one rank's compute alone, the slowdown of n ranks computing at once,
the ring's and a message's alpha and B, the data-parallel call's wait after compute;
planner_machine.measure, the function bench/planner.py uses too) predicts nd3d.train's measured step
of every (dp, tp, pp) layout of 4 ranks (6 layouts, 2-D and 3-D among them) with a median |relative
error| of at most 35 %: the bound the lecture asserts for its SMOKE run (one round; its full run
asserts 25 %, the issue's goal is 20 %: the lecture gives the runs). Run here on lecture 13's tiny
GPT, 2 rounds.

Negative controls: the same measurements against a model 5 times too slow fail the bound (by
construction, once the claim holds: a control that cannot pass by luck); and the overlap cap:
on the lecture's GPT-3 175B plan, hiding `overlap` of the data traffic without the cap hides more
than the compute it overlaps (the bug the cap fixes), while the planner's step keeps it below.

Section 3's `differences` (torch's fake-process-group counts against planner.traffic, moved here from
lecture 13) is checked on the planner's own dicts: none against itself, and a layout off by one
factor is seen; the counts themselves are tests/test_fake_mesh.py's.

Section 5's prose quotes the comparison with Narayanan et al.'s Table 1 (efficiency, the three median
errors, which layouts are forced, tied, picked or not chosen): checked against paper.compare(), so a
paragraph written for another comparison (before their rows were priced as run) fails.
"""
import json
import re
import statistics
from pathlib import Path

import pytest

import nd3d
from course.planner import differences
from helpers import bench
from machinery.l14_planner import fake_mesh, paper, measured as planner_machine
from machinery import l14_planner as planner
from helpers.site import shape

LECTURE = Path(shape.NOTEBOOKS) / "14_planner.ipynb"
BOUND = 0.35   # the lecture's SMOKE bound
H100S = {"gpus_per_node": 8, "nodes": 128, "memory": 80e9, "reserve": 0.1,   # the lecture's plan
         "peak_flops": 989e12, "efficiency": 0.4, "intra_bw": 450e9, "intra_alpha": 5e-6,
         "inter_bw": 50e9, "inter_alpha": 10e-6}


@pytest.fixture(scope="module")
def checked():
    cfg = dict(nd3d.CFG)
    measured = planner_machine.measure(nd3d.train, nd3d.check, cfg, [4], 2, 3, 2,
                                       bench.size_range("4K", "1M", 4), "gloo", timeout=300)
    return planner_machine.summary(measured, cfg, 2)


def test_the_planner_predicts_the_measured_steps(checked):
    machines, rows, error, per_round = checked
    assert len(rows) == 6 and {"2,2,1", "1,2,2", "2,1,2"} <= {r["dp,tp,pp"] for r in rows}
    assert error <= BOUND, rows


def test_a_model_off_by_a_factor_fails_the_check(checked):
    # Deterministic, given the claim above holds: at least half the rows are within 35 %, and
    # 5x their prediction is then at least 225 % off, so the median of a 5x model exceeds 35 %.
    # (Dropping the tensor term instead was tried: whether it fails depends on the run's noise.)
    _, rows, _, _ = checked
    errors = [5 * r["predicted ms"] / r["measured ms"] - 1 for r in rows]
    assert statistics.median(abs(e) for e in errors) > BOUND, errors


def test_hidden_traffic_is_capped_by_the_compute_it_overlaps():
    model = paper.gpt3("GPT-3 175B")
    cluster = H100S
    t = planner.step_time(model, cluster, 1536, 1, 512, 2, 1, 3, "full", overlap=1.0)
    data = t["data"] + t["hidden"]
    uncapped = 1.0 * data                                   # what the planner hid before the cap
    assert uncapped > t["compute"]                          # the control: more than the compute
    assert t["hidden"] <= t["compute"] * planner.backward_share(model, 1, 2, 1, "full") + 1e-12


def test_the_lecture_is_one_sitting():
    s = shape.shape(LECTURE)
    assert s["minutes"] <= shape.MINUTES and s["before section 1"] <= shape.BEFORE_SECTION_1
    assert s["lines over 88"] == s["cells over 60"] == s["wordy prints"] == s["chosen texts"] == 0


def test_a_once_per_step_reduction_hides_only_behind_the_last_backward():
    """ZeRO-0/1 reduce once per step (after gradient accumulation): the last micro-batch's backward
    is all they can hide behind; ZeRO-1/2's parameter all-gather follows the optimizer step."""
    model = paper.gpt3("GPT-3 175B")
    cluster = H100S
    t = planner.step_time(model, cluster, 1536, 1, 16, 8, 8, 0, "full", overlap=1.0)
    window = t["compute"] * planner.backward_share(model, 1, 8, 8, "full") / t["micro_batches"]
    data = t["data"] + t["hidden"]
    assert t["micro_batches"] == 96 and data > window           # the control: the cap binds
    assert t["hidden"] == pytest.approx(window) and t["data"] > 0
    t1 = planner.step_time(model, cluster, 1536, 2, 128, 8, 1, 2, "full", overlap=1.0)
    gather = t1["data"] + t1["hidden"] - t1["overlappable"]     # ZeRO-2's parameter all-gather
    assert gather > 0 and t1["data"] == pytest.approx(gather)   # everything else is hidden


def test_differences_sees_a_layout_off_by_a_factor():
    model = fake_mesh.stack_model(2, 4096, 32, 32)
    right = planner.traffic(model, 128, 1, 128, 8, 1, zero=3)
    assert differences(right, right) == {}
    off = differences(planner.traffic(model, 128, 1, 128, 4, 1, zero=3), right)   # tp off by 2
    assert set(off) == {("data", "all_gather"), ("data", "reduce_scatter")}       # S: t x fewer
    redo = differences(planner.traffic(model, 128, 1, 128, 8, 1, zero=3, recompute="none"), right)
    assert redo == {("tensor", "all_reduce"): (-2 * 2, -2 * 2 * 2 * 32 * 4096)}    # 2 a layer


def _markdown(title):
    """The text of the lecture's markdown cells from the one starting with `title` to the next code."""
    cells, out, on = json.loads(LECTURE.read_text())["cells"], [], False
    for c in cells:
        text = "".join(c["source"])
        on = on or (c["cell_type"] == "markdown" and text.startswith(title))
        if on and c["cell_type"] == "code":
            break
        if on:
            out.append(text)
    return " ".join(" ".join(out).split())


def test_section_5s_claim_is_the_paper_comparisons():
    # the prose states the comparison's claim, not its figures (CONTRIBUTING.md): the planner's
    # median error above both baselines' and the smaller in no predicted row; a prose that quotes
    # the run's numbers again, or a comparison where the planner wins a row, fails
    rows, text = paper.compare(), _markdown("## 5. Checked against the paper")
    assert "has no skill" in text and not re.search(r"\d+\.\d+ %", text)
    skill = paper.skill(rows)
    assert skill["error"] > max(skill["constant error"], skill["trend error"])
    kept = [r for r in rows if not r["fitted"]]
    assert not any(abs(r["error"]) < min(abs(r["constant error"]), abs(r["trend error"]))
                   for r in kept)
