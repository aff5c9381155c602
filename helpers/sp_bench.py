"""Lecture 11's memory instrument (sequence parallelism): the bytes autograd keeps for the backward
of a piece of code, counted by wrapping it (saved_tensors_hooks), never by a counter inside it.
"""
import torch


def saved_bytes(run, params=()):
    """Bytes autograd saves for backward while `run()` executes: each storage once (q, k and v
    are views of one qkv output), the parameters in `params` left out (they are not activations)."""
    skip = {p.untyped_storage().data_ptr() for p in params}
    kept = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()              # kept alive until counted: no saved storage is freed and reused
    total = sum(kept.values())
    del out
    return total
