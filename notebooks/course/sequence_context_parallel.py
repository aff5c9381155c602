"""Lecture 11's pieces that later lectures reuse, exactly as notebooks/11_sequence_context_parallel.ipynb shows them
(its cells marked #@save). Written by `python -m helpers.site.saved`: edit the lecture, then run it again."""
import torch
import torch.distributed as dist


def contiguous(K):
    return [[2 * r, 2 * r + 1] for r in range(K)]

def zigzag(K):
    return [[r, 2 * K - 1 - r] for r in range(K)]

def merge(out1, lse1, out2, lse2):
    """Two partial results over disjoint keys -> the result over all of them."""
    lse = torch.logaddexp(lse1, lse2)
    return torch.exp(lse1 - lse) * out1 + torch.exp(lse2 - lse) * out2, lse

def scores(q, k, i, j):
    """Scores of query chunk i against key chunk j (j <= i); the diagonal masked."""
    sc = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if i == j:
        n = q.shape[-2]
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        sc = sc.masked_fill(mask, float("-inf"))
    return sc

def ring_pass(x, group=None):
    """Post: send x to the next rank of group (None: all), get the previous one's."""
    rank, K = dist.get_rank(group), dist.get_world_size(group)    # ranks in the group
    got = torch.empty_like(x)
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, x, group=group, group_peer=(rank + 1) % K),
        dist.P2POp(dist.irecv, got, group=group, group_peer=(rank - 1) % K)])
    return got, works

def ring_forward(q, k, v, chunks, group=None):
    """q, k, v: (b, heads, 2n, d), this rank's two chunks; chunks: each rank's ids."""
    rank, K = dist.get_rank(group), dist.get_world_size(group)
    qs = q.chunk(2, dim=-2)
    out = [torch.zeros_like(x) for x in qs]
    lse = [torch.full_like(x[..., :1], float("-inf")) for x in qs]
    kv = torch.stack([k, v])                 # keys and values travel together
    for t in range(K):
        if t < K - 1:
            arriving, works = ring_pass(kv, group)  # the next block, in flight
        ks, vs = kv[0].chunk(2, dim=-2), kv[1].chunk(2, dim=-2)
        for iq, i in enumerate(chunks[rank]):          # iq, jk: positions in the lists
            for jk, j in enumerate(chunks[(rank - t) % K]):
                if j <= i:
                    sc = scores(qs[iq], ks[jk], i, j)
                    l = sc.logsumexp(dim=-1, keepdim=True)
                    pv = torch.exp(sc - l) @ vs[jk]
                    out[iq], lse[iq] = merge(out[iq], lse[iq], pv, l)
        if t < K - 1:
            [w.wait() for w in works]
            kv = arriving
    return torch.cat(out, dim=-2), torch.cat(lse, dim=-2)

def ring_backward(q, k, v, out, lse, dout, chunks, group=None):
    rank, K = dist.get_rank(group), dist.get_world_size(group)
    delta = (dout * out).sum(dim=-1, keepdim=True)
    qs, dos, ls, ds_ = (x.chunk(2, dim=-2) for x in (q, dout, lse, delta))
    dq = torch.zeros_like(q)
    kv = torch.stack([k, v])
    dkv = torch.zeros_like(kv)
    root = q.shape[-1] ** 0.5
    for t in range(K):
        if t < K - 1:
            arriving, works = ring_pass(kv, group)
        ks, vs = kv[0].chunk(2, dim=-2), kv[1].chunk(2, dim=-2)
        dks, dvs = dkv[0].chunk(2, dim=-2), dkv[1].chunk(2, dim=-2)  # views of dkv
        dqs = dq.chunk(2, dim=-2)
        for iq, i in enumerate(chunks[rank]):          # iq, jk: positions in the lists
            for jk, j in enumerate(chunks[(rank - t) % K]):
                if j <= i:
                    p = torch.exp(scores(qs[iq], ks[jk], i, j) - ls[iq])
                    dvs[jk].add_(p.transpose(-2, -1) @ dos[iq])
                    ds = p * (dos[iq] @ vs[jk].transpose(-2, -1) - ds_[iq])
                    dqs[iq].add_(ds @ ks[jk] / root)
                    dks[jk].add_(ds.transpose(-2, -1) @ qs[iq] / root)
        if t < K - 1:
            [w.wait() for w in works]
            kv = arriving
        dkv, works = ring_pass(dkv, group)   # dK, dV go on with their block
        [w.wait() for w in works]
    return dq, dkv[0], dkv[1]                # after K passes: this rank's own block's

class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, chunks, group=None):
        out, lse = ring_forward(q, k, v, chunks, group)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.chunks, ctx.group = chunks, group
        return out

    @staticmethod
    def backward(ctx, dout):
        dq, dk, dv = ring_backward(*ctx.saved_tensors, dout.contiguous(), ctx.chunks,
                                   ctx.group)
        return dq, dk, dv, None, None

ring_attention = RingAttention.apply
