"""Lecture 02's pieces that later lectures reuse, exactly as notebooks/02_ring_math.ipynb shows them
(its cells marked #@save). Written by `python -m helpers.saved`: edit the lecture, then run it again."""
import torch
import torch.distributed as dist


def exchange(send_buf, dst, recv_buf, src):
    """One ring step: send send_buf to rank dst and receive recv_buf from rank src, both at once
    (one batch: NCCL then runs the two together, and gloo cannot deadlock on their order)."""
    ops = []
    if send_buf.numel():
        ops.append(dist.P2POp(dist.isend, send_buf, dst))
    if recv_buf.numel():
        ops.append(dist.P2POp(dist.irecv, recv_buf, src))
    for request in dist.batch_isend_irecv(ops) if ops else []:
        request.wait()


SCRATCH = {}   # one receive buffer per dtype and device, kept between calls


def receive_buffer(like):
    """A buffer shaped like `like` to receive into, reused from call to call, as a library keeps
    its own (a fresh 32 MiB tensor per step costs the page faults of 8192 new pages)."""
    key = (like.dtype, like.device)
    if key not in SCRATCH or SCRATCH[key].numel() < like.numel():
        SCRATCH[key] = torch.empty(like.numel(), dtype=like.dtype, device=like.device)
    return SCRATCH[key][:like.numel()]


def ring_reduce_scatter(chunks):
    """chunks: this rank's K pieces (views). Afterwards chunks[rank] holds their sum over ranks."""
    rank, k = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % k, (rank - 1) % k
    for step in range(k - 1):
        send_c, recv_c = (rank - step - 1) % k, (rank - step - 2) % k
        incoming = receive_buffer(chunks[recv_c])
        exchange(chunks[send_c], right, incoming, left)
        chunks[recv_c] += incoming


def ring_all_gather(chunks):
    """chunks[rank] is complete; afterwards every chunk is, on every rank."""
    rank, k = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % k, (rank - 1) % k
    for step in range(k - 1):
        exchange(chunks[(rank - step) % k], right, chunks[(rank - step - 1) % k], left)


def ring_all_reduce(x):
    """In place, like dist.all_reduce(x): reduce-scatter, then all-gather, on K views of x."""
    chunks = list(torch.tensor_split(x, dist.get_world_size()))
    ring_reduce_scatter(chunks)
    ring_all_gather(chunks)
