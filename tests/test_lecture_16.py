"""Lecture 16 (checkpoints and failures): its shape, the restart program's pieces, and its key
measured claim with negative controls.

The restart (section 4) runs in the lecture itself, which tests/test_notebooks.py executes: there
notebooks/ckpt_train.py runs under `torchrun --max-restarts 1`, its last rank SIGKILLed once between
a checkpoint's write and its rename, and again with a rank that hangs (a 5 s collective timeout);
each restarted group resumes from the last committed checkpoint (asserted: the step it resumed at,
the folders left) and every logged loss equals the uninterrupted run's, float64, exactly
(`ckpt_bench.assert_resumed_equal`); the hung process is gone afterwards. Here, without torchrun
(the same runs twice cost a minute of CI): a resume from a copied checkpoint equals the uninterrupted
run; made wrong on purpose, the comparison must fail: a resume that forgets the RNG state; a log
whose run never restarted. A half-written (`.tmp`) folder is never chosen. Under torchrun: without
a restart to spare, a hang fails the run and leaves nothing running; a live process fails the
"gone" check.

Resharding across mesh shapes (section 3): FSDP2 x TP saved on a (2, 2) mesh loads on (1, 2) and
(2, 1) exactly; a model that loaded nothing fails the comparison.

The key measured claim (section 5): with a checkpoint cost C and exponential failures of mean M,
the simulated interval of least wall time is within 15% of Young's sqrt(2 C M)
(`ckpt_bench.assert_best_near_formula`). A simulation whose checkpoints cost 4 C (a C measured
4 times too small) puts the best interval near 2 sqrt(2 C M): it must fail it.
"""
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from machinery import l16_checkpoints as ckpt_bench, l16_reshard_figures as reshard_figures
from helpers.site import shape
from helpers.spawn import spawn

LECTURE = Path(shape.NOTEBOOKS) / "16_checkpoints.ipynb"
SCRIPT = str(Path(shape.NOTEBOOKS) / "ckpt_train.py")
sys.path.insert(0, str(shape.NOTEBOOKS))  # here and in the spawned ranks
import ckpt_train  # noqa: E402

pytestmark = pytest.mark.beside  # times nothing: `make test` runs these beside the rest (Makefile)

STEPS, EVERY = 8, 2
TIMEOUT = 5.0


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory):
    """The restart program's uninterrupted run on 2 ranks (spawned), with its checkpoints."""
    run = tmp_path_factory.mktemp("run")
    reference = spawn(ckpt_train.train, 2, args=(ckpt_train.CFG, STEPS, EVERY, str(run)),
                      backend="gloo")[0]
    assert sorted(os.listdir(run)) == [f"step_{s:05d}" for s in range(EVERY, STEPS + 1, EVERY)]
    return run, reference


def resumed_log(run, reference, tmp_path, restore_rng):
    """Attempt 0's first EVERY steps, then a resume from its step-EVERY checkpoint (a copy)."""
    shutil.copytree(run / f"step_{EVERY:05d}", tmp_path / f"step_{EVERY:05d}")
    resumed = spawn(ckpt_train.train, 2, backend="gloo",
                    args=(ckpt_train.CFG, STEPS, 0, str(tmp_path), None, None, None, restore_rng))[0]
    return [{"attempt": 0, "step": s, "loss": v} for s, v in reference[:EVERY]] + \
        [{"attempt": 1, "step": s, "loss": v} for s, v in resumed]


def test_a_resume_from_a_checkpoint_equals_the_uninterrupted_run(checkpointed, tmp_path):
    run, reference = checkpointed
    log = resumed_log(run, reference, tmp_path, restore_rng=True)
    ckpt_bench.assert_resumed_equal(log, reference)
    assert [r["step"] for r in log if r["attempt"] == 1][0] == EVERY + 1


def test_a_log_without_a_restart_fails_it(checkpointed):
    _, reference = checkpointed
    with pytest.raises(AssertionError, match="no restart"):
        ckpt_bench.assert_resumed_equal([{"attempt": 0, "step": s, "loss": v} for s, v in reference],
                                        reference)


def test_a_resume_without_the_rng_state_fails_it(checkpointed, tmp_path):
    run, reference = checkpointed
    log = resumed_log(run, reference, tmp_path, restore_rng=False)
    with pytest.raises(AssertionError, match="losses differ"):
        ckpt_bench.assert_resumed_equal(log, reference)


def test_a_half_written_checkpoint_is_never_chosen(tmp_path):
    (tmp_path / "step_00004").mkdir()
    (tmp_path / "step_00008.tmp").mkdir()
    (tmp_path / "step_00012.tmp").mkdir()
    (tmp_path / "losses.jsonl").write_text("")
    assert ckpt_train.latest(str(tmp_path)) == (4, "step_00004")
    assert ckpt_train.latest(str(tmp_path / "step_00008.tmp")) is None


def _save_and_load(rank, world, path, load_world):
    """One step and ckpt_train.save on `world` ranks, or (load_world) its resume; the full state."""
    model, opt = ckpt_train.build(world, ckpt_train.CFG)
    if load_world is None:
        x, y = ckpt_train.local_batch(ckpt_train.CFG, rank, world, 0)
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
        ckpt_train.save(os.path.dirname(path), ckpt_train.training_state(model, opt, rank, 1), 1)
    else:
        ckpt_train.resume(os.path.dirname(path), model, opt, rank, restore_rng=False)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    return get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))


def test_saved_on_4_loaded_on_3_is_exact(tmp_path):
    path = str(tmp_path / "step_00001")
    saved = spawn(_save_and_load, 4, args=(path, None), backend="gloo")[0]
    loaded = spawn(_save_and_load, 3, args=(path, 3), backend="gloo")[0]
    for k, v in saved[0].items():
        assert torch.equal(v, loaded[0][k]), k
    for k, s in saved[1]["state"].items():
        for name, v in s.items():
            assert torch.equal(v, loaded[1]["state"][k][name]), (k, name)
    files = ckpt_bench.records(dcp.FileSystemReader(path).read_metadata())
    assert sorted(files) == [f"__{r}_0.distcp" for r in range(4)]


def _load_recorded(rank, world, path):
    """ckpt_train's resume on `world` ranks, its reads noted: [(rank, tensor, file, row, end)]."""
    model, opt = ckpt_train.build(world, ckpt_train.CFG)
    with reshard_figures.recorded_reads() as log:
        ckpt_train.resume(os.path.dirname(path), model, opt, rank, restore_rng=False)
    return [(rank, *r) for r in log]


def _pieces(rows, saved_on, loaded_on, split):
    """The specification lecture 16 draws: loading rank q reads, from each file f, the rows its
    chunk shares with f's; split(rows, n): each rank's (first row, end row)."""
    return [(q, f, max(lo, a), min(hi, b)) for q, (lo, hi) in enumerate(split(rows, loaded_on))
            for f, (a, b) in enumerate(split(rows, saved_on)) if max(lo, a) < min(hi, b)]


def _torch_chunks(rows, n):            # FSDP2's Shard(0), as torch.chunk cuts
    parts = torch.arange(rows).chunk(n)
    return [(int(p[0]), int(p[-1]) + 1) for p in parts]


def _balanced(rows, n):                # a plausible wrong rule: sizes differing by at most one
    parts = np.array_split(np.arange(rows), n)
    return [(int(p[0]), int(p[-1]) + 1) for p in parts if len(p)]


def test_each_rank_reads_what_its_chunk_shares_with_each_file(tmp_path):
    """Saved on 4, resumed on 3: every piece dcp.load read (recorded from its reader's plan) is
    the specification's, for every tensor saved in 4 shards; the balanced split's specification, a
    plausible wrong rule, differs (fc2's 16 rows: 6, 6, 4 against 6, 5, 5)."""
    path = str(tmp_path / "step_00001")
    spawn(_save_and_load, 4, args=(path, None), backend="gloo")
    meta = dcp.FileSystemReader(path).read_metadata()
    got = sorted(r for log in spawn(_load_recorded, 3, args=(path,), backend="gloo") for r in log)
    sharded = lambda n: len(meta.state_dict_metadata[n].chunks) == 4     # noqa: E731 (not RNG)
    names = sorted({n for _, n, *_ in got if sharded(n)})
    assert any(n.endswith("fc2.weight") for n in names), names
    wrong = 0
    for name in names:
        rows = meta.state_dict_metadata[name].size[0]
        read = [(q, f, a, b) for q, n, f, a, b in got if n == name]
        assert read == _pieces(rows, 4, 3, _torch_chunks), (name, read)
        wrong += read != _pieces(rows, 4, 3, _balanced)
    assert wrong                                    # the control: the wrong rule draws otherwise


C, M = 0.03, 180.0   # a checkpoint of 30 ms, a failure every 3 minutes
INTERVALS = ckpt_bench.young_daly(C, M) * np.geomspace(0.2, 5, 25)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_simulated_best_interval_is_young_daly(seed):
    wall = ckpt_bench.simulate(INTERVALS, C, M, work=5000 * M, runs=8, seed=seed)
    ckpt_bench.assert_best_near_formula(ckpt_bench.best_interval(INTERVALS, wall), C, M)


def test_a_checkpoint_cost_4_times_larger_fails_it():
    wall = ckpt_bench.simulate(INTERVALS, 4 * C, M, work=5000 * M, runs=8, seed=0)
    with pytest.raises(AssertionError, match="off by more than"):
        ckpt_bench.assert_best_near_formula(ckpt_bench.best_interval(INTERVALS, wall), C, M)


def test_the_lecture_has_the_shape():
    got = shape.shape(LECTURE)
    assert got["minutes"] <= shape.MINUTES and got["cells over 60"] == 0
    assert got["lines over 88"] == 0 and got["before section 1"] <= shape.BEFORE_SECTION_1
    assert got["wordy prints"] == 0 and got["chosen texts"] == 0


def test_an_async_save_holds_the_values_at_its_call(tmp_path):
    """dcp.async_save's default stager copies before returning: the loop may change the state at
    once, and every save still holds the values of its call (exact)."""
    got = spawn(ckpt_bench.step_times, 2, args=(2**16, 2, str(tmp_path), 0.01), backend="gloo")
    assert all(same for _, same in got)
    assert {m: len(t) for m, t in got[0][0].items()} == {"none": 2, "sync": 2, "async": 2}


def test_a_hang_without_a_restart_to_spare_fails_and_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError, match="torchrun failed"):
        ckpt_bench.torchrun(SCRIPT, str(tmp_path), 2, 2, hang_at=1, pg_timeout=TIMEOUT,
                            max_restarts=0)
    ckpt_bench.assert_gone(int((tmp_path / "hung-once").read_text()))


def test_a_live_process_fails_the_gone_check():
    with pytest.raises(AssertionError, match="still there"):
        ckpt_bench.assert_gone(os.getpid())


def _on_mesh(rank, world, shape, path, mode):
    """mode "save": one step and a save on a (dp, tp) mesh; "load": a load; "fresh": nothing.
    The full state."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict,
                                                         set_state_dict)
    cfg = ckpt_train.CFG
    model, opt = ckpt_train.build_2d(shape, cfg)
    if mode == "save":
        x, y = ckpt_train.local_batch(cfg, rank // shape[1], shape[0], 0)
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
    state = dict(zip(("model", "optim"), get_state_dict(model, opt)))
    if mode == "save":
        dcp.save(state, checkpoint_id=path)
    elif mode == "load":
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
    return get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))


def _equal(a, b):
    (ma, oa), (mb, ob) = a, b
    same = ma.keys() == mb.keys() and oa["state"].keys() == ob["state"].keys()
    return same and all(torch.equal(ma[k], mb[k]) for k in ma) and all(
        torch.equal(v, ob["state"][k][n]) for k, s in oa["state"].items() for n, v in s.items())


def test_fsdp2_x_tp_saved_on_2x2_loads_exactly_on_1x2_and_2x1(tmp_path):
    path = str(tmp_path / "mesh")
    saved = spawn(_on_mesh, 4, args=((2, 2), path, "save"), backend="gloo")
    assert all(_equal(s, saved[0]) for s in saved)
    for shape in [(1, 2), (2, 1)]:
        got = spawn(_on_mesh, 2, args=(shape, path, "load"), backend="gloo")
        assert all(_equal(g, saved[0]) for g in got), shape
    fresh = spawn(_on_mesh, 2, args=((2, 1), path, "fresh"), backend="gloo")
    assert not _equal(fresh[0], saved[0])                 # a load that did nothing fails it
