"""Lecture 13's pieces that later lectures reuse, exactly as notebooks/13_nd_parallelism.ipynb shows them
(its cells marked #@save). Written by `python -m helpers.saved`: edit the lecture, then run it again."""
import torch
from helpers import trace


REDISTRIBUTE = {  # (from, to) on a mesh dimension of n ranks: collective, bytes sent
    ("Partial", "Replicate"): ("all_reduce", lambda N, n: 2 * (n - 1) * N // n),
    ("Partial", "Shard(0)"): ("reduce_scatter", lambda N, n: (n - 1) * N // n),
    ("Shard(0)", "Replicate"): ("all_gather", lambda N, n: (n - 1) * N // n),
    ("Shard(0)", "Shard(1)"): ("all_to_all", lambda N, n: (n - 1) * (N // n) // n),
    ("Replicate", "Shard(0)"): (None, lambda N, n: 0)}
CPU_ALL_TO_ALL = ("all_gather", lambda N, n: (n - 1) * N // n)   # torch 2.13 on CPU


def redistribute_calls(rank, K, shape, full, table=REDISTRIBUTE):
    """Each move of `table` on "tp": {(from, to): ([(kind, dim, sent)], local)}."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import (DTensor, Partial, Replicate, Shard,
                                          distribute_tensor)
    import logging                    # the CPU fallback's notice, counted below
    logging.getLogger("torch.distributed.tensor._collective_utils").setLevel("ERROR")
    place = {"Partial": Partial(), "Replicate": Replicate(), "Shard(0)": Shard(0),
             "Shard(1)": Shard(1)}
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp"))
    dims = {mesh.get_group(d).group_name: d for d in ("dp", "tp")}
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
        calls = [(c.kind, dims[c.group], c.ring_sent) for c in log.calls]
        out[src, dst] = (calls, y.to_local())
    return out


def assert_redistribute(counted, N, n, table=REDISTRIBUTE, cpu=True):
    """Each transition made exactly the table's collective on "tp", with its bytes."""
    for move, (kind, sent) in table.items():
        if cpu and move == ("Shard(0)", "Shard(1)"):
            kind, sent = CPU_ALL_TO_ALL
        want = [] if kind is None else [(kind, "tp", sent(N, n))]
        assert counted[move] == want, (move, counted[move], want)

def differences(counted, formula, dims=("tensor", "data")):
    """{(dim, kind): (calls, bytes)} counted beyond the formula (negative: fewer)."""
    out = {}
    for dim in dims:
        got, want = counted.get(dim, {}), formula.get(dim, {})
        for kind in sorted(set(got.get("kind", {})) | set(want.get("kind", {}))):
            calls = got.get("kind", {}).get(kind, 0) - want.get("kind", {}).get(kind, 0)
            nbytes = (got.get("kind_bytes", {}).get(kind, 0)
                      - want.get("kind_bytes", {}).get(kind, 0))
            if calls or nbytes:
                out[dim, kind] = (calls, nbytes)
    return out
