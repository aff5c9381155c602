"""Reference solutions for the exercises of lecture 13 (N-D parallelism on a device mesh)."""


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



def tp_calls(L, m, sp, early_stop):
    """Exercise 3: torch's calls on "tp" per step, full recomputation (section 4)."""
    passes = L * m                                # layer-micro-batches
    last = 2 + 2 + (1 if early_stop else 2)       # the reductions: forward, backward, recompute
    if not sp:
        return {"all_reduce": passes * last}
    return {"all_gather": passes * 6, "reduce_scatter": passes * last, "all_reduce": passes * 4}
