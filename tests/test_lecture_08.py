"""Lecture 08 (pipeline parallelism): its shape, its key measured claim with a negative control,
and the simulator's formulas.

The claim (notebooks/08_pipeline_parallel.ipynb, section 4): on device-like stages
(machinery.l08_pipeline_parallel, standins.device_compute), a measured step is the simulator's step fed the
measured mean action times per stage and the hop latency measured apart, within 15%
(`assert_step_predicted`). The negative control: a pipeline run one micro-batch at a time (each
through every stage, forward and back, before the next starts: p m (t_f + t_b)) measured against
the 1F1B prediction from its own action times must fail it (about pm/(m+p-1) = 2.3 times longer
for p = m = 4). The same run drawn as a Gantt chart is the simulator's chart: every action starts
where the simulator, fed the run's own action times, starts it, within that 15 % of the step; the
serialised run held against 1F1B's chart is not (issue 48). The stand-ins take their time without a core, so the timings hold on a loaded
machine; the timed test takes a few seconds.

Section 4's claim on the H100 model (`hop_steps`): on stages that stand for a d = 8192 layer on
2048 tokens, each activation over a GPU's own NIC on the paced link, what the hops add to a 1F1B
step (its median less the least round of the same step unpaced, timing.above_floor) is the
simulator's step with the model's hops (each keeping its sender) less without, within that
tolerance. A model without hops, and one with the stages inside a node (NVLink), fail it.

The same claim for ZB-H1 (the Optional section: the backward split into B and W, F = B = W of
device-like work), with its negative control: the same split run with each W right after its B
(1F1B's order, W not deferred: m(F+B+W) + (p-1)(F+B), 1.2 times ZB-H1's m(F+B+W) + (p-1)(F+B-W)
for p = m = 4, F = B = W) must fail the ZB-H1 prediction.
"""
from pathlib import Path

import pytest

import torch

from course.pipeline_parallel import (assert_step_predicted, bubble, gpipe, hop_steps,
                                      one_f_one_b, predicted_step, run_schedule, simulate,
                                      stage_module, step_time, zb_h1)
from helpers import machines, tiny
from machinery import l08_pipeline_parallel as pp_bench
from helpers.site import shape
from helpers.spawn import spawn

LECTURE = Path(shape.NOTEBOOKS) / "08_pipeline_parallel.ipynb"
P, M, WORK_MS = 4, 4, 8


def one_at_a_time(p, m, stage):
    """Serialised: micro-batch i's forward and backward before micro-batch i + 1's forward."""
    return [a for i in range(m) for a in (("F", i), ("B", i))]


def w_at_once(p, m, stage):
    """The backward split into B and W, but each W right after its B: 1F1B's order."""
    return [a for k, i in one_f_one_b(p, m, stage) for a in [(k, i)] + [("W", i)] * (k == "B")]


SPLIT = {"F": WORK_MS, "B": WORK_MS, "W": WORK_MS}    # a backward's work in two halves


@pytest.fixture(scope="module")
def timed():
    plans = (("1F1B", one_f_one_b, WORK_MS), ("serial", one_at_a_time, WORK_MS),
             ("ZB-H1", zb_h1, SPLIT), ("W at once", w_at_once, SPLIT))
    return {name: spawn(pp_bench.timed_steps, P, backend="gloo", timeout=120,
                        args=(schedule, [M], work, 16, 32, P, 2))
            for name, schedule, work in plans}


def test_the_measured_step_is_predicted_and_a_serialised_one_is_not(timed):
    ev = pp_bench.events_of(timed["1F1B"], M)
    assert_step_predicted(step_time(ev), predicted_step(one_f_one_b, P, M, ev,
                                                        pp_bench.hop_of(timed["1F1B"])))
    ev = pp_bench.events_of(timed["serial"], M)
    hop = pp_bench.hop_of(timed["serial"])
    assert_step_predicted(step_time(ev), predicted_step(one_at_a_time, P, M, ev, hop))
    with pytest.raises(AssertionError):
        assert_step_predicted(step_time(ev), predicted_step(one_f_one_b, P, M, ev, hop))


H100 = machines.Scaled(machines.H100, time=10, bytes=2048 * 8192 * 2 / (2 * 16 * 8))
F_S = H100.compute(24 * 8192**2 * 2048)               # a d = 8192 layer, 2048 tokens
NIC = machines.H100.nic_bw, machines.RING_STEP["net"]["Simple"]


def _hop_s(bw, alpha):
    return H100.wall(alpha + 2048 * 8192 * 2 / bw)     # an activation, scaled


@pytest.fixture(scope="module")
def hops_added():
    """What the NIC's hops added to a 1F1B step on the H100 model (timing.above_floor)."""
    runs = spawn(pp_bench.hop_rounds, P, backend="gloo", timeout=120,
                 args=(one_f_one_b, M, 5, F_S * 1e3, H100.paced(*NIC), 16, 32, P, 2))
    return pp_bench.hops_added(runs, 5, hop_steps(one_f_one_b, P, M, F_S, 0.0)[0])


def _check_hops(added, hop_s):
    bare, hops = hop_steps(one_f_one_b, P, M, F_S, hop_s)
    assert abs(added["median"] - (hops - bare)) <= added["tolerance"], (added, hops - bare)


def test_what_the_hops_add_on_the_h100_model_is_the_simulator_s(hops_added):
    _check_hops(hops_added, _hop_s(*NIC))


def test_a_model_without_hops_or_with_the_stages_in_one_node_fails_it(hops_added):
    nvlink = machines.ring_bw(machines.H100), machines.RING_STEP["nvlink"]["Simple"]
    for hop_s in (0.0, _hop_s(*nvlink)):
        with pytest.raises(AssertionError):
            _check_hops(hops_added, hop_s)


def _gantt_gap(events, schedule, hop):
    """The largest |measured start - simulated start| over every action of a measured step, the
    simulator fed the step's own mean action times per stage and the measured hop (as
    predicted_step is): the Gantt chart drawn from the run against the one the simulator draws."""
    times = {(s, k): [e[4] - e[3] for e in events if e[0] == s and e[1] == k]
             for s in range(P) for k in "FBW"}
    mean = {key: sum(t) / len(t) for key, t in times.items() if t}
    simulated = {(s, k, i): t0 for s, k, i, t0, _ in
                 simulate(schedule, P, M, lambda s, k: mean[s, k], hop, hop)}
    measured = {(s, k, i): t0 for s, k, i, t0, _ in events}
    assert measured.keys() == simulated.keys()
    return max(abs(measured[a] - simulated[a]) for a in measured)


def test_the_measured_schedule_is_the_simulated_one_action_by_action(timed):
    """Every action of the measured 1F1B step starts where the simulator starts it, within the
    15 % of the step that section 4's claim allows the whole step. Controls: the serialised run
    held against 1F1B's chart (its last actions start tens of forwards later), and the measured
    1F1B run held against GPipe's chart, whose step is 1F1B's without hops but whose forwards all
    come first (the last stage's last forward half a step apart)."""
    ev, hop = pp_bench.events_of(timed["1F1B"], M), pp_bench.hop_of(timed["1F1B"])
    assert _gantt_gap(ev, one_f_one_b, hop) <= 0.15 * step_time(ev)
    assert _gantt_gap(ev, gpipe, hop) > 0.15 * step_time(ev)
    ev, hop = pp_bench.events_of(timed["serial"], M), pp_bench.hop_of(timed["serial"])
    assert _gantt_gap(ev, one_at_a_time, hop) <= 0.15 * step_time(ev)
    assert _gantt_gap(ev, one_f_one_b, hop) > 0.15 * step_time(ev)


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
    for p, m in ((2, 1), (4, 4), (3, 7)):   # a send keeping its stage: 2(m+p-2) hops
        ev = simulate(gpipe, p, m, hop=0.5, send_s=0.5)
        assert step_time(ev) == pytest.approx((m + p - 1) * 3 + 2 * (m + p - 2) * 0.5)


def test_the_simulator_refuses_a_stage_that_runs_a_backward_before_its_forward():
    """A student's misordered schedule (the last stage's B of a micro-batch before its F; a W
    before its B) is a deadlock the simulator names, not a timeline the engine then fails on;
    the same actions in order simulate, with the last stage's B right after its F (no hop; the
    old simulator met that too: not a control)."""
    def b_first(p, m, stage):
        acts = one_f_one_b(p, m, stage)
        return [acts[1], acts[0], *acts[2:]] if stage == p - 1 else acts

    def w_first(p, m, stage):
        return [("W", i) if k == "B" else ("B", i) if k == "W" else (k, i)
                for k, i in zb_h1(p, m, stage)]

    for schedule in (b_first, w_first):
        with pytest.raises(RuntimeError, match="deadlocks"):
            simulate(schedule, 2, 2)
    ev = simulate(one_f_one_b, 2, 1, hop=0.5)     # m = 1: the last stage's B right after its F
    last_f, last_b = (next(e for e in ev if e[:2] == (1, k)) for k in "FB")
    assert last_b[3] == last_f[4]


def test_the_lecture_has_the_shape():
    got = shape.shape(LECTURE)
    assert got["minutes"] <= shape.MINUTES and got["cells over 60"] == 0
    assert got["lines over 88"] == 0 and got["before section 1"] <= shape.BEFORE_SECTION_1
    assert got["wordy prints"] == 0 and got["chosen texts"] == 0


def test_zb_h1_step_is_predicted_and_one_with_w_not_deferred_is_not(timed):
    ev = pp_bench.events_of(timed["ZB-H1"], M)
    assert {e[1] for e in ev} == {"F", "B", "W"}
    assert_step_predicted(step_time(ev), predicted_step(zb_h1, P, M, ev,
                                                        pp_bench.hop_of(timed["ZB-H1"])))
    assert [res[M][1] for res in timed["ZB-H1"]] == [P] * P     # held until W
    ev = pp_bench.events_of(timed["W at once"], M)
    hop = pp_bench.hop_of(timed["W at once"])
    assert_step_predicted(step_time(ev), predicted_step(w_at_once, P, M, ev, hop))
    with pytest.raises(AssertionError):
        assert_step_predicted(step_time(ev), predicted_step(zb_h1, P, M, ev, hop))


def _zb_grads(rank, p, m):
    stage = stage_module(tiny.model(8, 16, p, seed=0), rank, p)
    x, y = tiny.batch(4 * m, 8, seed=1)
    run_schedule(stage, zb_h1(p, m, rank), x.chunk(m), y.chunk(m), rank, p)
    return [q.grad for q in stage.parameters()]


def test_zb_h1_gives_the_single_process_gradients():
    model = tiny.model(8, 16, 3, seed=0)
    x, y = tiny.batch(4 * 5, 8, seed=1)
    tiny.loss(model(x), y).backward()
    got = [g for r in spawn(_zb_grads, 3, args=(5,), backend="gloo", timeout=60) for g in r]
    torch.testing.assert_close(got, [q.grad for q in model.parameters()], rtol=1e-12,
                               atol=1e-14)


def test_zb_h1_simulated_meets_its_formula():
    for p in (2, 3, 4, 8):
        for m in (p, 2 * p + 1, 4 * p):
            F, B, W = 1.0, 1.5, 0.5
            ev = simulate(zb_h1, p, m, lambda s, kind: {"F": F, "B": B, "W": W}[kind])
            assert step_time(ev) == pytest.approx(m * (F + B + W) + (p - 1) * (F + B - W))
            serial = simulate(w_at_once, p, m, lambda s, kind: {"F": F, "B": B, "W": W}[kind])
            assert step_time(serial) == pytest.approx(m * (F + B + W) + (p - 1) * (F + B))
