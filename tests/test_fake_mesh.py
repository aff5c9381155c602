"""Tests of notebooks/machinery/l14_planner/fake_mesh.py: one training step of a 1,024-rank layout (h = 4096, 32 heads) counted
on torch's fake process group, per mesh dimension, against (1) a model of what torch's wrappers issue,
written here by hand, exact; (2) the planner's communication terms (planner.traffic), exact where
they agree and with every difference named and sized. Negative controls: a counter that loses a
dimension, and a layout off by one factor, fail the comparison. Two counts, a few seconds each."""
import pytest

from machinery.l14_planner import fake_mesh
from machinery import l14_planner as planner

H, HEADS, LAYERS, SEQ = 4096, 32, 2, 32
MODEL = fake_mesh.stack_model(LAYERS, H, HEADS, SEQ)   # 4 linear h x h, h x 4h twice; 2 LayerNorms
# (dp, tp): Megatron's full recomputation (whole block re-run), no sequence parallelism, 2 micro-batches
PLAIN = dict(dp=128, tp=8, micro_batches=2, recompute="full", early_stop=False)
# (dp, cp, tp): sequence parallelism, context parallelism, torch's default checkpoint (early stop)
THREE_D = dict(dp=32, cp=4, tp=8, micro_batches=1, recompute="full", early_stop=True,
               sequence_parallel=True)
# (dp, tp): sequence parallelism and torch's default checkpoint: where torch and the planner differ
SP = dict(dp=128, tp=8, micro_batches=1, recompute="full", early_stop=True, sequence_parallel=True)


@pytest.fixture(scope="module")
def counted():
    return dict(zip(("plain", "three_d", "sp"), fake_mesh.counts(MODEL, [PLAIN, THREE_D, SP])))


@pytest.fixture(scope="module")
def plain(counted):
    return counted["plain"]


@pytest.fixture(scope="module")
def sp(counted):
    return counted["sp"]


def traffic(spec, batch=None, **change):
    """planner.traffic for a count's layout (pp = 1, ZeRO-3 = FSDP2, b = 1; global batch dp m)."""
    batch = batch or spec["dp"] * spec["micro_batches"]
    spec = {**spec, **change}
    return planner.traffic(MODEL, batch, 1, spec["dp"], spec["tp"], 1, zero=3, recompute=spec["recompute"],
                           sequence_parallel=spec.get("sequence_parallel", False))


def by_hand(dp, tp, cp=1, micro_batch=1, micro_batches=1, sequence_parallel=False, recompute="full",
            early_stop=False):
    """What torch 2.13's wrappers issue for this stack, per dimension: {dim: {kind: (calls, S)}}."""
    L, m, b, s = LAYERS, micro_batches, micro_batch, SEQ
    act = 2 * b * (s // cp) * H                       # one bf16 b x s/cp x h activation: Megatron's S
    full = recompute == "full"
    redo_last = full and not early_stop               # early stop: the block's last reduction not redone
    # per block and micro-batch, Megatron's f and g: 2 forward, 2 backward, 2 in the recomputed forward
    # (all-reduces; with sequence parallelism all-gathers and reduce-scatters, each other's backward)
    first, last = L * m * (4 + 2 * full), L * m * (4 + full + redo_last)
    if sequence_parallel:                             # + each norm's weight and bias gradient: Partial on tp
        tensor = {"all_gather": (first, first * act), "reduce_scatter": (last, last * act),
                  "all_reduce": (4 * L * m, 4 * L * m * 2 * H)}
    else:
        tensor = {"all_reduce": (last, last * act)}
    # FSDP2: per block and micro-batch, all-gather forward and backward (not again for the
    # recomputation), reduce-scatter; S = the block's tp-local bf16 weights (norms not split by tp)
    unit = 2 * (12 * H * H // tp + 4 * H)
    data = {"all_gather": (2 * L * m, 2 * L * m * unit), "reduce_scatter": (L * m, L * m * unit)}
    out = {"tensor": tensor, "data": data}
    if cp > 1:                                        # K and V gathered over the whole sequence
        kv = 2 * b * s * H // tp
        out["context"] = {"all_gather": (2 * L * m * (1 + full), 2 * L * m * (1 + full) * kv),
                          "reduce_scatter": (2 * L * m, 2 * L * m * kv)}
    return out


def as_counted(expected):
    return {dim: {"calls": sum(c for c, _ in kinds.values()), "bytes": sum(n for _, n in kinds.values()),
                  "kind": {k: c for k, (c, _) in kinds.items()}} for dim, kinds in expected.items()}


@pytest.mark.parametrize("name", ["plain", "three_d", "sp"])
def test_counts_equal_the_model_of_torch(name, counted):
    counted, spec = counted[name], {"plain": PLAIN, "three_d": THREE_D, "sp": SP}[name]
    expected = by_hand(**spec)
    assert set(counted) - {"seconds", "step_seconds", "params"} == set(expected)   # no "other" group
    for dim, kinds in expected.items():
        got = counted[dim]
        assert got["kind"] == {k: c for k, (c, _) in kinds.items()}, (dim, got)
        assert got["kind_bytes"] == {k: n for k, (_, n) in kinds.items()}, (dim, got)
        assert got["phase"].get("optimizer", 0) == 0          # the SGD step of sharded DTensors: local
    sizes = {"tensor": spec["tp"], "data": spec["dp"] * spec.get("cp", 1), "context": spec.get("cp")}
    assert {dim: counted[dim]["ranks"] for dim in expected} == {dim: sizes[dim] for dim in expected}
    assert counted["params"] == MODEL["params"]
    rows = fake_mesh.compare(counted, as_counted(expected), dims=tuple(expected))
    assert all(r["equal"] for r in rows)


def test_planner_equals_torch_on_megatrons_layout(plain):
    """1,024 ranks, (dp, tp) = (128, 8), ZeRO-3, full recomputation, 2 micro-batches: every dimension's
    calls and bytes (nccl-tests' S summed) equal planner.traffic's, exactly."""
    rows = fake_mesh.compare(plain, traffic(PLAIN))
    assert all(r["equal"] for r in rows), rows
    for dim in ("tensor", "data"):
        assert plain[dim]["kind"] == traffic(PLAIN)[dim]["kind"]


def test_where_the_planner_and_torch_differ(sp):
    """Sequence parallelism with torch's default checkpoint: tensor differs, by two named things;
    data still equal. (1) SequenceParallel norms' weight and bias gradients are Partial on tp: one
    all-reduce of 2h bytes each, 4 per layer and micro-batch (Megatron all-reduces them once per
    step, coalesced); the planner leaves them out. (2) torch's checkpoint stops recomputing once the
    saved tensors are back (early stop): the block's last reduce-scatter is not redone, 1 per layer and
    micro-batch fewer than Megatron's whole-layer recomputation, which the planner counts."""
    model = traffic(SP)
    lm, act = LAYERS * SP["micro_batches"], 2 * SEQ * H
    assert fake_mesh.compare(sp, model, dims=("data", "pipeline"))[0]["equal"]
    got, want = sp["tensor"], model["tensor"]
    assert got["kind"]["all_reduce"] - want["kind"].get("all_reduce", 0) == 4 * lm
    assert got["kind_bytes"]["all_reduce"] - want["kind_bytes"].get("all_reduce", 0) == 4 * lm * 2 * H
    assert want["kind"]["reduce_scatter"] - got["kind"]["reduce_scatter"] == lm
    assert want["kind_bytes"]["reduce_scatter"] - got["kind_bytes"]["reduce_scatter"] == lm * act
    assert got["kind"]["all_gather"] == want["kind"]["all_gather"]
    assert got["kind_bytes"]["all_gather"] == want["kind_bytes"]["all_gather"]


def test_negative_controls_fail(plain):
    for expected in (as_counted(by_hand(**PLAIN)), traffic(PLAIN)):
        dropped = {k: v for k, v in plain.items() if k != "tensor"}   # a counter that lost tp's group
        assert not all(r["equal"] for r in fake_mesh.compare(dropped, expected))
    # one factor off: tp; dp at the same global batch (S does not depend on the group's size: the
    # data group's size is checked in test_counts_equal_the_model_of_torch); the recomputation
    for off in (as_counted(by_hand(**{**PLAIN, "tp": 4})), traffic(PLAIN, tp=4),
                traffic(PLAIN, dp=64, batch=256), as_counted(by_hand(**{**PLAIN, "early_stop": True}))):
        assert not all(r["equal"] for r in fake_mesh.compare(plain, off))


def test_bad_layout_is_refused_before_a_process_starts():
    with pytest.raises(ValueError, match="heads"):
        fake_mesh.count(MODEL, dp=128, tp=3)
    with pytest.raises(ValueError, match="sequence"):
        fake_mesh.count({**MODEL, "seq": 60}, dp=16, tp=8, sequence_parallel=True)
