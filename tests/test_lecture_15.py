"""Lecture 15 (the frameworks around DDP): its shape, its key claim with negative controls, and the
written-out DataParallel checked against one process.

The claim (notebooks/15_frameworks.ipynb, section 2): one step of the written-out nn.DataParallel
over K devices makes exactly the copies of machinery.l15_frameworks.copies_model (scatter
(K-1)/K (X + O), replicate (K-1) P, gather (K-1)/K O, reduce_gradients (K-1) P), counted by
wrapping the step (`frameworks_bench.copies`) and asserted by `assert_copies_per_step`. It is a
count, so it holds on a loaded machine and needs no tolerance. The negative controls must fail it:
- a DataParallel that broadcasts the whole batch to every device and lets each take its chunk
  (what a careless scatter does: the same parameters, the correctness check cannot see it);
- the right step held against the model of another K.

Section 3's count (the reduction waits for the whole backward; DDP's all-reduces start during it)
has its own control: torch's DDP with one bucket launches its all-reduce after the whole backward,
so the "during" count is 0 there. Exercise 4's point is tested on the lecture's own parallel_apply
(it drops the caller's grad mode) and on the reference solution (it keeps it).
"""
import importlib
from pathlib import Path

import pytest
import torch

import course.frameworks as fw
from course.ddp import global_batches, sgd_update
from helpers import tiny
from machinery import l15_frameworks as frameworks_bench
from helpers.site import shape
from helpers.spawn import spawn

LECTURE = Path(shape.NOTEBOOKS) / "15_frameworks.ipynb"
MODEL = dict(dim=16, hidden=32, depth=3)      # the lecture's CHECK_MODEL
PHASES = ("scatter", "replicate", "gather", "reduce_gradients")


def _sizes(batch=32):
    x, y = tiny.batch(batch, MODEL["dim"], seed=1)
    p = sum(t.numel() * t.element_size() for t in tiny.model(**MODEL).parameters())
    return x, y, p, x.numel() * x.element_size(), y.numel() * y.element_size()


def _counted(k, x, y):
    model = tiny.model(**MODEL, seed=0)
    with frameworks_bench.copies(PHASES) as log:
        fw.data_parallel_step(model, x, y, k, 0.1)
    return log.bytes


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_the_copies_per_step_are_the_model(k):
    x, y, p, xb, ob = _sizes()
    frameworks_bench.assert_copies_per_step(_counted(k, x, y), k, p, xb, ob)


def test_a_broadcast_instead_of_a_scatter_fails_the_claim(monkeypatch):
    x, y, p, xb, ob = _sizes()

    def scatter(t, k):                   # every device gets all of t, then keeps its chunk
        return [c if i == 0 else fw.to_device(t, i).chunk(k)[i] for i, c in enumerate(t.chunk(k))]

    monkeypatch.setattr(fw, "scatter", scatter)
    counted = _counted(4, x, y)
    assert counted["scatter"] == 3 * (xb + ob)
    with pytest.raises(AssertionError):
        frameworks_bench.assert_copies_per_step(counted, 4, p, xb, ob)
    right = tiny.model(**MODEL, seed=0)  # and the parameters are still right: only the count sees it
    wrong = tiny.model(**MODEL, seed=0)
    monkeypatch.undo()
    fw.data_parallel_step(right, x, y, 4, 0.1)
    monkeypatch.setattr(fw, "scatter", scatter)
    fw.data_parallel_step(wrong, x, y, 4, 0.1)
    torch.testing.assert_close(list(wrong.parameters()), list(right.parameters()), rtol=0, atol=0)


def test_the_right_step_fails_the_model_of_another_k():
    x, y, p, xb, ob = _sizes()
    with pytest.raises(AssertionError):
        frameworks_bench.assert_copies_per_step(_counted(4, x, y), 2, p, xb, ob)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_the_written_out_step_is_one_process(k):
    data = torch.utils.data.TensorDataset(*tiny.batch(32 * 3, MODEL["dim"], seed=1))
    ref, dp = tiny.model(**MODEL, seed=0), tiny.model(**MODEL, seed=0)
    for x, y in global_batches(data, 32, 0):
        ref.zero_grad()
        tiny.loss(ref(x), y).backward()
        sgd_update(ref, 0.1)
        fw.data_parallel_step(dp, x, y, k, 0.1)
    torch.testing.assert_close(list(dp.parameters()), list(ref.parameters()), rtol=1e-12, atol=1e-12)


def test_torch_data_parallel_on_a_cpu_runs_the_module_unsplit():
    if torch.cuda.is_available():
        pytest.skip("with a GPU, DataParallel wants the module on it (the lecture checks that)")
    model, calls = tiny.model(**MODEL), []
    net = torch.nn.DataParallel(model)
    model.register_forward_hook(lambda m, args, out: calls.append(len(args[0])))
    x, _ = tiny.batch(32, MODEL["dim"])
    assert net.device_ids == [] and torch.equal(net(x), model(x)) and calls[0] == 32


def test_the_lecture_has_the_shape():
    got = shape.shape(LECTURE)
    assert got["minutes"] <= shape.MINUTES and got["cells over 60"] == 0
    assert got["lines over 88"] == 0 and got["before section 1"] <= shape.BEFORE_SECTION_1
    assert got["wordy prints"] == 0 and got["chosen texts"] == 0


@pytest.mark.parametrize("k", [2, 4])
def test_the_written_out_reduction_waits_for_the_whole_backward(k):
    x, y, *_ = _sizes()
    with frameworks_bench.order(PHASES) as log:
        fw.data_parallel_step(tiny.model(**MODEL, seed=0), x, y, k, 0.1)
    assert log.events.count("backward") == k * 2 * MODEL["depth"]
    assert frameworks_bench.backward_after(log.events, "reduce_gradients") == 0
    assert frameworks_bench.backward_after(log.events, "scatter") > 0   # the count can see order


def test_torch_ddp_launches_all_reduces_during_backward_and_one_bucket_does_not():
    p = _sizes()[2]
    small, one = (spawn(frameworks_bench.ddp_order, 2, backend="gloo",
                        args=(MODEL, 16, cap, 3))[0] for cap in (p / 3 / 2**20, 25))
    assert [frameworks_bench.backward_after(e, "all_reduce") > 0 for e in small] == [
        False, True, True]
    assert all(frameworks_bench.backward_after(e, "all_reduce") == 0 for e in one)


def test_exercise_4_the_lecture_drops_grad_mode_and_the_solution_keeps_it():
    solution = importlib.import_module("solutions.15_solutions").parallel_apply_keeping_grad_mode
    probe = [torch.is_grad_enabled] * 3
    with torch.no_grad():
        assert fw.parallel_apply(probe) == [True] * 3         # a new thread starts with grad on
        assert solution(probe) == [False] * 3
    assert solution(probe) == [True] * 3
    assert solution([lambda i=i: i for i in range(4)]) == [0, 1, 2, 3]
