"""Inside one rank: the buffers, the call and the check of one collective at one size (nccl-tests'
#wrong), and torch.distributed's own collectives with the harness's signatures."""
from helpers.bench.common import COLLECTIVES, REDUCING, ROOTED

CHECK_BLOCK = 2**22  # elements compared at a time by the correctness check (bounds its memory)


def _pattern(rank, count, dtype, dev, start=0):
    """Elements start..start+count of what rank `rank` contributes: small integers (0..15), exact
    in every dtype and in any order of summation."""
    import torch

    i = torch.arange(start, start + count, dtype=torch.int64, device=dev)
    return ((i + 3 * rank) % 16).to(dtype)


class _Case:
    """The buffers, the call and the check of one collective at one size on one rank.

    `pool` (a dict) lets the cases of one collective share buffers, as nccl-tests does: each case
    uses the first `count` elements of buffers sized for the largest case (make that one first), so a
    sweep holds a few buffers of the largest size, not of every size.
    """

    def __init__(self, kind, nbytes, k, rank, dtype, dev, fn=None, pool=None):
        import torch

        self.kind, self.k, self.rank, self.dtype, self.dev = kind, k, rank, dtype, dev
        item = torch.empty((), dtype=dtype).element_size()
        count = max(1, nbytes // item)
        if kind in ("all_gather", "reduce_scatter"):
            count = max(k, count // k * k)  # the full array splits evenly, as in nccl-tests
        self.count, self.nbytes, self.chunk = count, count * item, count // k
        self.fn = fn or _library(kind)
        pool = {} if pool is None else pool

        def buffer(name, n, make):  # the first n elements of the pool's buffer (a prefix of a pattern
            if name not in pool or pool[name].numel() < n:  # is the pattern of the prefix)
                pool[name] = make(n)
            return pool[name][:n]

        pattern = lambda n: _pattern(rank, n, dtype, dev)  # noqa: E731
        empty = lambda n: torch.empty(n, dtype=dtype, device=dev)  # noqa: E731
        self.src = self.buf = self.out = None
        if kind in ("all_reduce", "reduce", "broadcast"):
            make = pattern if kind != "broadcast" or rank == 0 else \
                (lambda n: torch.zeros(n, dtype=dtype, device=dev))
            self.src, self.buf = buffer("src", count, make), buffer("buf", count, empty)
        elif kind == "all_gather":
            self.inp, self.out = buffer("inp", self.chunk, pattern), buffer("out", count, empty)
        elif kind == "reduce_scatter":
            self.inp, self.out = buffer("inp", count, pattern), buffer("out", self.chunk, empty)
        elif kind == "send_recv":
            self.inp, self.out = buffer("inp", count, pattern), buffer("out", count, empty)
        else:
            raise ValueError(f"unknown collective {kind!r}; known: {', '.join(COLLECTIVES)}.")
        self.reset()

    def reset(self):
        """Before each run (untimed): restore the inputs an in-place collective overwrites, and fill
        outputs with -1, a value no correct result holds (so a call that leaves its output alone,
        or a value left by another size's run in the shared buffer, counts as wrong)."""
        if self.buf is not None:
            self.buf.copy_(self.src)
        if self.out is not None:
            self.out.fill_(-1)

    def run(self):
        if self.kind in ("all_reduce",):
            self.fn(self.buf)
        elif self.kind in ROOTED:
            self.fn(self.buf, 0)
        elif self.kind == "send_recv":
            self.fn(self.inp, self.out)
        else:
            self.fn(self.out, self.inp)

    def wrong(self):
        """How many elements of this rank's result differ from the expected result (#wrong)."""
        import torch

        k, dev = self.k, self.dev
        if self.kind == "reduce" and self.rank != 0:
            return 0  # only the root's result is defined
        if self.kind in ("all_reduce", "reduce", "broadcast"):
            got, offset = self.buf, 0
        elif self.kind == "reduce_scatter":
            got, offset = self.out, self.rank * self.chunk
        else:
            got, offset = self.out, 0
        wrong = 0
        for start in range(0, got.numel(), CHECK_BLOCK):
            part = got[start:start + CHECK_BLOCK]
            n, first = part.numel(), offset + start
            if self.kind in REDUCING:
                want = sum(_pattern(r, n, torch.float64, dev, first) for r in range(k))
                wrong += int((part.double() != want).sum())
                continue
            if self.kind == "broadcast":
                want = _pattern(0, n, self.dtype, dev, first)
            elif self.kind == "send_recv":
                want = _pattern((self.rank - 1) % k, n, self.dtype, dev, first)
            else:  # all_gather: element j came from rank j // chunk, its element j % chunk
                j = torch.arange(first, first + n, device=dev)
                want = ((j % self.chunk + 3 * (j // self.chunk)) % 16).to(self.dtype)
            wrong += int((part != want).sum())
        return wrong


def _library(kind):
    """torch.distributed's own collective with the harness's signature for `kind`."""
    import torch.distributed as dist

    if kind == "all_reduce":
        return lambda t: dist.all_reduce(t)
    if kind == "reduce":
        return lambda t, root: dist.reduce(t, root)
    if kind == "broadcast":
        return lambda t, root: dist.broadcast(t, root)
    if kind == "all_gather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda out, inp: gather(out, inp)
    if kind == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda out, inp: scatter(out, inp)
    if kind == "send_recv":
        return _send_recv
    raise ValueError(f"unknown collective {kind!r}; known: {', '.join(COLLECTIVES)}.")


def _send_recv(send, recv):
    """nccl-tests' sendrecv: every rank sends to the next and receives from the previous one."""
    import torch.distributed as dist

    rank, k = dist.get_rank(), dist.get_world_size()
    if k == 1:
        recv.copy_(send)
        return
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % k), dist.P2POp(dist.irecv, recv, (rank - 1) % k)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
