"""3D parallelism, data x tensor x pipeline, on the series' tiny GPT, from the lectures' own pieces.

    res = spawn(nd3d.train, 8, args=(2, 2, 2, nd3d.CFG, 3, 2))   # dp, tp, pp, cfg, steps, micro-batches
    nd3d.check(res, nd3d.CFG, 3)          # equal to the single process (notebooks/machinery/l13_nd3d_check.py), float64

The ranks form a (pp, dp, tp) DeviceMesh: tp varies fastest, so a tensor-parallel group is ranks that
sit next to each other (on one node, on NVLink), and pp varies slowest (across nodes). Per step:
lecture 08's 1F1B schedule over the pp group (point-to-point), inside every stage lecture 07's f/g
all-reduces over the tp group, and after the schedule lecture 05's gradient all-reduce over dp.
Every collective goes through `all_reduce` and the pipeline's `send` below, which `count` the calls
and the bytes this rank sends: the ring model for an all-reduce (2(n-1)/n of an N-byte tensor over
n ranks), the tensor's bytes for a send. A group of one is not called and sends nothing.

Under torchrun (from the repo root): torchrun --nproc-per-node 8 notebooks/nd3d.py [--dp 2 --tp 2 --pp 2];
without it, `python notebooks/nd3d.py` starts dp*tp*pp ranks with helpers.spawn.
"""
import argparse
import os
import sys

for _root in (os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.getcwd()):
    if os.path.isdir(os.path.join(_root, "helpers")) and _root not in sys.path:
        sys.path.insert(0, _root)  # so `helpers` imports when torchrun runs this file

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from helpers import timing, tiny
from machinery.l13_nd3d_check import check  # the lecture and the tests call it as nd3d.check
from helpers.spawn import device, resolve_backend, spawn

CFG = dict(vocab=64, dim=32, heads=4, depth=4, seq=16, batch=8, lr=0.1)
DIMS = ("pp", "dp", "tp")


# ------------------------------------------------------------------ counted communication

def all_reduce(comm, dim, t):
    """Sum t in place over the mesh dimension `dim`; count the call and the ring's bytes sent."""
    n = comm["size"][dim]
    if n > 1:  # a group of one has nothing to sum: no call, no bytes
        dist.all_reduce(t, group=comm["group"][dim])
        count(comm, dim, "all_reduce", 2 * (n - 1) / n * t.numel() * t.element_size())
    return t


def count(comm, dim, kind, sent):
    comm["bytes"][dim] += sent
    comm["calls"][dim][kind] = comm["calls"][dim].get(kind, 0) + 1


class CopyToTP(torch.autograd.Function):
    """f (lecture 07): identity forward; all-reduce of the gradient over tp backward."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(ctx.comm, "tp", grad.contiguous().clone()), None


class ReduceFromTP(torch.autograd.Function):
    """g (lecture 07): all-reduce over tp forward; identity backward."""

    @staticmethod
    def forward(ctx, x, comm):
        return all_reduce(comm, "tp", x.contiguous().clone())

    @staticmethod
    def backward(ctx, grad):
        return grad, None


# ------------------------------------------------------------------ the model, split

def head_rows(dim, r, tp):
    """Rows of qkv's weight that hold tp-rank r's heads: its slice of q, of k and of v (lecture 07)."""
    n = dim // tp
    return torch.cat([torch.arange(j * dim + r * n, j * dim + (r + 1) * n) for j in range(3)])


def layout(name, cfg, t, tp):
    """How tp-rank t holds parameter `name`: (dim, indices) of the full tensor, or (None, None) = whole."""
    d, n = cfg["dim"], cfg["dim"] * 4 // tp
    if name.endswith("attn.qkv.weight") or name.endswith("attn.qkv.bias"):
        return 0, head_rows(d, t, tp)                                  # column-parallel, by heads
    if name.endswith("mlp.0.weight") or name.endswith("mlp.0.bias"):
        return 0, torch.arange(t * n, (t + 1) * n)                     # column-parallel
    if name.endswith("attn.proj.weight"):
        return 1, torch.arange(t * d // tp, (t + 1) * d // tp)         # row-parallel (bias whole)
    if name.endswith("mlp.2.weight"):
        return 1, torch.arange(t * n, (t + 1) * n)                     # row-parallel (bias whole)
    return None, None  # LayerNorms, embeddings, head, row-parallel biases: replicated over tp


def stage_sizes(cfg, pp):
    """Blocks per pipeline stage: cfg["stages"] when given (an uneven split, e.g. fewer on the
    first and last), else depth / pp each."""
    return cfg.get("stages") or [cfg["depth"] // pp] * pp


def stage_blocks(cfg, stage, pp):
    """The blocks of pipeline stage `stage`."""
    split = stage_sizes(cfg, pp)
    first = sum(split[:stage])
    return range(first, first + split[stage])


def stage_params(cfg, stage, pp, t, tp, dev, dtype):
    """This rank's parameters, sliced from the single-process model: {name: leaf}, {name: layout}."""
    full = tiny.transformer(cfg["vocab"], cfg["dim"], cfg["heads"], cfg["depth"], seed=0, dtype=dtype)
    mine = [f"blocks.{i}." for i in stage_blocks(cfg, stage, pp)]
    mine += ["tok.", "pos."] * (stage == 0) + ["ln.", "head."] * (stage == pp - 1)
    params, where = {}, {}
    for name, p in full.named_parameters():
        if any(name.startswith(prefix) for prefix in mine):
            dim, idx = layout(name, cfg, t, tp)
            part = p.detach() if dim is None else p.detach().index_select(dim, idx)
            params[name] = part.clone().to(dev).requires_grad_()
            where[name] = (dim, idx)
    return params, where


def attention(q, k, v, heads):
    """Causal attention exactly as tiny.Attention computes it, on this rank's `heads` heads."""
    b, s, _ = q.shape
    q, k, v = (x.reshape(b, s, heads, -1).transpose(1, 2) for x in (q, k, v))
    return tiny.attention(q, k, v).transpose(1, 2).reshape(b, s, -1)


def block(x, P, pre, cfg, comm):
    """tiny.TransformerBlock with Megatron's split: f before each column-parallel linear (qkv, mlp.0),
    g after each row-parallel one (proj, mlp.2), its bias added once after the sum."""
    f, g = (lambda y: CopyToTP.apply(y, comm)), (lambda y: ReduceFromTP.apply(y, comm))
    h = F.layer_norm(x, x.shape[-1:], P[pre + "ln1.weight"], P[pre + "ln1.bias"])
    q, k, v = F.linear(f(h), P[pre + "attn.qkv.weight"], P[pre + "attn.qkv.bias"]).chunk(3, dim=-1)
    a = attention(q, k, v, cfg["heads"] // comm["size"]["tp"])
    x = x + (g(F.linear(a, P[pre + "attn.proj.weight"])) + P[pre + "attn.proj.bias"])
    h = F.layer_norm(x, x.shape[-1:], P[pre + "ln2.weight"], P[pre + "ln2.bias"])
    h = F.gelu(F.linear(f(h), P[pre + "mlp.0.weight"], P[pre + "mlp.0.bias"]))
    return x + (g(F.linear(h, P[pre + "mlp.2.weight"])) + P[pre + "mlp.2.bias"])


def stage_forward(P, x, cfg, comm):
    """The first stage embeds token ids, every stage runs its blocks, the last one returns logits."""
    if "tok.weight" in P:
        positions = torch.arange(x.shape[1], device=x.device)
        x = F.embedding(x, P["tok.weight"]) + F.embedding(positions, P["pos.weight"])
    for i in sorted({int(n.split(".")[1]) for n in P if n.startswith("blocks.")}):
        x = block(x, P, f"blocks.{i}.", cfg, comm)
    if "head.weight" in P:
        x = F.layer_norm(x, x.shape[-1:], P["ln.weight"], P["ln.bias"])
        x = F.linear(x, P["head.weight"], P["head.bias"])
    return x


# ------------------------------------------------------------------ the pipeline (lecture 08)

def one_f_one_b(p, m, stage):
    """1F1B: p - stage - 1 warm-up forwards, then one forward, one backward; then the cool-down."""
    warmup = min(p - stage - 1, m)
    actions = [("F", i) for i in range(warmup)]
    for i in range(warmup, m):
        actions += [("F", i), ("B", i - warmup)]
    return actions + [("B", i) for i in range(m - warmup, m)]


def pipeline(P, micro, cfg, comm):
    """One step's forwards and backwards over the pp group, lecture 08's way; returns the sum of the
    micro-batch losses (each divided by m) on the last stage, 0 elsewhere. Gradients accumulate in P."""
    stage, pp, m = comm["coord"]["pp"], comm["size"]["pp"], len(micro)
    first, last, group = stage == 0, stage == pp - 1, comm["group"]["pp"]
    like = next(iter(P.values()))  # dtype and device of the activations
    shape = (micro[0][0].shape[0], cfg["seq"], cfg["dim"])
    held, pending, in_flight, loss = {}, [], [], 0.0

    def send(t, to):  # queued: it leaves with the next exchange, batched with that receive
        pending.append(dist.P2POp(dist.isend, t.contiguous(), group=group, group_peer=to))
        count(comm, "pp", "send", t.numel() * t.element_size())

    def exchange(recv_from=None):
        """Issue the queued sends and (if any) one receive as one batch; wait for the receive only."""
        ops = list(pending)
        if recv_from is not None:
            buf = torch.empty(shape, dtype=like.dtype, device=like.device)
            ops.append(dist.P2POp(dist.irecv, buf, group=group, group_peer=recv_from))
            count(comm, "pp", "recv", 0)
        works = dist.batch_isend_irecv(ops) if ops else []
        in_flight.extend(works[:len(pending)])  # the sends: waited for at the end of the step
        pending.clear()
        if recv_from is not None:
            works[-1].wait()
            return buf

    for kind, i in one_f_one_b(pp, m, stage):
        ids, targets = micro[i]
        if kind == "F":
            if first:
                exchange()  # the sends queued so far leave; the input is the token ids
                inp = ids
            else:
                inp = exchange(stage - 1).requires_grad_()
            out = stage_forward(P, inp, cfg, comm)
            if last:  # each micro-batch's share of the mean loss
                out = tiny.lm_loss(out, targets) / m
                loss = loss + out.detach()
            else:
                send(out.detach(), stage + 1)
            held[i] = (inp, out)
        else:
            inp, out = held.pop(i)
            grad = exchange() if last else exchange(stage + 1)  # None on the last stage: dL/dL = 1
            out.backward(grad)
            if not first:
                send(inp.grad, stage - 1)
    exchange()
    for work in in_flight:
        work.wait()
    return loss


# ------------------------------------------------------------------ one run

def train(rank, world_size, dp, tp, pp, cfg, steps, micro_batches, timed=False, dtype=torch.float64):
    """`steps` SGD steps of tiny.transformer over a (pp, dp, tp) mesh of world_size = dp*tp*pp ranks.
    Returns losses (global mean, per step), params ({full-model name: this rank's slice}) with layout
    ({name: (dim, indices) or (None, None) for whole}), coord and groups (this rank's mesh coordinate
    and the global ranks of its group in each dimension), bytes ({dim: bytes sent per step}), calls
    ({dim: {kind: calls per step}}), step_s (timed: seconds per step, the steps back to back, else None)."""
    assert dp * tp * pp == world_size, f"dp*tp*pp = {dp * tp * pp} ranks, but {world_size} started"
    split = stage_sizes(cfg, pp)
    assert len(split) == pp and sum(split) == cfg["depth"] and min(split) >= 1, (split, pp)
    assert cfg["heads"] % tp == 0 and cfg["batch"] % (dp * micro_batches) == 0
    dev = device()
    mesh = init_device_mesh(dev.type, (pp, dp, tp), mesh_dim_names=DIMS)
    comm = dict(group={d: mesh.get_group(d) for d in DIMS}, size=dict(pp=pp, dp=dp, tp=tp),
                coord=dict(zip(DIMS, mesh.get_coordinate())), bytes={d: 0.0 for d in DIMS},
                calls={d: {} for d in DIMS})
    c = comm["coord"]
    if pp > 1:  # NCCL makes a group's communicator at its first call, which every member must join
        dist.barrier(group=comm["group"]["pp"])  # (batch_isend_irecv's docs): not a p2p of two stages
    P, where = stage_params(cfg, c["pp"], pp, c["tp"], tp, dev, dtype)
    ids, targets = tiny.tokens(cfg["batch"], cfg["seq"], cfg["vocab"], seed=1, device=dev)
    share = cfg["batch"] // dp  # this dp rank's rows of the global batch, in m micro-batches
    rows = slice(c["dp"] * share, (c["dp"] + 1) * share)
    micro = list(zip(ids[rows].chunk(micro_batches), targets[rows].chunk(micro_batches)))
    clock, losses = timing.Clock(dev), []
    if timed:  # one barrier, then the steps back to back, as training runs: a step is the time
        dist.barrier()  # from the end of the one before to its own end (the first: from the barrier)
        clock.now(("end", -1))
    for step in range(steps):
        losses.append(pipeline(P, micro, cfg, comm))
        # Data parallel (lecture 05): average the gradients over dp in one flat buffer (one bucket).
        # No all-reduce over tp is needed: f's backward sums the partial input gradients, so the
        # replicated LayerNorms, embeddings and head see the full gradient on every tp rank already.
        flat = all_reduce(comm, "dp", torch.cat([p.grad.reshape(-1) for p in P.values()])) / dp
        with torch.no_grad():
            for p, g in zip(P.values(), flat.split([p.numel() for p in P.values()])):
                p -= cfg["lr"] * g.view_as(p)
                p.grad = None
        if timed:
            clock.now(("end", step))
    # Bookkeeping for the report, not training (so not counted): the global mean loss per step,
    # from the last stage's tp-rank-0 ranks (each holds its dp share), summed over the world.
    mine = c["pp"] == pp - 1 and c["tp"] == 0
    total = torch.stack([torch.as_tensor(l, dtype=dtype, device=dev) for l in losses]) * (mine / dp)
    dist.all_reduce(total)
    t = clock.read() if timed else {}
    return dict(losses=total.tolist(), params={n: p.detach() for n, p in P.items()}, layout=where,
                coord=c, groups={d: dist.get_process_group_ranks(comm["group"][d]) for d in DIMS},
                group_names={d: comm["group"][d].group_name for d in DIMS},
                bytes={d: b / steps for d, b in comm["bytes"].items()},
                calls={d: {k: n // steps for k, n in v.items()} for d, v in comm["calls"].items()},
                step_s=[t[("end", s)] - t[("end", s - 1)] for s in range(steps)] if timed else None)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in (("dp", 2), ("tp", 2), ("pp", 2), ("steps", 3), ("micro-batches", 2)):
        ap.add_argument(f"--{name}", type=int, default=default)
    a = ap.parse_args()
    world = int(os.environ.get("WORLD_SIZE", a.dp * a.tp * a.pp))  # torchrun's, or spawn's own ranks
    results = spawn(train, world, args=(a.dp, a.tp, a.pp, CFG, a.steps, a.micro_batches))
    if int(os.environ.get("RANK", 0)) == 0:
        err = check(results, CFG, a.steps)
        backend = dist.get_backend() if dist.is_initialized() else resolve_backend(world)
        losses = [round(loss, 6) for loss in results[0]["losses"]]
        print(f"nd3d OK: dp={a.dp} tp={a.tp} pp={a.pp} on {world} ranks ({backend}), {a.steps} steps, "
              f"losses {losses} equal the single process (largest parameter difference {err:.1e}); "
              "bytes sent per step by rank 0: " + ", ".join(f"{d} {b:.0f}" for d, b in results[0]["bytes"].items()))
