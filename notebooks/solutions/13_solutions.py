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


def hsdp_sent(P, L, r, s, elem=8):
    """Exercise 3: bytes one rank sends per step on each dimension of an (r, s) HSDP mesh."""
    unit = P * elem                                   # one FSDP unit, whole
    shard = 3 * L * (s - 1) / s * unit                # 2 all-gathers + 1 reduce-scatter a unit
    replicate = L * 2 * (r - 1) / r * unit / s        # 1 all-reduce of the unit's shard
    return {"replicate": replicate, "shard": shard}
