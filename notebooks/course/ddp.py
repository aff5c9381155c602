"""Lecture 05's pieces that later lectures reuse, exactly as notebooks/05_ddp.ipynb shows them
(its cells marked #@save). Written by `python -m helpers.site.saved`: edit the lecture, then run it again."""
import contextlib
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


def shard_loader(data, rank, world_size, global_batch, seed=0):
    """This rank's DataLoader: its shard of every global batch (G / K samples)."""
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=seed)
    return DataLoader(data, batch_size=global_batch // world_size, sampler=sampler)


def global_batches(data, global_batch, seed=0):
    """The single-process reference: the same shuffle, whole batches."""
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=seed)
    return DataLoader(data, batch_size=global_batch, sampler=sampler)

def broadcast_parameters(model):
    """Make every rank's replica equal to rank 0's."""
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t, src=0)

def average_gradients_naive(model, world_size):
    """Naive DDP's synchronisation: one blocking all-reduce per parameter, then / K."""
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world_size


def sgd_update(model, lr):
    """Plain SGD, torch.optim.SGD(lr=lr) without momentum: p <- p - lr * grad."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-lr)

class BucketedDDP(torch.nn.Module):
    """Data parallel: gradient buckets all-reduced asynchronously during backward."""

    def __init__(self, module, bucket_cap_mb=25.0):
        super().__init__()
        self.module, self.world_size = module, dist.get_world_size()
        self.require_sync = self.syncing = True
        broadcast_parameters(module)
        self.buckets, size, dtype = [[]], 0, None
        for p in reversed([p for p in module.parameters() if p.requires_grad]):
            if self.buckets[-1] and (size >= bucket_cap_mb * 2**20 or p.dtype != dtype):
                self.buckets.append([])           # the cap reached, or another dtype
                size = 0
            self.buckets[-1].append(p)
            size, dtype = size + p.numel() * p.element_size(), p.dtype
        self.flat = [torch.zeros(sum(p.numel() for p in b), dtype=b[0].dtype,
                                 device=b[0].device) for b in self.buckets]
        self.slot = {}                                        # p -> its bucket's view
        for i, bucket in enumerate(self.buckets):
            for p, view in zip(bucket, self.flat[i].split([p.numel() for p in bucket])):
                self.slot[p] = (i, view)
                p.register_post_accumulate_grad_hook(self._grad_ready)
        self._new_backward()

    def _new_backward(self):
        self.pending = [len(b) for b in self.buckets]
        self.works, self.next = [], 0

    def forward(self, *args, **kwargs):
        assert not self.next, "finish_gradient_sync() was skipped after a backward"
        self.syncing = self.require_sync              # torch decides at forward
        return self.module(*args, **kwargs)

    def _grad_ready(self, p):                         # autograd: p.grad is final
        if not self.syncing:                          # forward ran in no_sync
            return
        i, view = self.slot[p]
        torch.div(p.grad.view(-1), self.world_size, out=view)
        self.pending[i] -= 1
        while self.next < len(self.pending) and not self.pending[self.next]:
            self.works.append(dist.all_reduce(self.flat[self.next], async_op=True))
            self.next += 1                            # full buckets leave in order

    def finish_gradient_sync(self):
        if self.syncing:
            assert self.next == len(self.buckets), "a gradient never came"
            for work, bucket in zip(self.works, self.buckets):
                work.wait()
                for p in bucket:
                    p.grad.copy_(self.slot[p][1].view_as(p))
            self._new_backward()

    @contextlib.contextmanager
    def no_sync(self):                                # forwards in it: no sync
        self.require_sync = False
        try:
            yield
        finally:
            self.require_sync = True

def exposed_comm(ready_s, comm_s, share=0.0):
    """Seconds a step takes beyond its compute: bucket i is ready once backward has done
    ready_s[i] of its compute and takes comm_s[i] on a link that carries one all-reduce
    at a time; compute beside the busy link runs 1 + share times slower."""
    t = done = end = 0.0                      # the clock, compute done, link busy until
    for ready, comm in zip(ready_s, comm_s):
        while done < ready:                   # compute on, to this bucket's last grad
            slow = 1 + share if t < end else 1.0
            left = min(ready - done, (end - t) / slow) if t < end else ready - done
            t, done = t + left * slow, done + left
        end = max(end, t) + comm              # the bucket leaves: the link carries it
    return end - max(ready_s)


def assert_near_overlap_model(t_step, t_compute, t_exposed, tolerance_s):
    """A step takes the step without communication plus the exposed communication,
    within what the model leaves out (tolerance_s, section 5)."""
    assert abs(t_step - (t_compute + t_exposed)) <= tolerance_s, (t_step, t_exposed)
