"""Reference solutions for the exercises of lecture 11 (sequence and context parallelism)."""
import torch


def sp_layer_bytes(s, b, h, a, t, sp, elem=2, mask=1):
    # Our 16 sbh + a s^2 b elements, plus dropout on the attention weights (mask + output:
    # a s^2 b (mask + elem)) and after proj and the MLP (two sbh masks).
    sbh, as2b = s * b * h, a * s * s * b
    if sp:                                   # everything on s/t tokens or 1/t of the heads
        return ((16 * elem + 2 * mask) * sbh + (2 * elem + mask) * as2b) / t
    whole = (4 * elem + 2 * mask) * sbh      # LayerNorm and column-linear inputs, residual masks
    return whole + (12 * elem * sbh + (2 * elem + mask) * as2b) / t


def merge_states(m1, l1, acc1, m2, l2, acc2):
    """Rescale both states to the common maximum, then add."""
    m = torch.maximum(m1, m2)
    a1, a2 = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, a1 * l1 + a2 * l2, a1 * acc1 + a2 * acc2


def cp_bytes(b, s, heads, kv_heads, d, K, elem):
    """Ring: K-1 passes of this rank's keys and values (kv_heads each). Ulysses: (K-1)/K of the
    rank's q (heads), k and v (kv_heads each) out, and of the output (heads) back."""
    head = b * s // K * d * elem             # one head of this rank's s/K tokens, in bytes
    ring = 2 * (K - 1) * kv_heads * head
    if kv_heads % K:
        return ring, None
    return ring, (K - 1) * head * (2 * heads + 2 * kv_heads) // K
