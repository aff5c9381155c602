"""Lecture 02's pieces that later lectures reuse, exactly as notebooks/02_ring_math.ipynb shows them
(its cells marked #@save). Written by `python -m helpers.site.saved`: edit the lecture, then run it again."""
import torch
import torch.distributed as dist


def exchange(send_buf, dst, recv_buf, src):
    """One ring step: send send_buf to rank dst and receive recv_buf from rank src,
    both at once (one batch: NCCL then runs the two together, and gloo cannot deadlock
    on their order)."""
    ops = []
    if send_buf.numel():
        ops.append(dist.P2POp(dist.isend, send_buf, dst))
    if recv_buf.numel():
        ops.append(dist.P2POp(dist.irecv, recv_buf, src))
    for request in dist.batch_isend_irecv(ops) if ops else []:
        request.wait()     # on NCCL the current stream waits, not the host

def ring_broadcast(x, root, n_chunks=1):
    """In place, like dist.broadcast(x, root): the chunks follow each other round."""
    rank, k = dist.get_rank(), dist.get_world_size()
    p = (rank - root) % k                  # position: 0 for the root, k-1 for the last
    chunks = [c for c in torch.tensor_split(x, n_chunks) if c.numel()]
    s, nothing = len(chunks), x[:0]
    for t in range(k - 2 + s):
        get, put = t - p + 1, t - p           # the chunk received, the chunk passed on
        recv = chunks[get] if p > 0 and 0 <= get < s else nothing
        send = chunks[put] if p < k - 1 and 0 <= put < s else nothing
        exchange(send, (rank + 1) % k, recv, (rank - 1) % k)

def assert_near_model(rows, model, tol=0.25):
    """The lecture's measured claim: every row of bench.sweep within tol of model(row),
    the formula's seconds, whose alpha and B do not come from these rows."""
    off = {(r["collective"], r["world_size"]): r["time_us"] * 1e-6 / model(r) - 1
           for r in rows}
    far = {key: f"{v:+.0%}" for key, v in off.items() if abs(v) >= tol}
    assert not far, f"off the formula by {tol:.0%} or more: {far}"
    return off

def ring_reduce_scatter(chunks):
    """chunks: this rank's K pieces (views). Afterwards chunks[rank] holds their sum."""
    rank, k = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % k, (rank - 1) % k
    incoming = torch.empty_like(chunks[0])    # tensor_split's first is the largest
    for step in range(k - 1):
        send_c, recv_c = (rank - step - 1) % k, (rank - step - 2) % k
        into = incoming[:len(chunks[recv_c])]
        exchange(chunks[send_c], right, into, left)
        chunks[recv_c] += into

def ring_all_gather(chunks):
    """chunks[rank] is complete; afterwards every chunk is, on every rank."""
    rank, k = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % k, (rank - 1) % k
    for step in range(k - 1):
        exchange(chunks[(rank - step) % k], right, chunks[(rank - step - 1) % k], left)

def ring_all_reduce(x):
    """In place, like dist.all_reduce(x): reduce-scatter, then all-gather."""
    chunks = list(torch.tensor_split(x, dist.get_world_size()))
    ring_reduce_scatter(chunks)
    ring_all_gather(chunks)
