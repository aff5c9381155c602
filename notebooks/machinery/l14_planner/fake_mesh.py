"""Count one training step's collectives on a mesh of 64 to 1,024 ranks, in one process, on a laptop.

    from machinery.l14_planner import fake_mesh
    from machinery import l14_planner as planner
    model = fake_mesh.stack_model(layers=2, hidden=4096, heads=32, seq=64)   # planner's model dict
    counted = fake_mesh.count(model, dp=128, tp=8)          # {"data": {...}, "tensor": {...}, ...}
    counted["tensor"]          # {"calls": 12, "bytes": ..., "kind": {"all_reduce": 12}, "kind_bytes": ...}
    fake_mesh.compare(counted, planner.traffic(model, 128, 1, 128, 8, 1, zero=3))   # rows, equal?

How: torch's fake process group (`init_process_group("fake", store=FakeStore(), rank=0,
world_size=dp*cp*tp)`) plays rank 0 of the whole mesh; every collective returns at once without
sending anything (its output holds wrong values: only shapes and calls are real). On it, torch's own
wrappers are applied to a stack of transformer blocks at the model's real width: DTensor tensor
parallelism (ColwiseParallel / RowwiseParallel, SequenceParallel for the norms when
sequence_parallel) over "tp", FSDP2 `fully_shard` (ZeRO-3) per block over "dp" (over "dp" x "cp"
flattened when cp > 1), activation checkpointing per block (recompute="full"). The weights are made
on the meta device and materialised shard by shard, so a 1,024-rank layout of h = 4096 holds one
rank's share. One step (micro_batches forwards and backwards, an SGD step) runs under
helpers.trace, and every call is attributed to its mesh dimension by its process group.

It runs in a fresh Python process (`python -m machinery.l14_planner.fake_mesh SPEC_JSON`, which prints JSON), so
the caller's process group, if any, is never touched and nothing is left running; a count takes a
few seconds.

Dimension names follow machinery.l14_planner.traffic: "data" (FSDP's group), "tensor" ("tp"), "context"
("cp": K and V all-gathered along the sequence, by hand, as in Llama 3's context parallelism; torch's
own context_parallel handles only the CUDA attention kernels). A call on any other group is kept
under "other". Pipeline parallelism is not built here (the fake group runs one rank: a stage's
send/recv to its neighbours is one call each, not a schedule).
"""
import json
import subprocess
import sys
import time
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parents[2]  # where `python -m machinery.l14_planner.fake_mesh` is found
DIMS = {"dp": "data", "dp_cp": "data", "tp": "tensor", "cp": "context"}


def stack_model(layers, hidden, heads, seq):
    """The planner's model dict of the stack counted here, with its parameters placed as they are:
    per layer 12 h^2 split by tp (q, k, v, o: h x h; the MLP: h x 4h, 4h x h; no biases) and 4 h
    whole (two LayerNorms' weight and bias, replicated on tp); no embedding or head (vocab 0)."""
    return {"layers": layers, "hidden": hidden, "heads": heads, "vocab": 0, "seq": seq,
            "params": layers * (12 * hidden * hidden + 4 * hidden),
            "layer_split": 12 * hidden * hidden, "layer_whole": 4 * hidden}


def check(model, dp, tp, cp=1, micro_batch=1, micro_batches=1, sequence_parallel=False,
          recompute="full"):
    """The reason this layout cannot be counted, or None."""
    h, a, s = model["hidden"], model["heads"], model["seq"]
    for name, v in (("dp", dp), ("tp", tp), ("cp", cp), ("micro_batch", micro_batch),
                    ("micro_batches", micro_batches), ("layers", model["layers"])):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            return f"{name} must be a whole number >= 1, got {v!r}"
    if dp * tp * cp > 4096:
        return f"dp*tp*cp = {dp * tp * cp} ranks: at most 4,096 here"
    if h % a or a % tp:
        return f"tp={tp} must divide the {a} heads, and the heads the hidden size {h}"
    if s % (cp * (tp if sequence_parallel else 1)):
        return f"the sequence {s} must split over cp (x tp with sequence parallelism)"
    if recompute not in ("none", "full"):
        return f"recompute must be 'none' or 'full' (block-wise checkpointing), got {recompute!r}"
    return None


def count(model, dp, tp, cp=1, micro_batch=1, micro_batches=1, sequence_parallel=False,
          recompute="full", early_stop=False, timeout=120):
    """One step's collectives per dimension, counted in a fresh process (see the module's docstring).
    early_stop: torch's checkpoint stops recomputing once the saved tensors are back (its default,
    True); False re-runs the whole block, as Megatron's full recomputation does."""
    return counts(model, [dict(dp=dp, tp=tp, cp=cp, micro_batch=micro_batch,
                               micro_batches=micro_batches, sequence_parallel=sequence_parallel,
                               recompute=recompute, early_stop=early_stop)], timeout)[0]


def counts(model, layouts, timeout=120):
    """count() for several layouts (dicts of count's arguments), each in a fresh process; the
    processes run at once (they count, nothing is timed)."""
    specs = []
    for layout in layouts:
        layout = {"cp": 1, "micro_batch": 1, "micro_batches": 1, "sequence_parallel": False,
                  "recompute": "full", "early_stop": False, **layout}
        why = check(model, **{k: v for k, v in layout.items() if k != "early_stop"})
        if why:
            raise ValueError(why)
        specs.append({"model": model, **layout})
    return _run(specs, timeout)


def _run(specs, timeout):
    """Each count in its own process (a second mesh in the same process would meet the first one's
    cached groups after destroy_process_group), all started at once; their results in order."""
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "machinery.l14_planner.fake_mesh", json.dumps(spec)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=NOTEBOOKS)
             for spec in specs]
    outs = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=max(1.0, start + timeout - time.perf_counter()))
            if proc.returncode:
                raise RuntimeError(f"the fake-mesh count failed:\n{stderr[-3000:]}")
            outs.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for proc in procs:             # a failure or a timeout leaves none running
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outs


def compare(counted, expected, dims=("tensor", "pipeline", "data")):
    """One row per dimension: torch's calls and bytes beside the expected ones (planner.traffic's
    shape: {dim: {"calls", "bytes"}}); a dimension missing from either side counts as 0 calls."""
    rows = []
    for dim in dims:
        got, want = counted.get(dim, {}), expected.get(dim, {})
        row = {"dim": dim, "calls": got.get("calls", 0), "bytes": got.get("bytes", 0),
               "model calls": want.get("calls", 0), "model bytes": want.get("bytes", 0)}
        row["equal"] = (row["calls"], row["bytes"]) == (row["model calls"], row["model bytes"])
        rows.append(row)
    return rows


# ------------------------------------------------------------------ inside the fresh process

def _stack(model, cp_group, full):
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    h, a = model["hidden"], model["heads"]

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.wq, self.wk, self.wv, self.wo = (nn.Linear(h, h, bias=False) for _ in range(4))

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = (w(x).view(b, t, -1, h // a).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
            if cp_group is not None:        # every rank's K and V for its queries: all-gather on cp
                from torch.distributed._functional_collectives import all_gather_tensor_autograd
                k, v = (all_gather_tensor_autograd(z.contiguous(), 2, cp_group) for z in (k, v))
            o = F.scaled_dot_product_attention(q, k, v)     # (a causal mask would need offsets)
            return self.wo(o.transpose(1, 2).reshape(b, t, -1))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1, self.w2 = nn.Linear(h, 4 * h, bias=False), nn.Linear(4 * h, h, bias=False)

        def forward(self, x):
            return self.w2(F.gelu(self.w1(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.attn, self.n2, self.mlp = nn.LayerNorm(h), Attention(), nn.LayerNorm(h), MLP()

        def forward(self, x):
            x = x + self.attn(self.n1(x))
            return x + self.mlp(self.n2(x))

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(model["layers"]))

        def forward(self, z):
            for block in self.blocks:
                z = checkpoint(block, z, use_reentrant=False) if full else block(z)
            return z

    return Stack()


def _tp_plan(sequence_parallel):
    """Megatron's layout in DTensor (as torchtitan writes it): one all-gather/all-reduce of the
    block's input per attention and MLP (PrepareModuleInput keeps a DTensor, so q, k, v share it)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel)

    seq = Shard(1) if sequence_parallel else Replicate()
    plan = {}
    for part, cols, row in (("attn", ("wq", "wk", "wv"), "wo"), ("mlp", ("w1",), "w2")):
        plan[part] = PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),),
                                        use_local_output=False)
        plan.update({f"{part}.{c}": ColwiseParallel() for c in cols})
        plan[f"{part}.{row}"] = RowwiseParallel(output_layouts=seq)
    if sequence_parallel:
        plan.update({"n1": SequenceParallel(), "n2": SequenceParallel()})
    return plan


def _summary(log, names):
    out = {}
    for c in log.calls:
        dim = names.get(c.group, "other")
        d = out.setdefault(dim, {"calls": 0, "bytes": 0, "kind": {}, "kind_bytes": {}, "phase": {},
                                 "ranks": c.size})
        if d["ranks"] != c.size:
            raise RuntimeError(f"groups of {d['ranks']} and {c.size} ranks both counted as {dim}")
        d["calls"] += 1
        d["bytes"] += c.nbytes
        d["kind"][c.kind] = d["kind"].get(c.kind, 0) + 1
        d["kind_bytes"][c.kind] = d["kind_bytes"].get(c.kind, 0) + c.nbytes
        d["phase"][c.phase] = d["phase"].get(c.phase, 0) + 1
    return out


def _count_here(spec):
    """Build the fake mesh and the model, run one step under the tracer: the per-dimension summary."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils.checkpoint import set_checkpoint_early_stop

    from helpers import trace

    model, dp, tp, cp = spec["model"], spec["dp"], spec["tp"], spec["cp"]
    sp, full = spec["sequence_parallel"], spec["recompute"] == "full"
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=dp * cp * tp)
    try:
        if cp > 1:
            mesh = init_device_mesh("cpu", (dp, cp, tp), mesh_dim_names=("dp", "cp", "tp"))
            shard_mesh, cp_group = mesh["dp", "cp"]._flatten("dp_cp"), mesh.get_group("cp")
        else:
            mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
            shard_mesh, cp_group = mesh["dp"], None
        names = {mesh.get_group(d).group_name: DIMS[d] for d in mesh.mesh_dim_names}
        names[shard_mesh.get_group().group_name] = "data"
        with torch.device("meta"):
            stack = _stack(model, cp_group, full).to(torch.bfloat16)
        for block in stack.blocks:
            parallelize_module(block, mesh["tp"], _tp_plan(sp))
            fully_shard(block, mesh=shard_mesh)
        fully_shard(stack, mesh=shard_mesh)
        stack.to_empty(device="cpu")
        with torch.no_grad():
            for p in stack.parameters():
                p.normal_(0, 0.02)
        optim = torch.optim.SGD(stack.parameters(), lr=1e-3)
        rows = model["seq"] // (cp * (tp if sp else 1))
        x = torch.randn(spec["micro_batch"], rows, model["hidden"], dtype=torch.bfloat16)

        start = time.perf_counter()
        with trace.calls(strict=True) as log, set_checkpoint_early_stop(spec["early_stop"]):
            for _ in range(spec["micro_batches"]):
                log.phase = "forward"
                loss = stack(x).float().pow(2).mean()
                log.phase = "backward"
                loss.backward()
            log.phase = "optimizer"
            optim.step()
            optim.zero_grad()
        out = _summary(log, names)
        out["step_seconds"] = time.perf_counter() - start
        out["params"] = sum(p.numel() for p in stack.parameters())   # global (DTensor sizes)
        return out
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    print(json.dumps(_count_here(json.loads(sys.argv[1]))))
