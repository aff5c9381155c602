"""Lecture 13 (N-D parallelism on a device mesh): its key measured claim with negative controls.

The claim (notebooks/13_nd_parallelism.ipynb, section 1, DTensor): each `redistribute` of a small
float64 tensor on the "tp" dimension of a (2, 2) mesh issues exactly the collective of the lecture's
table (Partial -> Replicate: all-reduce; Partial -> Shard(0): reduce-scatter; Shard(0) -> Replicate:
all-gather; Shard(0) -> Shard(1): all-to-all, which torch 2.13 replaces on CPU by an all-gather and
a local chunk; Replicate -> Shard(0): nothing), on the tp group, sending the ring's bytes
(`assert_redistribute`), and every rank's piece equals the full tensor's. Counts do not depend on
the machine's load. Made wrong on purpose, it must fail:
- a table that maps Partial -> Shard(0) to an all-reduce;
- the table's all-to-all held against the CPU run (no fallback allowed);
- the right table with the bytes of one row off by a factor of two.

Two runs on a mesh, each step equal to one process in float64 and every collective, attributed to
its mesh dimension by machinery.l13_nd_parallelism, equal to the lecture's byte model (calls, N and bytes
sent, exactly; counts do not depend on the load):
- section 1's HSDP step (FSDP2 on a ("replicate", "shard") mesh of (2, 2)), model from
  `fsdp_unit_bytes` and `expected`;
- section 4's data x expert x tensor MoE step on (2, 2, 2), model `moe_bytes` from the one-process
  routing (`moe_reference`'s kept table); an all-to-all's bytes sent are N less the rows the rank
  keeps (counted by mesh_bench from the call's split lists), not the ring's (n-1)/n N;
- section 5's data x context step on (2, 2): a transformer block, lecture 11's zig-zag chunks and
  its ring attention run on the "cp" group, gradients all-reduced over "cp" and "dp"; model:
  3c-2 sends and receives of a rank's K and V on "cp", one all-reduce per parameter tensor on each
  dimension.
Made wrong on purpose, each must fail: a model off by one call (HSDP: one all-reduce fewer on
"replicate"; MoE: the counts exchange left out; context: one ring pass fewer) or, for MoE, one that
bills the uneven all-to-alls the ring's bytes is not what the ranks counted, and a step with one dimension's reduction skipped (HSDP: FSDP2's all-reduce across rows;
MoE: the experts' and router's all-reduces on "dp"; context: the all-reduces on "cp") or its ring
run over the wrong group ("dp" instead of "cp") is not equal to one process. A call on a group
that is no mesh dimension's stops the run (mesh_bench's attribution misses nothing).

The code shown in section 3's markdown is nd3d.py's own, line by line.
"""
import json
import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from course.expert_parallel import expert_mlp, make_router, moe_reference
from course import nd_parallelism
from course.nd_parallelism import (CPU_ALL_TO_ALL, REDISTRIBUTE, assert_redistribute,
                                   cp_parts, cp_step, cp_tokens, expected, fsdp_unit_bytes,
                                   hsdp_split, mlp_parts, mlp_step, moe_bytes, moe_parts,
                                   moe_step, redistribute_calls)
from course.sequence_context_parallel import zigzag
from helpers import patching, tiny
from machinery import l13_nd_parallelism as mesh_bench
from helpers.site import shape
from helpers.spawn import spawn

LECTURE = Path(shape.NOTEBOOKS) / "13_nd_parallelism.ipynb"
SHAPE, TP = (2, 2), 2
FULL = torch.arange(6 * TP ** 2, dtype=torch.float64).view(2 * TP, -1)
N = FULL.numel() * FULL.element_size()


@pytest.fixture(scope="module")
def moved():
    return spawn(redistribute_calls, 4, args=(SHAPE, FULL), backend="gloo")


def _calls(run):
    return {move: calls for move, (calls, _) in run.items()}


def test_every_redistribute_issues_the_tables_collective(moved):
    for r, run in enumerate(moved):
        assert_redistribute(_calls(run), N, TP)
        for (src, dst), (_, local) in run.items():
            k = int(dst[-2]) if dst.startswith("Shard") else None
            want = FULL if k is None else FULL.tensor_split(TP, k)[r % TP]
            torch.testing.assert_close(local, want, rtol=0, atol=0)


def test_a_wrong_table_fails(moved):
    counted = _calls(moved[0])
    wrong_kind = {**REDISTRIBUTE, ("Partial", "Shard(0)"): REDISTRIBUTE["Partial", "Replicate"]}
    with pytest.raises(AssertionError):
        assert_redistribute(counted, N, TP, table=wrong_kind)
    with pytest.raises(AssertionError):                  # the GPU's all-to-all, held against CPU
        assert_redistribute(counted, N, TP, cpu=False)
    kind, sent = REDISTRIBUTE["Shard(0)", "Replicate"]
    wrong_bytes = {**REDISTRIBUTE, ("Shard(0)", "Replicate"): (kind, lambda N, n: 2 * sent(N, n))}
    with pytest.raises(AssertionError):
        assert_redistribute(counted, N, TP, table=wrong_bytes)
    assert CPU_ALL_TO_ALL[1](N, TP) == TP * REDISTRIBUTE["Shard(0)", "Shard(1)"][1](N, TP)


def test_section_3_shows_nd3d_s_own_lines():
    source = {line.strip() for line in (LECTURE.parent / "nd3d.py").read_text().splitlines()}
    cells = json.loads(LECTURE.read_text())["cells"]
    shown = [line.strip() for c in cells if c["cell_type"] == "markdown"
             for block in re.findall(r"```python\n(.*?)```", "".join(c["source"]), re.S)
             for line in block.splitlines() if line.strip()]
    assert len(shown) >= 8
    assert [line for line in shown if line not in source] == []


# ------------------------------------------------------------------ HSDP and data x expert x tensor

TIGHT = dict(rtol=1e-12, atol=1e-12)          # float64: only the summation order differs
HSDP, MLP = ("replicate", "shard"), dict(dim=32, hidden=128, depth=2, batch=8)
MOE = dict(dim=16, experts=4, k=2, tokens=128)             # section 4's layer, as the lecture's
MOE_SHAPE, MOE_NAMES = (2, 2, 2), ("dp", "ep", "tp")


def _skipping(dim, step):
    """`step` with every dist.all_reduce on mesh dimension `dim`'s group left out."""
    def skipped(mesh, *parts):
        skip = mesh.get_group(dim)

        def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
            return None if group is skip else real["all_reduce"](tensor, op, group, async_op)

        with patching.patched(dist, all_reduce=all_reduce) as real:
            return step(mesh, *parts)
    return skipped


def _hsdp(step=mlp_step):
    return mesh_bench.run(mlp_parts, step, (2, 2), HSDP, args=(hsdp_split, HSDP, MLP),
                          backend="gloo")


def _hsdp_reference():
    model = tiny.model(MLP["dim"], MLP["hidden"], MLP["depth"], seed=0)
    x, y = tiny.batch(MLP["batch"], MLP["dim"], seed=1)
    tiny.loss(model(x), y).backward()
    return {n: p.grad for n, p in model.named_parameters()}


def _hsdp_model(replicate_calls):
    h, H, L = MLP["dim"], MLP["hidden"], MLP["depth"]
    unit = fsdp_unit_bytes([(H, h), (H,), (h, H), (h,)], 2)
    return expected({"shard": {"all_gather": [(2 * L, unit)], "reduce_scatter": [(L, unit)]},
                     "replicate": {"all_reduce": [(replicate_calls, unit // 2)]}},
                    dict(replicate=2, shard=2))


@pytest.fixture(scope="module")
def hsdp_runs():
    return _hsdp()


def test_hsdp_equals_one_process_and_counts_exactly_its_model(hsdp_runs):
    grads = _hsdp_reference()
    for run in hsdp_runs:
        torch.testing.assert_close(run["grads"], grads, **TIGHT)
        assert mesh_bench.per_dimension(run["log"], HSDP) == _hsdp_model(MLP["depth"])
        where = run["placements"]            # mesh_bench: each DTensor's placements, on the rank
        assert sorted(where) == sorted(f"grads.{n}" for n in grads)
        assert set(where.values()) == {"(Replicate(), Shard(dim=0))"}


def test_an_hsdp_model_off_by_one_all_reduce_fails(hsdp_runs):
    for run in hsdp_runs:
        assert mesh_bench.per_dimension(run["log"], HSDP) != _hsdp_model(MLP["depth"] - 1)


def test_hsdp_without_its_all_reduce_across_rows_is_not_one_process():
    grads = _hsdp_reference()
    for run in _hsdp(_skipping("replicate", mlp_step)):
        assert "all_reduce" not in mesh_bench.per_dimension(run["log"], HSDP)["replicate"]
        with pytest.raises(AssertionError):
            torch.testing.assert_close(run["grads"], grads, **TIGHT)


def _moe(step=moe_step):
    return mesh_bench.run(moe_parts, step, MOE_SHAPE, MOE_NAMES, args=(MOE,), backend="gloo")


def _moe_reference():
    h, E, k, B = MOE.values()
    router, experts = make_router(h, E), [expert_mlp(h, 1 + e) for e in range(E)]
    x, y = tiny.batch(B, h, seed=3)
    x.requires_grad_()
    out, kept = moe_reference(x, router, experts, k, None, 4)
    ((out - y) ** 2).sum().backward()
    return router, experts, x.grad, kept


def _coords(rank):                       # (dp, ep) of a rank of the row-major (2, 2, 2) mesh
    return rank // 4, rank // 2 % 2


@pytest.fixture(scope="module")
def moe_runs():
    return _moe()


def _assert_moe_equal(run, rank, reference):
    router, experts, x_grad, _ = reference
    i, j = _coords(rank)
    mine = [p.grad for ex in experts[2 * j:2 * j + 2] for p in ex.parameters()]
    torch.testing.assert_close((run["experts"], run["router"], run["x"]),
                               (mine, router.weight.grad, x_grad.split(32)[2 * i + j]), **TIGHT)


def test_data_expert_tensor_equals_one_process_and_counts_exactly_its_model(moe_runs):
    reference = _moe_reference()
    for rank, run in enumerate(moe_runs):
        _assert_moe_equal(run, rank, reference)
        model = moe_bytes(reference[3], *_coords(rank), MOE, MOE_SHAPE)
        assert mesh_bench.per_dimension(run["log"], MOE_NAMES) == model


def test_a_moe_model_that_leaves_out_the_counts_exchange_fails(moe_runs):
    kept = _moe_reference()[3]
    for rank, run in enumerate(moe_runs):
        model = moe_bytes(kept, *_coords(rank), MOE, MOE_SHAPE)
        calls, N, sent = model["ep"]["all_to_all"]
        model["ep"]["all_to_all"] = [calls - 1, N - 8 * MOE["experts"], sent - 4 * MOE["experts"]]
        assert mesh_bench.per_dimension(run["log"], MOE_NAMES) != model


def test_a_moe_model_billing_the_all_to_alls_the_ring_s_bytes_fails(moe_runs):
    kept = _moe_reference()[3]
    for rank, run in enumerate(moe_runs):
        model = moe_bytes(kept, *_coords(rank), MOE, MOE_SHAPE)
        calls, N, _ = model["ep"]["all_to_all"]
        model["ep"]["all_to_all"] = [calls, N, N // 2]     # (e-1)/e N: an even split's
        assert mesh_bench.per_dimension(run["log"], MOE_NAMES) != model


def _uneven(mesh, splits):
    """One all-to-all on "ep", this rank sending splits[rank] rows of 4 float64 values."""
    mine = splits[dist.get_rank()]
    got = torch.empty(sum(row[dist.get_rank()] for row in splits), 4, dtype=torch.float64)
    dist.all_to_all_single(got, torch.ones(sum(mine), 4, dtype=torch.float64),
                           [row[dist.get_rank()] for row in splits], mine,
                           group=mesh.get_group("ep"))
    dist.all_to_all_single(torch.empty(2), torch.ones(2), group=mesh.get_group("ep"))  # even
    return {}


def test_an_uneven_all_to_all_sends_all_but_the_rows_a_rank_keeps():
    splits = [[3, 1], [2, 0]]                      # rows rank i sends rank j
    runs = mesh_bench.run(lambda mesh: (splits,), _uneven, (2,), ("ep",), backend="gloo")
    for rank, run in enumerate(runs):
        (_, _, N, sent), (_, _, N2, sent2) = run["log"]
        assert N == 32 * sum(splits[rank]) and N2 == 8
        assert sent == 32 * splits[rank][1 - rank] and sent2 == 4    # the other rank's rows
    assert [run["log"][0][3] for run in runs] == [32, 64]          # the ring would say 64, 32


def test_data_expert_tensor_without_its_dp_reduction_is_not_one_process():
    reference = _moe_reference()
    for rank, run in enumerate(_moe(_skipping("dp", moe_step))):
        assert "all_reduce" not in mesh_bench.per_dimension(run["log"], MOE_NAMES)["dp"]
        with pytest.raises(AssertionError):
            _assert_moe_equal(run, rank, reference)


def _off_the_mesh(mesh):
    dist.all_reduce(torch.ones(1))                       # the world's group: no mesh dimension's
    return {}


def test_a_call_on_a_group_of_no_mesh_dimension_stops_the_run():
    with pytest.raises(Exception, match="not a mesh dimension's group"):
        mesh_bench.run(lambda mesh: (), _off_the_mesh, (2, 2), ("dp", "tp"), backend="gloo")
    with pytest.raises(ValueError, match="needs 2 names"):
        mesh_bench.run(lambda mesh: (), _off_the_mesh, (2, 2), ("dp",))


# ------------------------------------------------------------------ data x context (section 5)

CP = dict(dim=16, heads=2, seq=16, batch=4)               # section 5's block, as the lecture's
CP_SHAPE, CP_NAMES = (2, 2), ("dp", "cp")


def _cp(step=cp_step):
    return mesh_bench.run(cp_parts, step, CP_SHAPE, CP_NAMES, args=(CP,), backend="gloo")


def _cp_reference():
    h, a, s, B = CP.values()
    block = tiny.transformer(dim=h, heads=a, depth=1, max_seq=s, seed=0).blocks[0]
    x, y = (t.view(B, s, h) for t in tiny.batch(B * s, h, seed=4))
    x.requires_grad_()
    out = block(x)
    ((out - y) ** 2).sum().backward()
    return block, out.detach(), x.grad


def _assert_cp_equal(run, rank, reference):
    block, out, x_grad = reference
    i, j = rank // 2, rank % 2                        # (dp, cp) of the row-major (2, 2) mesh
    want = [cp_tokens(t[2 * i:2 * i + 2], zigzag(2)[j], 4) for t in (out, x_grad)]
    grads = {n: p.grad for n, p in block.named_parameters()}
    torch.testing.assert_close((run["out"], run["x"], run["grads"]), (*want, grads), **TIGHT)


def _cp_model(block, passes):
    kv = 2 * 2 * 8 * CP["dim"] * 8                    # K and V of 2 sequences x 8 tokens
    grads = [(1, 8 * p.numel()) for p in block.parameters()]
    return expected({"cp": {"send": [(passes, kv)], "recv": [(passes, kv)], "all_reduce": grads},
                     "dp": {"all_reduce": grads}}, dict(dp=2, cp=2))


@pytest.fixture(scope="module")
def cp_runs():
    return _cp()


def test_data_context_equals_one_process_and_counts_exactly_its_model(cp_runs):
    reference = _cp_reference()
    for rank, run in enumerate(cp_runs):
        _assert_cp_equal(run, rank, reference)
        assert mesh_bench.per_dimension(run["log"], CP_NAMES) == _cp_model(reference[0], 4)


def test_a_context_model_one_ring_pass_short_fails(cp_runs):
    block = _cp_reference()[0]
    for run in cp_runs:
        assert mesh_bench.per_dimension(run["log"], CP_NAMES) != _cp_model(block, 3)


def _ring_on_dp(mesh, *parts):
    """cp_step with its ring attention run on the "dp" group instead of "cp"."""
    real = nd_parallelism.ring_attention

    def on_dp(q, k, v, chunks, group):
        return real(q, k, v, chunks, mesh.get_group("dp"))

    with patching.patched(nd_parallelism, ring_attention=on_dp):
        return cp_step(mesh, *parts)


def test_a_ring_over_the_wrong_group_is_not_one_process():
    reference, runs = _cp_reference(), _cp(_ring_on_dp)
    for run in runs:                                  # the ring's calls went to "dp"
        assert "send" in mesh_bench.per_dimension(run["log"], CP_NAMES)["dp"]
    with pytest.raises(AssertionError):
        for rank, run in enumerate(runs):
            _assert_cp_equal(run, rank, reference)


def test_data_context_without_its_cp_reduction_is_not_one_process():
    reference = _cp_reference()
    for rank, run in enumerate(_cp(_skipping("cp", cp_step))):
        assert "all_reduce" not in mesh_bench.per_dimension(run["log"], CP_NAMES)["cp"]
        with pytest.raises(AssertionError):
            _assert_cp_equal(run, rank, reference)


def _unbilled_extra(rank, world_size, *args):
    """nd3d with a collective its bill leaves out: every all-reduce issued twice, billed once (the
    sum then twice as large: only the bytes matter here)."""
    import nd3d
    billed = nd3d.all_reduce

    def twice(comm, dim, t):
        if comm["size"][dim] > 1:
            dist.all_reduce(t.clone(), group=comm["group"][dim])
        return billed(comm, dim, t)
    nd3d.all_reduce = twice
    return mesh_bench.traced_nd3d(rank, world_size, *args)


def _world_call(rank, world_size, *args):
    """nd3d with a stray all-reduce on the world group before each step's pipeline (every rank
    makes it, so nothing hangs), outside every mesh dimension."""
    import nd3d
    pipeline = nd3d.pipeline

    def stray(*a):
        dist.all_reduce(torch.zeros(1, dtype=torch.float64))
        return pipeline(*a)
    nd3d.pipeline = stray
    return mesh_bench.traced_nd3d(rank, world_size, *args)


def test_section_3_traces_nd3d_s_bytes_and_an_unbilled_call_shows():
    """Section 3's bytes come from helpers.trace around nd3d.train (the expert read's 'self-billed'
    finding): on a (2, 2, 2) mesh they equal nd3d's own bill per dimension; a run whose all-reduces
    are issued twice and billed once keeps its bill but is traced at twice the tp and dp bytes."""
    import nd3d
    cfg, args = dict(nd3d.CFG, depth=4, batch=8), (2, 2, 2)
    right = spawn(mesh_bench.traced_nd3d, 8, args=(*args, cfg, 1, 2))
    for out in right:
        assert out["traced"] == pytest.approx(out["bytes"]), (out["traced"], out["bytes"])
    extra = spawn(_unbilled_extra, 8, args=(*args, cfg, 1, 2))
    for out, ok in zip(extra, right):
        assert out["bytes"] == pytest.approx(ok["bytes"])
        assert out["traced"]["tp"] == pytest.approx(2 * ok["traced"]["tp"])
        assert out["traced"]["dp"] == pytest.approx(2 * ok["traced"]["dp"])
    with pytest.raises(Exception, match="not a mesh dimension's group"):
        spawn(_world_call, 8, args=(*args, cfg, 1, 2), timeout=60)
    alone = spawn(mesh_bench.traced_nd3d, 2, args=(1, 1, 2, cfg, 1, 2))   # pp alone: the world's
    assert [out["traced"] for out in alone] == [pytest.approx(out["bytes"]) for out in alone]
