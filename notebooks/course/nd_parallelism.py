"""Lecture 13's pieces that later lectures reuse, exactly as notebooks/13_nd_parallelism.ipynb shows them
(its cells marked #@save). Written by `python -m helpers.site.saved`: edit the lecture, then run it again."""
import math
import torch
import torch.distributed as dist
from course.expert_parallel import expert_mlp, make_router, moe_layer
from course.sequence_context_parallel import ring_attention, zigzag
from helpers import tiny, trace
from helpers.spawn import device
from machinery import l12_expert_parallel as ep_bench, l13_nd_parallelism as mesh_bench
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


from torch.distributed.tensor import (DTensor, Partial, Replicate, Shard,
                                      distribute_tensor)
REDISTRIBUTE = {  # (from, to) on a mesh dimension of n ranks: collective, bytes sent
    ("Partial", "Replicate"): ("all_reduce", lambda N, n: 2 * (n - 1) * N // n),
    ("Partial", "Shard(0)"): ("reduce_scatter", lambda N, n: (n - 1) * N // n),
    ("Shard(0)", "Replicate"): ("all_gather", lambda N, n: (n - 1) * N // n),
    ("Shard(0)", "Shard(1)"): ("all_to_all", lambda N, n: (n - 1) * (N // n) // n),
    ("Replicate", "Shard(0)"): (None, lambda N, n: 0)}
CPU_ALL_TO_ALL = ("all_gather", lambda N, n: (n - 1) * N // n)   # torch 2.13 on CPU

def redistribute_calls(rank, K, shape, full, table=REDISTRIBUTE):
    """Each move of `table` on "tp": {(from, to): ([(kind, dim, sent)], local)}."""
    mesh_bench.quiet()                # notices (among them the CPU fallback: counted)
    place = {"Partial": Partial(), "Replicate": Replicate(), "Shard(0)": Shard(0),
             "Shard(1)": Shard(1)}
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp"))
    n, j = mesh.size(1), mesh.get_local_rank("tp")
    out = {}
    for src, dst in table:
        if src == "Partial":          # a summand per rank: every n-th element, else 0
            mine = torch.arange(full.numel()).view(full.shape) % n == j
            x = DTensor.from_local(full * mine, mesh, [Replicate(), place[src]])
        else:
            x = distribute_tensor(full, mesh, [Replicate(), place[src]])
        with trace.calls(strict=True) as log:
            y = x.redistribute(mesh, [Replicate(), place[dst]])
        calls = [(k, dim, sent) for dim, k, _, sent in mesh_bench.mesh_log(log, mesh)]
        out[src, dst] = (calls, y.to_local())
    return out

def assert_redistribute(counted, N, n, table=REDISTRIBUTE, cpu=True):
    """Each transition made exactly the table's collective on "tp", with its bytes."""
    for move, (kind, sent) in table.items():
        if cpu and move == ("Shard(0)", "Shard(1)"):
            kind, sent = CPU_ALL_TO_ALL
        want = [] if kind is None else [(kind, "tp", sent(N, n))]
        assert counted[move] == want, (move, counted[move], want)

from torch.distributed.fsdp import fully_shard
def hsdp_split(model, mesh):
    """HSDP: FSDP2 on the whole 2-D mesh, replicated on dim 0, sharded on dim 1."""
    for block in model:
        fully_shard(block, mesh=mesh)                # one FSDP unit per block
    return fully_shard(model, mesh=mesh)             # the root (no parameters)

def my_rows(mesh, data, n):
    """This rank's share of n rows, split over the mesh dimension(s) `data`."""
    ranks = mesh[data].mesh.flatten().tolist()       # the ranks that split the batch
    i, d = ranks.index(dist.get_rank()), len(ranks)
    return slice(i * n // d, (i + 1) * n // d)

def mlp_parts(mesh, split, data, cfg):
    """The seeded MLP split on the mesh by `split`; this rank's rows of the batch."""
    model = tiny.model(cfg["dim"], cfg["hidden"], cfg["depth"], seed=0, device=device())
    x, y = tiny.batch(cfg["batch"], cfg["dim"], seed=1, device=device())
    rows = my_rows(mesh, data, len(x))
    return split(model, mesh), x[rows], y[rows]

def mlp_step(mesh, model, x, y):
    loss = tiny.loss(model(x), y)
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    return dict(loss=loss.detach(), grads=grads)

def fsdp_unit_bytes(local_shapes, d, elem=8):
    """N of FSDP2's all-gather (or reduce-scatter) of a unit: dim 0 padded to d."""
    return elem * sum(d * math.ceil(s[0] / d) * math.prod(s[1:]) for s in local_shapes)

def ring(kind, N, n):
    """Bytes a rank sends in a collective of N bytes over n ranks (lecture 02's ring;
    an all-to-all: (n-1)/n of N, exact for even splits only); a send N, a receive 0."""
    if kind in ("send", "recv"):
        return N if kind == "send" else 0
    return (2 if kind == "all_reduce" else 1) * (n - 1) * N // n

def expected(calls, sizes):
    """{dim: {kind: [calls, N, sent]}} from {dim: {kind: [(calls, N of one), ...]}}."""
    return {dim: {k: [sum(c for c, _ in cn), sum(c * N for c, N in cn),
                      sum(c * ring(k, N, sizes[dim]) for c, N in cn)]
                  for k, cn in kinds.items()} for dim, kinds in calls.items()}

def moe_parts(mesh, cfg):
    """The router, this rank's E/e experts split on "tp", its tokens and targets."""
    h, E, j = cfg["dim"], cfg["experts"], mesh.get_local_rank("ep")
    per = E // mesh["ep"].size()
    plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}   # h -> 4h, GELU, 4h -> h
    mine = [parallelize_module(expert_mlp(h, 1 + e).to(device()), mesh["tp"], plan)
            for e in range(j * per, (j + 1) * per)]
    x, y = tiny.batch(cfg["tokens"], h, seed=3, device=device())
    rows = my_rows(mesh, ("dp", "ep"), len(x))
    router = make_router(h, E).to(device())
    return router, mine, x[rows].requires_grad_(), y[rows], cfg["k"]

def moe_step(mesh, router, mine, x, y, k):
    out, _, _ = moe_layer(x, router, mine, k, None, group=mesh.get_group("ep"))
    ((out - y) ** 2).sum().backward()
    for p in (p for expert in mine for p in expert.parameters()):
        dist.all_reduce(p.grad.to_local(), group=mesh.get_group("dp"))   # its replicas
    for dim in ("ep", "dp"):                                 # the router: on every rank
        dist.all_reduce(router.weight.grad, group=mesh.get_group(dim))
    return dict(x=x.grad, router=router.weight.grad,
                experts=[p.grad for expert in mine for p in expert.parameters()])

def moe_bytes(kept, i, j, cfg, shape):
    """Rank (i, j, .)'s step, {dim: {kind: [calls, N, sent]}}, from the routing."""
    h, E, _, _ = cfg.values()
    d, e, t = shape
    per, line = E // e, kept[i * e:(i + 1) * e]              # line i's token groups
    chunks = [int(line[g, x]) * h * 8 for g in range(e)      # one per sender, expert
              for x in range(j * per, (j + 1) * per)]
    local = [(per, 8 * m) for m in (4 * h * h // t, 4 * h // t, 4 * h * h // t, h)]
    exchange = ep_bench.all_to_all_model(line, j, h, 8)       # lecture 12's five
    model = expected({"ep": {"all_to_all": [(1, N) for N in exchange],
                             "all_reduce": [(1, 8 * h * E)]},
                      "tp": {"all_reduce": [(2, N) for N in chunks]},
                      "dp": {"all_reduce": local + [(1, 8 * h * E)]}},   # W1 b1 W2 b2
                     dict(dp=d, ep=e, tp=t))
    home = 8 * E // e + 4 * sum(chunks[j * per:(j + 1) * per])   # what rank j keeps
    model["ep"]["all_to_all"][2] = sum(exchange) - home           # sent: the rest
    return model

def cp_tokens(t, mine, n):
    """The chunks `mine` (n tokens each) of t's sequences (dim 1), side by side."""
    return torch.cat([t[:, i * n:(i + 1) * n] for i in mine], dim=1)

def cp_parts(mesh, cfg):
    """The seeded block, whole; this rank's sequences, its zig-zag chunks of them."""
    B, s, h, c = cfg["batch"], cfg["seq"], cfg["dim"], mesh["cp"].size()
    block = tiny.transformer(dim=h, heads=cfg["heads"], depth=1, max_seq=s, seed=0,
                             device=device()).blocks[0]
    x, y = (t.view(B, s, h) for t in tiny.batch(B * s, h, seed=4, device=device()))
    rows, chunks = my_rows(mesh, "dp", B), zigzag(c)
    mine = chunks[mesh.get_local_rank("cp")]
    x, y = (cp_tokens(t[rows], mine, s // (2 * c)) for t in (x, y))
    return block, x.requires_grad_(), y, chunks

def cp_step(mesh, block, x, y, chunks):
    (b, m, h), attn = x.shape, block.attn
    q, k, v = (t.view(b, m, attn.heads, -1).transpose(1, 2)
               for t in attn.qkv(block.ln1(x)).split(h, -1))
    o = ring_attention(q, k, v, chunks, mesh.get_group("cp"))   # the ring on "cp"
    x1 = x + attn.proj(o.transpose(1, 2).reshape(b, m, h))
    out = x1 + block.mlp(block.ln2(x1))                  # token by token: unchanged
    ((out - y) ** 2).sum().backward()
    for dim in ("cp", "dp"):                             # replicas on both dimensions
        for p in block.parameters():
            dist.all_reduce(p.grad, group=mesh.get_group(dim))
    grads = {name: p.grad for name, p in block.named_parameters()}
    return dict(out=out.detach(), x=x.grad, grads=grads)
