"""Reference solutions for the exercises of lecture 13 (N-D parallelism on a device mesh, and a planner)."""


def mesh_layer_bytes(b, s, h, P, dp, tp, elem=2):
    shard = P // tp * elem                        # this tp rank's slice of the layer, FSDP-sharded over dp
    dp_bytes = 3 * (dp - 1) * shard / dp          # all-gather forward, all-gather backward, reduce-scatter
    act = b // dp * s * h * elem                  # the activation of one replica's b/dp sequences
    tp_bytes = 4 * 2 * (tp - 1) * act / tp        # 2 all-reduces forward, 2 backward
    return dp_bytes, tp_bytes


def mesh_peers(dp, tp, pp, rank):
    """A rank's group along each dimension of the row-major (pp, dp, tp) mesh: vary one coordinate."""
    ip, rest = divmod(rank, dp * tp)   # rank = (ip * dp + idp) * tp + it
    idp, it = divmod(rest, tp)
    at = lambda p, d, t: (p * dp + d) * tp + t   # noqa: E731
    return {"tp": [at(ip, idp, j) for j in range(tp)],
            "dp": [at(ip, j, it) for j in range(dp)],
            "pp": [at(j, idp, it) for j in range(pp)]}


def memory_per_gpu(P, L, h, a, s, V, B, b, dp, tp, pp, zero):
    """Exercise 3: bytes per GPU of the first stage, bf16 + Adam, ZeRO `zero`, no recomputation, SP on."""
    local = (P - V * h) / (tp * pp) + V * h / tp               # its layers' share + the word embedding
    states = (2 / (dp if zero >= 3 else 1) + 2 / (dp if zero >= 2 else 1) + 12 / (dp if zero >= 1 else 1)) * local
    m = B // (dp * b)
    acts = (L // pp) * min(pp, m) * s * b * h * (34 + 5 * a * s / h) / tp
    working = 2 * 2 * 2 * 12 * h * h / tp if zero >= 3 else 0.0
    return states + acts + working
