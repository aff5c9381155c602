"""Reference solutions for the exercises of lecture 11 (sequence, context and expert parallelism)."""
import torch


def sp_layer_bytes(s, b, h, a, t, sp, elem=2, mask=1):
    # Megatron's layer per rank: our 16 sbh + a s^2 b elements, plus dropout on the attention weights
    # (mask + output: a s^2 b (mask + elem)) and after proj and the MLP (2 sbh masks).
    sbh, as2b = s * b * h, a * s * s * b
    if sp:                                       # everything on s/t tokens or 1/t of the heads/columns
        return ((16 * elem + 2 * mask) * sbh + (2 * elem + mask) * as2b) / t
    whole = (4 * elem + 2 * mask) * sbh          # LayerNorm inputs, column-linear inputs, the two residual dropout masks
    return whole + (12 * elem * sbh + (2 * elem + mask) * as2b) / t


def merge_states(m1, l1, acc1, m2, l2, acc2):
    """Rescale both states to the common maximum, then add."""
    m = torch.maximum(m1, m2)
    a1, a2 = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, a1 * l1 + a2 * l2, a1 * acc1 + a2 * acc2


def split_sizes(counts, owner, r):
    """(input_split_sizes, output_split_sizes) of rank r's dispatch: rows it sends to each rank (its own
    counts summed over each rank's experts) and rows it receives from each rank (their counts for r's experts)."""
    K = len(counts)
    send = [sum(c for e, c in enumerate(counts[r]) if owner[e] == j) for j in range(K)]
    recv = [sum(c for e, c in enumerate(counts[i]) if owner[e] == r) for i in range(K)]
    return send, recv
