"""Lecture 10's pieces that later lectures reuse, exactly as notebooks/10_memory_precision.ipynb shows them
(its cells marked #@save). Written by `python -m helpers.site.saved`: edit the lecture, then run it again."""
import torch


class SavedBytes:
    """Inside `with`: the bytes of what autograd saves for backward, each storage
    once, the parameters' storages left out."""

    def __init__(self, params=()):
        self.params = {p.untyped_storage().data_ptr() for p in params}
        self.storages, self.dtypes = {}, {}

    def pack(self, t):
        st = t.untyped_storage()
        if st.data_ptr() not in self.params:
            self.storages[st.data_ptr()] = st.nbytes()
            self.dtypes[st.data_ptr()] = t.dtype
        return t

    def __enter__(self):
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)

    @property
    def bytes(self):
        return sum(self.storages.values())

def block_bytes(s, b, h, a, elem):
    """What one tiny.TransformerBlock saves for backward, in bytes, term by term."""
    return {"16 sbh": 16 * s * b * h * elem, "a s^2 b": a * s * s * b * elem,
            "LayerNorm stats": 4 * s * b * elem, "causal mask": s * s}
