"""The cost models and the collective benchmark harness (helpers/cost.py, helpers/bench.py)."""
import math

import pytest
import torch.distributed as dist

from helpers import bench, cost


def test_size_range_and_sizes_as_written():
    assert bench.size_range("1K", "4K", 2) == [1024, 2048, 4096]
    assert bench.parse_size("64M") == 64 * 2**20 and bench.human_size(64 * 2**20) == "64M"


@pytest.mark.parametrize("collective, k, factor", [
    ("all_reduce", 4, 1.5), ("all_reduce", 2, 1.0), ("all_gather", 4, 0.75),
    ("reduce_scatter", 8, 7 / 8), ("broadcast", 4, 1.0), ("reduce", 4, 1.0), ("send_recv", 4, 1.0)])
def test_busbw_factors_are_those_of_nccl_tests(collective, k, factor):
    assert cost.busbw_factor(collective, k) == pytest.approx(factor)
    assert cost.busbw(collective, 1e9, 1.0, k) == pytest.approx(factor * cost.algbw(1e9, 1.0))


def test_ring_models_follow_their_formulas():
    n, k, bw = 2**20, 4, 1e9
    assert cost.ring_broadcast(n, k, bw) == pytest.approx((k - 1) * n / bw)
    assert cost.chunked_ring_broadcast(n, k, 1, bw) == pytest.approx(cost.ring_broadcast(n, k, bw))
    assert cost.chunked_ring_broadcast(n, k, 8, bw) == pytest.approx((k - 2 + 8) * n / (8 * bw))
    assert cost.ring_all_reduce(n, k, bw) == pytest.approx(2 * (k - 1) / k * n / bw)
    assert cost.chunked_ring_broadcast(n, k, 10**6, bw) == pytest.approx(n / bw, rel=1e-4)


def test_the_tree_model_has_one_port_per_rank():
    # K=2: one message up, one down. K=4 (0 -> 1, 2; 1 -> 3): rank 0 receives from 2 and 1 one after
    # the other (2 steps, the second after 1 got 3's), then sends to 1 and 2 in turn, 1 forwards to 3.
    step = cost.tree_all_reduce(10, 2, 1.0, 0.5) / 2
    assert step == pytest.approx(10.5)
    assert cost.tree_all_reduce(10, 4, 1.0, 0.5) == pytest.approx(4 * step)
    assert cost.tree_all_reduce(10, 7, 1.0, 0.5) == pytest.approx(8 * step)  # up: 2 + 2 messages, down: 2 + 2
    for k in (8, 64, 1024):  # about 4 log2 K steps: each level 2 messages through one port, each way
        assert 4 * (math.log2(k) - 1) * step <= cost.tree_all_reduce(10, k, 1.0, 0.5) <= 4 * math.log2(k) * step


def test_in_network_reduction_moves_n_bytes_each_way_whatever_k():
    n, bw = 2**30, 450e9
    assert cost.in_network_all_reduce(n, 8, bw) == pytest.approx(n / bw)
    assert cost.in_network_all_reduce(n, 8, bw) < cost.ring_all_reduce(n, 8, bw) < 2 * n / bw
    busbw = cost.busbw("all_reduce", n, cost.in_network_all_reduce(n, 8, bw), 8)  # exceeds the link's 450
    assert busbw == pytest.approx(1.75 * bw / 1e9)


def test_the_alpha_beta_fit_recovers_exact_parameters():
    sizes = [2**i for i in range(10, 27)]
    fit = cost.fit_alpha_beta(sizes, [20e-6 + n / 3e9 for n in sizes])
    assert fit.alpha == pytest.approx(20e-6, rel=1e-6)
    assert fit.bandwidth == pytest.approx(3e9, rel=1e-6)
    assert fit.half_size == pytest.approx(20e-6 * 3e9, rel=1e-6)
    assert fit.median_relative_error() < 1e-9


def test_the_fit_stays_physical():
    fit = cost.fit_alpha_beta([1, 2, 4], [1.0, 0.95, 0.9])  # noise that falls with size: no negative
    assert fit.beta == 0 and 0.9 < fit.alpha < 1.0 and math.isinf(fit.bandwidth)  # bandwidth


def test_a_sweep_checks_results_and_counts_wrong_ones():
    def broken_all_reduce(tensor):
        dist.all_reduce(tensor)
        if dist.get_rank() == 1:
            tensor[0] += 1  # one wrong element on one rank

    rows = bench.sweep({"library": "all_reduce", "broken": ("all_reduce", broken_all_reduce)},
                       world_sizes=[2], sizes=[1024, 4096], warmup=1, iters=3, progress=False)
    by = {(r["collective"], r["size"]): r for r in rows}
    assert sorted(by) == [("broken", 1024), ("broken", 4096), ("library", 1024), ("library", 4096)]
    assert all(by[("library", s)]["wrong"] == 0 for s in (1024, 4096))
    assert all(by[("broken", s)]["wrong"] > 0 for s in (1024, 4096))
    for r in rows:
        assert r["iters"] == 3 and r["time_us"] > 0
        assert r["busbw"] == pytest.approx(r["algbw"] * cost.busbw_factor("all_reduce", 2))


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_results_files_round_trip(tmp_path, suffix):
    rows = bench.sweep(["broadcast"], world_sizes=[2], sizes=[1024], warmup=1, iters=2, progress=False)
    path = bench.save(rows, tmp_path / f"r{suffix}", bench.metadata(world_size=2, backend="gloo"))
    back, meta = bench.load(path)
    assert meta["world_size"] == 2 and "cpu" in str(meta)
    assert [r["size"] for r in back] == [1024] and back[0]["wrong"] == 0
    assert back[0]["busbw"] == pytest.approx(rows[0]["busbw"], rel=1e-6)


def test_every_collective_is_checked_at_every_size_of_a_shared_buffer():
    # The cases of one collective share buffers sized for the largest (as in nccl-tests), and the
    # sizes take turns in a shuffled order: the library is right everywhere, and a function that
    # does nothing is caught at every size, even where an earlier, larger run left right values.
    def nothing(*args):
        pass

    kinds = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "send_recv"]
    plan = {**{k: k for k in kinds}, **{f"no-op {k}": (k, nothing) for k in kinds}}
    rows = bench.sweep(plan, world_sizes=[2], sizes=[1024, 4096, 2**16], warmup=1, iters=3,
                       progress=False, interleave=True)
    assert len(rows) == 2 * len(kinds) * 3
    for r in rows:
        assert (r["wrong"] > 0) == r["collective"].startswith("no-op"), r


def _record_sizes(rank, k, sizes, rounds, method="per-call", iters=1):
    calls = []

    def recording_all_reduce(tensor):
        calls.append(tensor.numel() * 4)
        dist.all_reduce(tensor)

    plan = [("recorded", "all_reduce", recording_all_reduce)]
    if method == "per-call":
        bench.measure_rank(rank, k, plan, sizes, warmup=1, iters=rounds, method=method)
    else:
        bench.measure_rank(rank, k, plan, sizes, warmup=1, iters=iters, method=method, rounds=rounds)
    return calls


def test_rounds_take_the_sizes_in_a_shuffled_order_the_same_on_every_rank():
    from helpers.spawn import spawn

    sizes, rounds = [1024, 2048, 4096, 8192], 6
    per_rank = spawn(_record_sizes, 2, args=(sizes, rounds))
    assert per_rank[0] == per_rank[1]  # the same order on every rank (or the ranks would deadlock)
    timed = per_rank[0][len(sizes):]  # after one warm-up call per size
    orders = [timed[i * len(sizes):(i + 1) * len(sizes)] for i in range(rounds)]
    assert all(sorted(o) == sizes for o in orders)  # every size once per round
    assert len({tuple(o) for o in orders}) > 1  # and not in the same order every round


def test_nccl_tests_method_times_loops_of_back_to_back_calls():
    # nccl-tests' method: per round and size, `iters` calls in a row (one barrier before them, none
    # between); in the last round each loop is followed by one more call, from restored inputs, the check.
    from helpers.spawn import spawn

    sizes, rounds, iters = [1024, 4096], 3, 5
    calls = spawn(_record_sizes, 2, args=(sizes, rounds, "nccl-tests", iters))[0]
    timed = calls[len(sizes):]  # after one warm-up call per size
    blocks = [iters] * (rounds - 1) * len(sizes) + [iters + 1] * len(sizes)
    assert len(timed) == sum(blocks)
    start, per_round = 0, []
    for i, n in enumerate(blocks):
        block = timed[start:start + n]
        start += n
        assert len(set(block)) == 1, block  # one size, called back to back
        per_round.append(block[0])
    for r in range(rounds):
        assert sorted(per_round[r * len(sizes):(r + 1) * len(sizes)]) == sizes  # every size once a round


def test_combine_takes_the_slowest_rank_per_call_and_nccl_tests_average_per_loop():
    def per_rank(method, times):
        return [{"backend": "gloo", "method": method, "iters": 7,
                 "rows": [{"label": "x", "kind": "all_reduce", "size": 8, "count": 2, "times": t, "wrong": 0}]}
                for t in times]

    times = [[1.0, 4.0, 2.0], [3.0, 2.0, 2.0]]  # rank 0's runs, rank 1's runs
    slowest = bench.combine(per_rank("per-call", times), 2)[0]
    assert slowest["time_us"] == pytest.approx(3e6) and slowest["ranks"] == "slowest"  # median of 3, 4, 2
    for average, want in ((1, 2.0), (0, 2.0), (2, 2.0), (3, 3.0)):  # per round: mean, rank 0, min, max
        row = bench.combine(per_rank("nccl-tests", times), 2, average=average)[0]
        assert row["time_us"] == pytest.approx(want * 1e6), (average, row)
        assert row["iters"] == 7 and row["method"] == "nccl-tests"
    with pytest.raises(ValueError, match="nccl-tests' -a"):
        bench.combine(per_rank("nccl-tests", times), 2, average=4)


def test_the_command_takes_nccl_tests_letters(tmp_path, capsys):
    out = tmp_path / "r.json"
    rows = bench.main(["--world-size", "2", "--collectives", "all_reduce", "-b", "1K", "-e", "4K", "-f", "4",
                       "-w", "1", "-n", "3", "-N", "2", "-a", "3", "-c", "1", "--no-progress", "-o", str(out)])
    assert [r["size"] for r in rows] == [1024, 4096] and all(r["wrong"] == 0 for r in rows)
    assert all(r["method"] == "nccl-tests" and r["ranks"] == "max" and r["iters"] == 3 for r in rows)
    back, meta = bench.load(out)
    assert meta["params"]["method"] == "nccl-tests" and meta["params"]["rounds"] == 2
    assert "nccl-tests' method: 3 calls back to back" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main(["--world-size", "2", "-n", "0", "--no-progress"])


def test_collectives_that_take_turns_keep_their_own_times():
    # Lecture 02 once showed two interleaved all-reduces at the same median to the microsecond; a
    # function 20 ms slower than the library must come out 20 ms slower, under its own label.
    import time

    def slow(tensor):
        time.sleep(0.02)
        dist.all_reduce(tensor)

    for method in ("per-call", "nccl-tests"):
        rows = bench.sweep({"library": "all_reduce", "slow": ("all_reduce", slow)}, world_sizes=[2], sizes=[1024],
                           warmup=1, iters=3, interleave=True, progress=False, method=method)
        by = {r["collective"]: r["time_us"] for r in rows}
        assert by["slow"] > 15000 > by["library"] and by["slow"] - by["library"] > 15000, (method, by)
