"""A tracer of torch.distributed calls: which collectives and transfers a piece of code makes, on which
group, with how many bytes. It wraps the code instead of being written into it:

    from helpers import trace
    with trace.calls() as log:                  # inside a rank
        ring_all_reduce(x)                      # any code: dist.*, batch_isend_irecv, DTensor, FSDP2
    log.count("send"), log.nbytes("send")       # 2(K-1) messages, 2(K-1)/K x the tensor's bytes
    log.rows()                                  # one row per (group, kind): calls, bytes, model's bytes sent

It sees every call that reaches torch's dispatcher as a c10d operator (torch.distributed's functions,
the point-to-point calls inside batch_isend_irecv) or a functional collective (DTensor, FSDP2,
torch.compile), through a TorchDispatchMode. Each call is recorded as a `Call`:

- kind: all_reduce, all_gather, reduce_scatter, broadcast, reduce, gather, scatter, all_to_all,
  barrier, send, recv (the names of helpers.cost and nccl-tests);
- group: the process group's name, its global ranks and its size K; peer: the other rank of a send or
  a recv (its rank in the group);
- nbytes: nccl-tests' S, the whole array: a tensor all-reduced, broadcast or sent; an all-gather's
  output (K times each rank's input); a reduce-scatter's input (K times each rank's output);
- phase: whatever `log.phase` held when the call was made (set it to "forward", "backward", ...);
- dtype: the element type of the call's first tensor ("torch.bfloat16" for a compressed gradient).

`Call.ring_sent` is the bytes one rank sends for that call in the ring model of lecture 02 (nbytes
times nccl-tests' bus factor, helpers.cost.busbw_factor, in whole bytes): a model, exact only for a
ring. A send's bytes are what it sends, counted. The tracer does not time anything: inside it every tensor
operation goes through Python, so time the code outside it.

A dispatch mode is thread-local: the tracer sees the calls made on the thread that entered it (and
in autograd's backward, which carries it), not a call made on another thread, such as a callback of
a work's future that gloo runs on its own thread when the work completes (PowerSGD's second
all-reduce, made in the first one's callback); a callback attached to a future already done runs
at once on the caller's thread and is seen. Count calls on other threads where they are made (a
test pins this down).

The operator names and their argument names are torch's (as of torch 2.13); an operator of those
namespaces that the table below does not know is recorded with kind "other" (strict=True raises
instead, for code that must miss nothing).
"""
import contextlib
import dataclasses

from torch.utils._python_dispatch import TorchDispatchMode

# operator -> kind. c10d: torch.distributed's calls; _c10d_functional: DTensor, FSDP2, compile.
KINDS = {
    "c10d.allreduce_": "all_reduce", "c10d.allreduce_coalesced_": "all_reduce",
    "c10d.allgather_": "all_gather", "c10d._allgather_base_": "all_gather",
    "c10d.allgather_coalesced_": "all_gather", "c10d.allgather_into_tensor_coalesced_": "all_gather",
    "c10d.reduce_scatter_": "reduce_scatter", "c10d._reduce_scatter_base_": "reduce_scatter",
    "c10d.reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "c10d.broadcast_": "broadcast", "c10d.reduce_": "reduce", "c10d.gather_": "gather",
    "c10d.scatter_": "scatter", "c10d.alltoall_": "all_to_all", "c10d.alltoall_base_": "all_to_all",
    "c10d.barrier": "barrier", "c10d.monitored_barrier_": "barrier",
    "c10d.send": "send", "c10d.recv_": "recv", "c10d.recv_any_source_": "recv",
    "_c10d_functional.all_reduce": "all_reduce", "_c10d_functional.all_reduce_": "all_reduce",
    "_c10d_functional.all_reduce_coalesced": "all_reduce",
    "_c10d_functional.all_reduce_coalesced_": "all_reduce",
    "_c10d_functional.all_gather_into_tensor": "all_gather",
    "_c10d_functional.all_gather_into_tensor_out": "all_gather",
    "_c10d_functional.all_gather_into_tensor_coalesced": "all_gather",
    "_c10d_functional.reduce_scatter_tensor": "reduce_scatter",
    "_c10d_functional.reduce_scatter_tensor_coalesced": "reduce_scatter",
    "_c10d_functional.all_to_all_single": "all_to_all",
    "_c10d_functional.broadcast": "broadcast", "_c10d_functional.broadcast_": "broadcast",
}
NO_DATA = {"_c10d_functional.wait_tensor", "_c10d_functional._wrap_tensor_autograd"}
# where the whole array S is: per kind, the argument that holds it, times K where it holds 1/K of it
WHOLE = {"all_gather": (("output_tensors", "output_tensor", "outputs", "output_lists", "out"),
                        ("input", "inputs")),
         "gather": ((), ("input_tensors",)),
         "reduce_scatter": (("input_tensors", "input_tensor", "inputs", "input"), ()),
         "scatter": ((), ("output_tensors",)),
         "all_to_all": (("input_tensors", "input"), ())}


@dataclasses.dataclass
class Call:
    kind: str
    op: str
    group: str
    ranks: tuple
    nbytes: int
    peer: int = None
    phase: object = None
    dtype: str = None

    @property
    def size(self):
        return len(self.ranks)

    @property
    def ring_sent(self):
        """Bytes this rank sends for the call in the ring model of lecture 02, in whole bytes:
        2(K-1)/K N for an all-reduce, (K-1)/K N for an all-gather, a reduce-scatter or an
        all-to-all, N for a broadcast or a reduce (what the chain's busiest rank sends, nccl-tests'
        bus factor 1; its end rank sends nothing, so the ranks' mean is (K-1)/K N), a send's own
        bytes; 0 for a receive, a barrier, a group of one rank, and a gather or a scatter (whose
        traffic depends on the rank's place with respect to the root: not modelled here)."""
        k = self.size
        if self.kind in ("send", "recv"):
            return self.nbytes if self.kind == "send" else 0
        share = {"all_reduce": (2 * (k - 1), k), "all_gather": (k - 1, k), "reduce_scatter": (k - 1, k),
                 "all_to_all": (k - 1, k), "broadcast": (1, 1), "reduce": (1, 1)}.get(self.kind)
        if share is None or k == 1:
            return 0
        return share[0] * self.nbytes // share[1]


def _tensor_bytes(value):
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def _group(func, named):
    """(name, global ranks) of the call's group: c10d passes the ProcessGroup, functional its name."""
    import torch
    import torch.distributed as dist

    for value in named.values():
        if isinstance(value, torch.ScriptObject):
            try:
                pg = dist.ProcessGroup.unbox(value)
            except RuntimeError:
                continue
            return pg.group_name, tuple(dist.get_process_group_ranks(pg))
    name = named["group_name"]
    from torch.distributed.distributed_c10d import _resolve_process_group

    pg = _resolve_process_group(name)
    return pg.group_name, tuple(dist.get_process_group_ranks(pg))


def _dtype(named):
    """The element type of the call's first tensor ("torch.bfloat16"), or None."""
    import torch

    for value in named.values():
        while isinstance(value, (list, tuple)) and value:
            value = value[0]
        if isinstance(value, torch.Tensor):
            return str(value.dtype)
    return None


def _whole(kind, named, k):
    """nccl-tests' S for the call: the whole array (see WHOLE)."""
    if kind == "barrier":
        return 0
    whole, part = WHOLE.get(kind, ((), ()))
    for name in whole:
        if name in named and _tensor_bytes(named[name]):
            return _tensor_bytes(named[name])
    for name in part:
        if name in named:
            return k * _tensor_bytes(named[name])
    first = next((v for n, v in named.items() if _tensor_bytes(v)), None)  # the tensor(s) passed first
    return _tensor_bytes(first)


class Trace(TorchDispatchMode):
    """Records every collective and transfer made inside `with`; see the module's docstring."""

    def __init__(self, strict=False):
        super().__init__()
        self.strict, self.calls, self.phase = strict, [], None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace in ("c10d", "_c10d_functional"):
            op = f"{func.namespace}.{func._overloadpacket._qualified_op_name.split('::')[1]}"
            if op not in NO_DATA:
                self._record(func, op, args, kwargs)
        return func(*args, **kwargs)

    def _record(self, func, op, args, kwargs):
        kind = KINDS.get(op)
        if kind is None and self.strict:
            raise RuntimeError(f"helpers.trace does not know the operator {op}: add it to trace.KINDS")
        names = [a.name for a in func._schema.arguments]
        named = {**dict(zip(names, args)), **kwargs}
        group, ranks = _group(func, named)
        peer = named.get("dst", named.get("src")) if kind in ("send", "recv") else None
        self.calls.append(Call(kind or "other", op, group, ranks, _whole(kind, named, len(ranks)),
                               peer, self.phase, _dtype(named)))

    def select(self, kind=None, group=None, phase=None):
        return [c for c in self.calls if (kind is None or c.kind == kind)
                and (group is None or c.group == group) and (phase is None or c.phase == phase)]

    def count(self, kind=None, group=None, phase=None):
        """How many calls (of that kind, on that group, in that phase)."""
        return len(self.select(kind, group, phase))

    def nbytes(self, kind=None, group=None, phase=None):
        """Their bytes: nccl-tests' S summed over the calls."""
        return sum(c.nbytes for c in self.select(kind, group, phase))

    def ring_sent(self, kind=None, group=None, phase=None):
        """The bytes this rank sends for them in the ring model (sends: counted)."""
        return sum(c.ring_sent for c in self.select(kind, group, phase))

    def rows(self, by=("group", "kind")):
        """One dict per distinct value of `by`: calls, bytes (S summed), ring-model bytes sent."""
        out = {}
        for c in self.calls:
            key = tuple(getattr(c, f) for f in by)
            row = out.setdefault(key, {**dict(zip(by, key)), "calls": 0, "bytes": 0, "ring sent": 0})
            row["calls"] += 1
            row["bytes"] += c.nbytes
            row["ring sent"] += c.ring_sent
        return list(out.values())


@contextlib.contextmanager
def calls(strict=False):
    """`with trace.calls() as log:` records this rank's calls into log (a Trace)."""
    log = Trace(strict)
    with log:
        yield log
