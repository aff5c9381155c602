"""Reference solutions for the exercises of lecture 14 (a planner for N-D parallelism)."""


def memory_per_gpu(P, L, h, a, s, V, G, b, dp, tp, pp, zero):
    """Exercise 1: bytes per GPU of the first stage, bf16 + Adam, ZeRO `zero`, no recomputation, SP on."""
    local = (P - V * h) / (tp * pp) + V * h / tp               # its layers' share + the word embedding
    states = (2 / (dp if zero >= 3 else 1) + 2 / (dp if zero >= 2 else 1)
              + 12 / (dp if zero >= 1 else 1)) * local
    m = G // (dp * b)
    acts = (L // pp) * min(pp, m) * s * b * h * (34 + 5 * a * s / h) / tp
    working = 2 * 2 * 2 * 12 * h * h / tp if zero >= 3 else 0.0
    return states + acts + working


def exposed_data(data, after_step, compute, share, m, zero, overlap):
    """Exercise 2: the hidden part is `overlap` of the traffic a backward can hide, at most the
    backward compute it runs beside: the last micro-batch's (ZeRO-0/1), every one's (ZeRO-2/3)."""
    window = share * compute / (m if zero <= 1 else 1)
    return data - min(overlap * (data - after_step), window)


def pipeline_time(compute, tensor, p2p, m, p):
    """Exercise 3: m + p - 1 slots of one micro-batch's (compute + tensor + p2p), less the sends
    the two end stages do not make (each sends half of a middle stage's) when p > 2."""
    return (m + p - 1) / m * (compute + tensor + p2p) - (p2p / m if p > 2 else 0.0)
