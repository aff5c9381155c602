"""Lecture 00's key measured assertion, on a right run and on runs made wrong on purpose.

The claim (notebooks/00_hardware.ipynb, section 6, `course.hardware.link_below_copy`): between two
processes of one host on gloo every byte is copied at least once on each side, through the
kernel's socket buffers, each copy moving its bytes through DRAM, so the link's fitted B
(`measure_link`) is below one core's DRAM copy rate C (2S/t, section 5). A right run must pass it;
a "link" that only copies locally, one copy in cache and no kernel, must fail it. The lecture's
SMOKE sizes keep this to seconds (measured here under load: B / C = 0.10-0.35 on the right run,
4-11 on the wrong one).
"""
import math
import statistics
import types

import pytest
import torch

from course.hardware import bootstrap_fits, link_below_copy, measure_link, ping_pong
from helpers import archive, bench, cost, timing
from machinery import l00_hardware as hardware

SIZES = hardware.powers_of_two(4 * 2**10, 2**24, step=2)   # the lecture's SMOKE messages


def dram_copy_gbps(repeats=5):
    """One core's copy rate 2S/t of a buffer whose working set is at least four times the largest
    cache (section 5's DRAM copy), measured here, independently of the link."""
    largest = max((size for _, size, _ in hardware.cache_levels()), default=0)
    size = max(2**26, 2 ** math.ceil(math.log2(max(2 * largest, 1))))
    src = torch.arange(size // 4, dtype=torch.float32)
    dst = torch.zeros_like(src)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t = statistics.median(timing.measure(lambda: dst.copy_(src), warmup=1, iters=repeats))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(dst, src)
    return 2 * size / t / 1e9


def fitted(fn, check=False):
    """The fit and rows of `fn` timed as measure_link times ping_pong (the same harness call)."""
    rows = bench.sweep({"wrong on purpose": ("send_recv", fn)}, world_sizes=[2], sizes=SIZES,
                       warmup=2, iters=5, rounds=3, progress=False, check=check)
    one_way = [r["time_us"] * 1e-6 / 2 for r in rows]
    return cost.fit_alpha_beta([r["size"] for r in rows], one_way), rows


def copy_instead_of_sending(send, recv):
    """Wrong on purpose: each rank copies its own message into `recv`; nothing crosses the
    kernel, one copy instead of at least two, while the fit counts a message as sent."""
    recv.copy_(send)


def eighth_ping_pong(send, recv):
    """Wrong on purpose: a ping-pong that sends an eighth of each message."""
    n = send.numel() // 8
    ping_pong(send[:n], recv[:n])


def test_a_right_run_passes_the_claim():
    link, rows = measure_link(SIZES, rounds=3, iters=5)
    assert [r["wrong"] for r in rows] == [0] * len(SIZES)
    assert link_below_copy(link, dram_copy_gbps()) < 1


def test_a_link_that_only_copies_fails_the_claim():
    """The negative control: one local copy per "message" (its buffers in cache at these sizes)
    makes B the copy's own rate 2n/t, several times C."""
    link, _ = fitted(copy_instead_of_sending)
    with pytest.raises(AssertionError, match="C = "):
        link_below_copy(link, dram_copy_gbps())


def test_messages_sent_in_part_are_counted_wrong():
    """measure_link's own check (#wrong) catches a ping-pong that sends an eighth of each message:
    7/8 of the elements of every message keep the -1 the harness fills them with."""
    _, rows = fitted(eighth_ping_pong, check=True)
    for r in rows:
        assert r["wrong"] == 2 * (r["count"] - r["count"] // 8), r


def test_sizes_and_the_dram_rate_of_a_sweep():
    assert hardware.powers_of_two(4096, 2**14) == [4096, 8192, 16384]
    assert hardware.powers_of_two(4096, 3 * 2**12, step=1) == [4096, 8192, 16384]  # reaches past
    assert hardware._size("32K") == 2**15 and hardware._size("32768 KB") == 2**25
    caches = [("L1d", 2**15, "0"), ("L3", 2**25, "0-1")]
    sizes = [2**e for e in range(12, 29)]
    rate, picked = hardware.dram_rate(sizes, [float(e) for e in range(12, 29)], caches)
    assert picked == [2**26, 2**27, 2**28] and rate == 27.0     # working sets >= 4 x 32 MiB
    assert hardware.dram_rate(sizes[:3], [1.0, 2.0, 3.0], caches) == (3.0, [2**14])


def test_bootstrap_fits_give_alpha_and_b_their_spread():
    """Rounds of exact times t = alpha + n/B with alphas 10, 20 and 40 us: the fit of the medians
    gives 20 us, and the bootstrap's alphas are the medians of drawn rounds, 10 to 40 us, spread
    around it; B is 1 GB/s in every draw. One round repeated leaves no spread at all."""
    sizes = [2**e for e in range(12, 20)]
    rows = [{"size": n, "times_us": [2e6 * (a + n / 1e9) for a in (10e-6, 20e-6, 40e-6)]}
            for n in sizes]
    fits = bootstrap_fits(rows)
    alphas = timing.summary([round(f.alpha * 1e6, 6) for f in fits])
    assert len(fits) == 200 and alphas["median"] == 20
    assert (alphas["p10"], alphas["p90"]) == (10, 40)
    assert all(math.isclose(f.bandwidth, 1e9, rel_tol=1e-9) for f in fits)
    same = [dict(r, times_us=r["times_us"][:1] * 3) for r in rows]
    assert {round(f.alpha * 1e6, 6) for f in bootstrap_fits(same, draws=20)} == {10}


def test_rates_and_their_spread():
    median, low, high = hardware.rate(2e9, [1.0, 2.0, 4.0])
    assert (median, low, high) == (1.0, 0.5, 2.0)          # 3 samples: min-max
    assert timing.spread_label(3) == "min-max" and timing.spread_label(10) == "p10-p90"
    assert hardware.rate_text(54.83, 53.91, 55.12) == "54.8 (53.9-55.1)"
    assert hardware.rate_text(54.83) == "54.8"
    rows = hardware.gpu_rates([{"n": 2**20, "pageable H2D": [1e-3] * 3, "pinned H2D": [1e-4] * 3,
                                "D2D": [1e-5] * 3}, {"n": 2**20, "pageable H2D": 1.0,
                                                     "pinned H2D": 2.0, "D2D": 3.0}])
    assert math.isclose(rows[0]["D2D"][0], 2 * 2**20 / 1e-5 / 1e9)   # D2D counts 2n
    assert rows[1]["pinned H2D"] == (2.0, None, None)                 # a kept median


def test_hbm_peak_from_the_driver():
    h100 = types.SimpleNamespace(memory_clock_rate=2619000, memory_bus_width=5120)
    assert round(hardware.hbm_peak_gbps(h100)) == 3352                # the datasheet: 3,350
    assert hardware.hbm_peak_gbps(types.SimpleNamespace(memory_clock_rate=0)) is None


def test_the_kept_run_is_read_as_what_it_holds():
    """data/'s H100 run (2026-11-27) is in the current format: samples (so spreads), its caches
    (a 300 MiB L3: its DRAM copy is its 1 GiB copy's rate), the driver's HBM peak and L2."""
    peak = {"HBM3, H100 SXM": 3350.0, "HBM3e, H200": 4800.0}
    runs = [hardware.kept_run(r, peak) for r in archive.runs("00_hardware")]
    h100 = [r for r in runs if "H100" in r["label"]]
    assert h100, "the kept H100 run is missing from data/"
    run = h100[-1]
    assert "earlier version" not in run["label"] and "driver 580.159.04" in run["label"]
    assert run["link_backend"] == "gloo" and round(run["host_gbps"], 1) == 14.3
    gpu = run["gpu"]
    assert (gpu["hbm"], gpu["l2"]) == (3352.32, 52428800)
    assert all(r[c][1] is not None for r in gpu["rows"] for c in hardware.GPU_COPIES)
    assert round(gpu["rows"][-1]["pinned H2D"][0], 1) == 54.5


def test_a_run_of_the_earlier_format_is_read_back(tmp_path):
    """What an earlier version of the lecture wrote (key "pingpong", medians only, no caches)."""
    m = {"cpu_copy": [{"n": n, "GB/s": g} for n, g in ((2**20, 20.0), (2**22, 11.0))],
         "pingpong": [{"n": 4096, "one_way_s": 1e-4}], "pingpong_backend": "gloo",
         "gpu_copies": [{"n": 2**28, "pageable H2D": 8.6, "pinned H2D": 54.8, "D2D": 2830.0}]}
    run = archive.load(archive.save(tmp_path, "00_hardware", m))
    run["machine"]["gpus"] = [{"name": "NVIDIA H100 80GB HBM3", "memory_gib": 79.2}]
    kept = hardware.kept_run(run, {"HBM3, H100 SXM": 3350.0})
    assert "earlier version" in kept["label"] and kept["link"] == [(4096, 1e-4)]
    assert kept["link_backend"] == "gloo" and kept["host_gbps"] == 11.0   # its largest copy
    assert (kept["gpu"]["hbm"], kept["gpu"]["l2"]) == (3350.0, 50e6)
    assert kept["gpu"]["rows"][0]["pinned H2D"] == (54.8, None, None)


def test_a_run_in_the_current_format_is_read_back(tmp_path):
    """What SAVE_TO writes now (samples, caches, the GPU's limits) reads back through kept_run."""
    m = {"caches": [["L3", 2**20, "0"]],
         "cpu_copy": [{"n": n, "samples_s": [2 * n / 10e9] * 3} for n in (2**20, 2**21, 2**22)],
         "link": [{"n": 4096, "round_trips_s": [2e-4, 3e-4, 4e-4]}],
         "link_backend": "gloo",
         "gpu_copies": [{"n": 2**28, "pageable H2D": [0.03] * 3, "pinned H2D": [0.005] * 3,
                         "D2D": [2e-4] * 3}],
         "gpu_limits": {"hbm_gbps": 3352.0, "l2_bytes": 50331648}}
    run = archive.load(archive.save(tmp_path, "00_hardware", m))
    kept = hardware.kept_run(run, {})
    assert "earlier" not in kept["label"] and kept["link"] == [(4096, 1.5e-4)]
    assert math.isclose(kept["host_gbps"], 10.0)                     # every copy: 2S/t = 10 GB/s
    assert kept["gpu"]["hbm"] == 3352.0 and kept["gpu"]["l2"] == 50331648
    assert kept["gpu"]["rows"][0]["D2D"][1] is not None              # samples: a spread


def test_the_caches_claim_takes_the_median_and_a_dram_as_fast_fails_it():
    fast = [1e-4] * 4 + [4e-4]                       # one sample interrupted (4x), as under load
    dram = [3e-4, 3.1e-4, 3.2e-4, 3.3e-4, 3.4e-4]
    in_cache, dram_best = hardware.rate(8e6, fast), [8e6 / min(dram) / 1e9]
    assert in_cache[1] < dram_best[0]                # the slowest sample alone would have failed it
    hardware.assert_caches_beat_dram(in_cache, dram_best)
    with pytest.raises(AssertionError, match="no cache is seen to be faster"):
        hardware.assert_caches_beat_dram(hardware.rate(8e6, [3.05e-4] * 5), dram_best)
