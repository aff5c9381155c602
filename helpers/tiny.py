"""The tiny models the lectures share: a stack of residual MLP blocks (05-09), and a tiny GPT
(`transformer`, 10-12), both seeded identically on every rank.

    model = tiny.model(dim=32, hidden=128, depth=4, seed=0)          # nn.Sequential of Blocks
    x, y = tiny.batch(64, dim=32, seed=1)                            # inputs and regression targets
    loss = tiny.loss(model(x), y)

    gpt = tiny.transformer(vocab=64, dim=32, heads=4, depth=2, seed=0)  # embeddings, blocks, head
    ids, targets = tiny.tokens(8, seq=16, seed=1)                     # next-token data
    loss = tiny.lm_loss(gpt(ids), targets)

Every rank that calls `model(...)` with the same arguments gets bit-identical parameters, so data,
tensor and pipeline parallel versions can be checked against a single-process run. float64 by
default, so checks can use tight tolerances.
"""
import torch
from torch import nn


class Block(nn.Module):
    """x + fc2(gelu(fc1(x))): the MLP of a transformer layer, with its residual connection."""

    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def model(dim=32, hidden=128, depth=4, seed=0, dtype=torch.float64, device="cpu"):
    """A Sequential of `depth` Blocks with deterministic parameters (seeded generator, no global RNG)."""
    return seeded(nn.Sequential(*[Block(dim, hidden) for _ in range(depth)]), seed, dtype, device)


def seeded(m, seed=0, dtype=torch.float64, device="cpu", is_norm=lambda name: False):
    """m's parameters drawn from a seeded generator, uniform in +-1/sqrt(fan_in), in order; a norm's
    (is_norm(name)) weight 1 and bias 0 instead."""
    g = torch.Generator().manual_seed(seed)
    m = m.to(dtype)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if is_norm(name):
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            else:
                fan_in = p.shape[-1] if p.dim() > 1 else p.shape[0]
                p.copy_((torch.rand(p.shape, generator=g, dtype=dtype) * 2 - 1) / fan_in ** 0.5)
    return m.to(device)


def batch(n, dim=32, seed=1, dtype=torch.float64, device="cpu"):
    """n inputs and targets (a fixed smooth function of the inputs), the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g, dtype=dtype)
    y = torch.sin(x) + 0.1 * x.roll(1, dims=1)
    return x.to(device), y.to(device)


def loss(out, target):
    """Mean squared error, averaged over the batch (so shards average to the full-batch loss)."""
    return ((out - target) ** 2).mean()


# ---------------------------------------------------------------- the tiny transformer (lectures 10-12)

def attention(q, k, v):
    """Causal softmax attention on (batch, heads, seq, head_dim) tensors, written out: scores scaled by
    sqrt(head_dim), the future masked, softmax, weights @ v. Attention below and the split versions of
    the later lectures share it, so they compute the same numbers."""
    s = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    causal = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    return scores.masked_fill(causal, float("-inf")).softmax(dim=-1) @ v


class Attention(nn.Module):
    """Causal multi-head self-attention, written out (no fused kernel), so that every tensor it keeps
    for backward is an ordinary one: q, k, v, the scores' softmax, the heads' output."""

    def __init__(self, dim, heads):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim={dim} must be a multiple of heads={heads}.")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in self.qkv(x).split(h, dim=-1))
        return self.proj(attention(q, k, v).transpose(1, 2).reshape(b, s, h))


class TransformerBlock(nn.Module):
    """x + attn(ln1(x)), then + mlp(ln2(.)): a pre-LayerNorm GPT block, MLP 4x wide."""

    def __init__(self, dim, heads):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(dim), Attention(dim, heads)
        self.ln2, self.mlp = nn.LayerNorm(dim), nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    """Token and position embeddings, `depth` blocks, a final LayerNorm and an (untied) output head."""

    def __init__(self, vocab, dim, heads, depth, max_seq):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(max_seq, dim)
        self.blocks = nn.Sequential(*[TransformerBlock(dim, heads) for _ in range(depth)])
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        return self.head(self.ln(self.blocks(x)))


def transformer(vocab=64, dim=32, heads=4, depth=2, max_seq=64, seed=0, dtype=torch.float64, device="cpu"):
    """The tiny GPT: deterministic parameters (seeded generator, no global RNG), float64 by default.
    LayerNorms start at weight 1, bias 0; everything else uniform in +-1/sqrt(fan_in)."""
    return seeded(Transformer(vocab, dim, heads, depth, max_seq), seed, dtype, device,
                   is_norm=lambda name: ".ln" in name or name.startswith("ln."))


def tokens(n, seq, vocab=64, seed=1, device="cpu"):
    """n sequences of `seq` token ids and their next-token targets, the same on every rank. The text
    follows a fixed rule (each token a function of the two before it), so a model can learn it."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.empty(n, seq + 1, dtype=torch.long)
    ids[:, :2] = torch.randint(vocab, (n, 2), generator=g)
    for t in range(2, seq + 1):
        ids[:, t] = (3 * ids[:, t - 1] + ids[:, t - 2] + 1) % vocab
    return ids[:, :-1].to(device), ids[:, 1:].to(device)


def lm_loss(logits, targets):
    """Next-token cross-entropy, averaged over every position of the batch."""
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
