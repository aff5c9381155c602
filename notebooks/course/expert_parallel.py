"""Lecture 12's pieces that later lectures reuse, exactly as notebooks/12_expert_parallel.ipynb shows them
(its cells marked #@save). Written by `python -m helpers.site.saved`: edit the lecture, then run it again."""
import math
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from helpers import tiny


def make_router(dim, experts):
    """The router: d -> E scores, no bias, float64 from a seeded generator."""
    return tiny.seeded(nn.Linear(dim, experts, bias=False), seed=99)


def expert_mlp(dim, seed):
    """An expert: d -> 4d -> d, GELU, from its own seed: a rank builds only its own."""
    return tiny.seeded(nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(),
                                     nn.Linear(4 * dim, dim)), seed)


def capacity(factor, n, k, experts):
    """C = ceil(c n k / E): what an expert keeps of n tokens' picks; None: no limit."""
    return None if factor is None else math.ceil(factor * n * k / experts)


def route(x, router, k, cap):
    """Router probabilities (n x E), each token's k best experts (n x k, best first),
    their gates, and which are kept: at most `cap` per expert, in GShard's order."""
    probs = torch.softmax(router(x), dim=-1)
    top_p, top = probs.topk(k, dim=-1)
    gates = top_p if k == 1 else top_p / top_p.sum(-1, keepdim=True)   # Switch: raw p
    order = top.t().reshape(-1)                # all first choices, then all second ...
    place = F.one_hot(order, probs.shape[1]).cumsum(0).gather(1, order[:, None])
    keep = torch.ones_like(top, dtype=torch.bool) if cap is None else \
        (place <= cap).view(k, -1).t()
    return probs, top, gates, keep


def moe_reference(x, router, experts, k, factor, n_groups, shared=None):
    """The layer in one process, dense; capacity counted in each of `n_groups` groups.
    Returns the output and the kept assignments per group and expert (groups x E)."""
    E, out, kept = len(experts), [], []
    for xg in x.chunk(n_groups):
        _, top, gates, keep = route(xg, router, k, capacity(factor, len(xg), k, E))
        weight = x.new_zeros(len(xg), E).scatter_add(1, top, gates * keep)
        y = xg + sum(weight[:, e:e + 1] * experts[e](xg) for e in range(E))
        out.append(y if shared is None else y + shared(xg))
        kept.append(torch.bincount(top[keep], minlength=E))
    return torch.cat(out), torch.stack(kept)

class AllToAll(torch.autograd.Function):
    """dist.all_to_all_single with autograd: the backward sends each row's gradient back
    where the row came from (the same call, the split lists swapped)."""

    @staticmethod
    def forward(ctx, rows, out_splits, in_splits, group):
        ctx.args = (in_splits, out_splits, group)
        out = rows.new_empty(sum(out_splits), *rows.shape[1:])
        dist.all_to_all_single(out, rows.contiguous(), out_splits, in_splits, group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return AllToAll.apply(grad.contiguous(), *ctx.args), None, None, None


def moe_layer(x, router, mine, k, factor, shared=None, group=None):
    """This rank's share of the layer: x its n tokens, `mine` its E/K experts. Returns
    the output and the routing (probabilities, top-k experts)."""
    K, per = dist.get_world_size(group), len(mine)
    E = K * per
    probs, top, gates, keep = route(x, router, k, capacity(factor, len(x), k, E))
    # 1. the kept assignments, sorted by expert, counted per expert
    tok = torch.arange(len(x), device=x.device)[:, None].expand_as(top)[keep]
    chosen = top[keep]
    order = torch.argsort(chosen, stable=True)
    tok, expert, gate = tok[order], chosen[order], gates[keep][order]
    send = torch.bincount(expert, minlength=E)
    # 2. counts exchange: recv[i E/K + e] = rows rank i sends to my expert e
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    send, recv = send.tolist(), recv.tolist()            # to the host, once each
    in_splits = [sum(send[j * per:(j + 1) * per]) for j in range(K)]   # to each rank
    out_splits = [sum(recv[i * per:(i + 1) * per]) for i in range(K)]  # from each rank
    # 3. dispatch, 4. my experts, chunk by chunk, 5. return
    got = AllToAll.apply(x[tok], out_splits, in_splits, group)
    chunks = got.split(recv)
    done = torch.cat([mine[c % per](chunk) for c, chunk in enumerate(chunks)])
    back = AllToAll.apply(done, in_splits, out_splits, group)
    # 6. combine with the gates; the residual carries what was dropped
    y = x.index_add(0, tok, gate[:, None] * back)
    return (y if shared is None else y + shared(x)), probs, top

def aux_loss(probs, top, experts):
    """Switch's load-balancing loss E sum_e f_e P_e over one group of tokens."""
    f = torch.bincount(top[:, 0], minlength=experts).to(probs.dtype) / len(top)
    return experts * (f * probs.mean(0)).sum()

def balanced_top(probs, bias, k):
    """DeepSeek-V3's auxiliary-loss-free routing: the bias moves the choice of the k
    experts; the gates are the probabilities', renormalised over the chosen."""
    top = (probs + bias).topk(k, dim=-1).indices
    gates = probs.gather(1, top)
    return top, gates / gates.sum(-1, keepdim=True)


def balance(probs, k, gamma, updates):
    """`updates` bias updates of speed gamma on one batch's probabilities: the busiest
    expert's load over the mean before the first and after each."""
    bias, ratio = torch.zeros(probs.shape[1], dtype=probs.dtype), []
    for _ in range(updates + 1):
        top, _ = balanced_top(probs, bias, k)
        load = torch.bincount(top.reshape(-1), minlength=len(bias)).to(probs.dtype)
        ratio.append((load.max() / load.mean()).item())      # busiest / share
        bias += gamma * torch.sign(load.mean() - load)       # towards the mean load
    return ratio
