"""Lecture 08 (pipeline parallelism): its shape, its key measured claim with a negative control,
and the simulator's formulas.

The claim (notebooks/08_pipeline_parallel.ipynb, section 4): on device-like stages
(helpers.pp_bench, standins.device_compute), a measured step is the simulator's step fed the
measured mean action times per stage and the hop latency measured apart, within 15%
(`assert_step_predicted`). The negative control: a pipeline run one micro-batch at a time (each
through every stage, forward and back, before the next starts: p m (t_f + t_b)) measured against
the 1F1B prediction from its own action times must fail it (about pm/(m+p-1) = 2.3 times longer
for p = m = 4). The stand-ins take their time without a core, so the timings hold on a loaded
machine; the timed test takes a few seconds.
"""
from pathlib import Path

import pytest

from course.pipeline_parallel import (assert_step_predicted, bubble, gpipe, one_f_one_b,
                                      predicted_step, simulate, step_time)
from helpers import pp_bench, shape
from helpers.spawn import spawn

LECTURE = Path(shape.NOTEBOOKS) / "08_pipeline_parallel.ipynb"
P, M, WORK_MS = 4, 4, 8


def one_at_a_time(p, m, stage):
    """Serialised: micro-batch i's forward and backward before micro-batch i + 1's forward."""
    return [a for i in range(m) for a in (("F", i), ("B", i))]


@pytest.fixture(scope="module")
def timed():
    return {name: spawn(pp_bench.timed_steps, P, backend="gloo", timeout=120,
                        args=(schedule, [M], WORK_MS, 16, 32, P, 2))
            for name, schedule in (("1F1B", one_f_one_b), ("serial", one_at_a_time))}


def test_the_measured_step_is_predicted_and_a_serialised_one_is_not(timed):
    ev = pp_bench.events_of(timed["1F1B"], M)
    assert_step_predicted(step_time(ev), predicted_step(one_f_one_b, P, M, ev,
                                                        pp_bench.hop_of(timed["1F1B"])))
    ev = pp_bench.events_of(timed["serial"], M)
    hop = pp_bench.hop_of(timed["serial"])
    assert_step_predicted(step_time(ev), predicted_step(one_at_a_time, P, M, ev, hop))
    with pytest.raises(AssertionError):
        assert_step_predicted(step_time(ev), predicted_step(one_f_one_b, P, M, ev, hop))


def test_activations_counted(timed):
    for s, res in enumerate(timed["1F1B"]):
        assert res[M][1] == min(P - s, M)
    assert all(res[M][1] == 1 for res in timed["serial"])


def test_the_simulator_meets_the_formulas():
    for p in (2, 3, 4, 8):
        for m in (1, 2, 5, 8, 32):
            for schedule in (gpipe, one_f_one_b):
                assert abs(bubble(simulate(schedule, p, m), p) - (p - 1) / (m + p - 1)) < 1e-12
            serial = simulate(one_at_a_time, p, m)
            assert step_time(serial) == pytest.approx(3 * p * m)
    ev = simulate(gpipe, 4, 4, hop=0.5)     # GPipe: 2(p-1) hops on the critical path
    assert step_time(ev) == pytest.approx((4 + 3) * 3 + 2 * 3 * 0.5)


def test_the_lecture_has_the_shape():
    got = shape.shape(LECTURE)
    assert got["minutes"] <= shape.MINUTES and got["cells over 60"] == 0
    assert got["lines over 88"] == 0 and got["before section 1"] <= shape.BEFORE_SECTION_1
    assert got["wordy prints"] == 0 and got["chosen texts"] == 0
