"""The instruments that wrap the lectures' plain code: the tracer of torch.distributed calls
(helpers.trace), the paced link and device-like compute (helpers.standins), the timeline recorder
(helpers.timeline). Timings are asserted as bounds that load cannot break (a sleep only lasts longer)
or with margins of a whole model term."""
import threading
import time

import pytest
import torch
import torch.distributed as dist

from helpers import standins, timeline, trace
from helpers.spawn import spawn


def _traced(rank, k):
    import torch.distributed._functional_collectives as fc

    x = torch.ones(6)
    with trace.calls(strict=True) as log:
        log.phase = "collectives"
        dist.all_reduce(x)
        out = torch.empty(6 * k)
        dist.all_gather_into_tensor(out, x)
        dist.all_gather([torch.empty(6) for _ in range(k)], x)
        dist.reduce_scatter_tensor(torch.empty(6 // k * 1), torch.ones(6)) if 6 % k == 0 else None
        dist.broadcast(x, 0)
        dist.barrier()
        log.phase = "p2p"
        y = torch.empty(6)
        ops = [dist.P2POp(dist.isend, x, (rank + 1) % k), dist.P2POp(dist.irecv, y, (rank - 1) % k)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        log.phase = "functional"
        fc.wait_tensor(fc.all_reduce(x, "sum", dist.group.WORLD))
        sub = dist.new_group([0, 1])
        if rank in (0, 1):
            dist.all_reduce(x, group=sub)
    return [vars(c) | {"ring_sent": c.ring_sent} for c in log.calls], log.rows(by=("phase", "kind"))


@pytest.mark.parametrize("k", [2, 3])
def test_the_tracer_sees_every_call_with_nccl_tests_bytes(k):
    calls, rows = spawn(_traced, k)[0]
    kinds = [c["kind"] for c in calls]
    assert kinds[:4] == ["all_reduce", "all_gather", "all_gather"] + (["reduce_scatter"] if 6 % k == 0 else ["broadcast"])
    by = {(c["kind"], c["phase"]): c for c in calls}
    assert by["all_reduce", "collectives"]["nbytes"] == 24 and by["all_reduce", "collectives"]["ring_sent"] == round(48 * (k - 1) / k)
    assert [c["nbytes"] for c in calls if c["kind"] == "all_gather"] == [24 * k, 24 * k]   # the output: K x the input
    assert by["send", "p2p"]["nbytes"] == 24 and by["send", "p2p"]["peer"] == 1 % k and by["send", "p2p"]["ring_sent"] == 24
    assert by["recv", "p2p"]["peer"] == (0 - 1) % k and by["recv", "p2p"]["ring_sent"] == 0
    assert by["barrier", "collectives"]["nbytes"] == 0
    assert by["all_reduce", "functional"]["nbytes"] == 24 and by["all_reduce", "functional"]["dtype"] == "torch.float32"
    groups = {c["group"]: c["ranks"] for c in calls}
    assert tuple(range(k)) in groups.values() and (0, 1) in groups.values() and len(groups) == 2
    assert {"phase": "p2p", "kind": "send", "calls": 1, "bytes": 24, "ring sent": 24} in rows


def test_the_tracer_changes_no_result():
    def fn(rank, k):
        a, b = torch.arange(5.0) + rank, torch.arange(5.0) + rank
        dist.all_reduce(a)
        with trace.calls():
            dist.all_reduce(b)
        return torch.equal(a, b)

    assert all(spawn(fn, 2))


def _one_way(rank, k, nbytes, gbps, peers):
    """Rank 0 receives one message from each of `peers` (a root's in-port), timed on rank 0.
    Rank 0 starts its clock and then tells the peers to go (not a barrier, whose ranks leave at
    different times): every paced send starts after t0, so no message can arrive early."""
    x, go = torch.ones(nbytes // 4), torch.zeros(1)
    t0 = time.perf_counter()
    if rank == 0:
        for dst in range(1, k):
            dist.send(go, dst)
    else:
        dist.recv(go, 0)
    with standins.paced_link(gbps):
        if rank == 0:
            for src in range(1, peers + 1):
                dist.recv(x, src)
        elif rank <= peers:
            dist.send(x, 0)
    return time.perf_counter() - t0


def _exchange(rank, k, nbytes, gbps):
    """Both ranks send and receive at once: each port carries one message."""
    x, y = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
    dist.barrier()
    t0 = time.perf_counter()
    with standins.paced_link(gbps):
        ops = [dist.P2POp(dist.isend, x, 1 - rank), dist.P2POp(dist.irecv, y, 1 - rank)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
    return time.perf_counter() - t0, torch.equal(y, x)


def test_the_paced_link_charges_each_port_one_message_at_a_time():
    tau = 0.2                                     # seconds per message: 4 MB at 0.02 GB/s
    one = spawn(_one_way, 2, args=(4 * 10**6, 0.02, 1))[0]
    root = spawn(_one_way, 3, args=(4 * 10**6, 0.02, 2))[0]
    assert one >= tau and root >= 2 * tau         # a sleep only lasts longer: load cannot break these
    assert one < 1.5 * tau, "a blocking send paid its message twice (send calls isend in torch 2.13)"
    assert root - one > 0.6 * tau, "the root took its two messages at once: its in-port is not paced"
    both = spawn(_exchange, 2, args=(4 * 10**6, 0.02))
    assert all(ok for _, ok in both) and all(t >= tau for t, _ in both)
    assert max(t for t, _ in both) < 1.6 * tau, "an exchange paid both directions one after the other"


def test_the_paced_link_is_gloo_only_and_restores_torch(monkeypatch):
    real = dist.isend
    monkeypatch.setattr(dist, "get_backend", lambda *a: "nccl")
    with pytest.raises(RuntimeError, match="gloo"):
        with standins.paced_link(0.01):
            pass
    assert dist.isend is real
    with standins.paced_link(None):               # no pacing: nothing is replaced
        assert dist.isend is real


def test_device_compute_takes_time_but_no_core():
    cpu0, t0 = time.process_time(), time.perf_counter()
    standins.device_compute(0.2)
    assert time.perf_counter() - t0 >= 0.2 and time.process_time() - cpu0 < 0.05
    layer = standins.DeviceLike(torch.nn.Linear(4, 4), 0.05)
    x = torch.randn(2, 4, requires_grad=True)
    t0 = time.perf_counter()
    y = layer(x)
    t1 = time.perf_counter()
    y.sum().backward()
    assert t1 - t0 >= 0.05 and time.perf_counter() - t1 >= 0.1          # backward: twice the forward
    torch.testing.assert_close(x.grad, torch.ones(2, 4) @ layer.layer.weight)
    only_backward = standins.DeviceLike(torch.nn.Linear(4, 4), 0.0, 0.1)
    t0 = time.perf_counter()
    y = only_backward(x)
    t1 = time.perf_counter()
    y.sum().backward()
    assert t1 - t0 < 0.05 and time.perf_counter() - t1 >= 0.1



def _steps(rank, k, alpha, n):
    """n one-way messages of 4 bytes from rank 0 to rank 1 on a link with latency alpha."""
    x, go = torch.ones(1), torch.zeros(1)
    dist.barrier()
    t0 = time.perf_counter()
    with standins.paced_link(1.0, alpha):
        for _ in range(n):
            dist.send(x, 1) if rank == 0 else dist.recv(x, 0)
    return time.perf_counter() - t0


def test_the_paced_link_charges_its_alpha_per_transfer():
    """Ten messages take at least ten alphas on the receiver (its in-port), and not twice that."""
    alpha = 0.02
    took = spawn(_steps, 2, args=(alpha, 10))[1]
    assert 10 * alpha <= took < 17 * alpha, took


def _slowed(rank, k, share, comm_s, compute_s):
    """Device-like compute of compute_s beside a collective in flight for comm_s (a sleep on the
    comm thread), under contention(share): its wall time."""
    from helpers import comm_stream

    with comm_stream.paced(lambda t: time.sleep(comm_s), 1e6), standins.contention(share):
        work = dist.all_reduce(torch.ones(1), async_op=True)
        t0 = time.perf_counter()
        standins.device_compute(compute_s)
        took = time.perf_counter() - t0
        work.wait()
    return took


def test_contention_slows_compute_only_while_a_collective_is_in_flight():
    """Compute of C beside a collective of M < C (1 + c): M/(1+c) of its progress is made during
    the collective, the rest alone: C + M c/(1+c); with no contention, C."""
    c, comm, compute = 0.5, 0.2, 0.3
    slowed = spawn(_slowed, 2, args=(c, comm, compute), backend="gloo")
    plain = spawn(_slowed, 2, args=(0.0, comm, compute), backend="gloo")
    want = compute + comm * c / (1 + c)                     # 0.367 s
    # the collective starts a little before the compute (the call returns first): a few ms less
    assert all(want - 0.005 <= t < want + 0.03 for t in slowed), slowed
    assert all(compute <= t < compute + 0.03 for t in plain), plain


def _streamed(rank, k):
    from course.ring_math import ring_all_reduce
    from helpers import comm_stream

    x, y = torch.full((1000,), rank + 1.0), torch.full((10,), 2.0 * rank)
    with comm_stream.paced(ring_all_reduce, 1e-3, 0.01) as stream:   # 1 MB/s, 10 ms a step
        first = dist.all_reduce(x, async_op=True)
        returned = time.perf_counter()
        dist.all_reduce(y)                                   # queued behind the first
        first.wait()
    return x, y, returned - stream.calls[0]["queued"], stream.calls


def test_the_comm_stream_runs_the_lectures_algorithm_in_order_on_its_own_thread():
    """An async all-reduce returns at once; the calls run one after the other, each the ring's
    2(K-1) paced steps; the sums are the sums."""
    for x, y, returned, calls in spawn(_streamed, 2, backend="gloo"):
        assert torch.equal(x, torch.full((1000,), 3.0)) and torch.equal(y, torch.full((10,), 2.0))
        assert returned < 0.01, "the async call waited for the collective"
        (a, b) = calls
        assert b["start"] >= a["end"], "two collectives ran at once on one link"
        assert a["end"] - a["start"] >= 2 * (0.01 + 2000 / 1e6), "the ring's two steps, paced"


def test_the_recorder_stamps_spans_and_collectives_on_one_axis():
    def fn(rank, k):
        rec = timeline.Recorder()
        dist.barrier()
        origin = time.perf_counter()
        with rec.span("sleep"):
            time.sleep(0.05 * (rank + 1))
        work = dist.all_reduce(torch.ones(4), async_op=True)
        rec.until("all-reduce", work)
        work.wait()
        rec.mark("done")
        return rec.events(), rec.events(origin=origin)

    (own0, shared0), (own1, shared1) = spawn(fn, 2)
    assert [e["name"] for e in own0] == ["sleep", "all-reduce", "done"] and own0[0]["start"] == 0.0
    assert shared1[0]["end"] - shared1[0]["start"] >= 0.1 and own0[0]["end"] - own0[0]["start"] >= 0.05
    # the all-reduce cannot end on rank 0 before rank 1 has slept its 0.1 s and joined it
    assert shared0[1]["end"] >= shared1[0]["end"] - 0.005
    assert shared0[2]["start"] == shared0[2]["end"]


def test_the_tracer_does_not_see_a_call_made_on_another_thread():
    """What the docstring warns: a future's callback runs on the thread that completes the future
    (gloo's, for a work still running when the callback is attached), where the thread-local
    dispatch mode is not; attached to a future already done, it runs at once on the caller's
    thread and is seen. Both cases made deterministic: a future completed from another thread,
    and a work waited for before its callback is attached."""
    def fn(rank, k):
        x, y, z = torch.ones(4), torch.ones(4), torch.ones(4)
        with trace.calls() as log:
            pending = torch.futures.Future()
            chained = pending.then(lambda f: dist.all_reduce(y))      # on the thread below
            done = threading.Thread(target=pending.set_result, args=(None,))
            done.start()
            done.join()
            chained.wait()
            fut = dist.all_reduce(x, async_op=True).get_future()     # seen
            fut.wait()
            fut.then(lambda f: dist.all_reduce(z)).wait()             # inline: seen
        return log.count("all_reduce"), all(torch.equal(t, torch.full((4,), 2.0)) for t in (y, z))

    assert spawn(fn, 2) == [(2, True), (2, True)]
