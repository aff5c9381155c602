"""Lecture 04 (CUDA streams and overlap): its shape, its key measured claim with negative controls,
and the machinery it moved to notebooks/machinery/l04_cuda_streams.py.

The claim (notebooks/04_cuda_streams.ipynb, section 4): on the H100 model (lecture 02's ring over
the paced link with NVLink's step, on a comm thread of its own; device-like compute of a linear's
backward at the H100's GEMM rate, slowed 1 + c times while the ring runs), the overlapped step
takes the model's max(M, C + M c/(1+c)) within 5 ms (course.cuda_streams.assert_overlaps). Two
negative controls must fail it:
- a wrong algorithm, whatever the machine: the compute made to wait for the collective
  (sequential_step in the place of the overlapped step), M + C, above the model by the shorter
  piece at every row;
- a wrong machine: the model without contention held against a run with c = 0.40, off by
  M c/(1+c) where the compute is the longer piece.
Both stand-ins sleep, so the timings hold on a loaded machine; the median of 5 repetitions (as the
lecture at SMOKE) resists two slow ones; the test takes about fifteen seconds.
"""
from pathlib import Path

import pytest

from course.cuda_streams import (assert_hides_the_shorter, assert_overlaps, overlapped_step,
                                 sequential_step)
from helpers import archive, cost, machine, machines
from helpers.site import shape
from machinery import l04_cuda_streams as streams_bench
from helpers.spawn import spawn

H100 = machines.Scaled(machines.H100, time=300, bytes=256)       # the lecture's H100 model
GRAD_BYTES, D = 32 * 2**20, 4096
COMPUTE_S = {n: H100.compute(4 * n * D * D) for n in (512, 2048, 4096)}
ALPHA, BW = machines.link(machines.H100)
T_LINK = H100.wall(cost.ring_all_reduce(GRAD_BYTES, 2, BW, ALPHA))
LECTURE = Path(shape.NOTEBOOKS) / "04_cuda_streams.ipynb"


def _rows(steps, shares):
    runs = spawn(streams_bench.overlap_rank, 2, backend="gloo",
                 args=(steps, GRAD_BYTES // 256 // 4, COMPUTE_S, 5, H100.link(), shares))
    return streams_bench.step_rows(runs, T_LINK, COMPUTE_S, label="tokens")


def test_an_overlapped_step_meets_the_model_and_a_serialised_one_or_a_wrong_machine_fails():
    rows = _rows({"overlapped": overlapped_step, "serialised": sequential_step}, (0.0, 0.40))
    assert assert_overlaps(rows)
    for row in rows:                                 # every row, the smallest margin first
        wrong = {**row, "overlapped ms": row["serialised ms"]}
        with pytest.raises(AssertionError, match="off the model"):
            assert_overlaps([wrong])
        m, c = row["comm model ms"], row["compute model ms"]
        assert wrong["overlapped ms"] - row["overlapped model ms"] >= min(m, c) - 0.5 - m * 0.4 / 1.4
    # the wrong machine: no contention in the model, c = 0.40 in the run, the compute the longer
    loaded = [r for r in rows if r["contention"] == 0.40 and r["compute model ms"] > r["comm model ms"]]
    assert loaded
    for row in loaded:
        blind = {**row, "overlapped model ms": max(row["comm model ms"], row["compute model ms"])}
        with pytest.raises(AssertionError, match="off the model"):
            assert_overlaps([blind])


def test_the_claim_uses_the_model_it_is_given():
    """assert_overlaps compares with the rows' model, never with their measured pieces."""
    row = {"overlapped model ms": 100.0, "overlapped ms": 104.0, "comm ms": 114.0, "compute ms": 50.0}
    assert assert_overlaps([row])                                # 5 ms of slack
    with pytest.raises(AssertionError, match=r"\+6.0 ms"):
        assert_overlaps([{**row, "overlapped ms": 106.0}])


def test_the_cpu_share_is_taken_around_the_collective_only():
    """Per rank, the share of a core its process used during its all-reduce: at most the cores
    each rank has (one on 2 cores; its threads, gloo's among them, can use more where there are
    more), which a share taken around a fill, a barrier and a check was not."""
    runs = spawn(streams_bench.overlap_rank, 2, backend="gloo",
                 args=({"overlapped": overlapped_step}, 2**20, [0.5], 3, None, (0.0,), "matmul"))
    _, medians = streams_bench.cpu_shares(runs)
    each = machine.usable_cores() / 2
    assert all(0 < m <= 1.05 * each for m in medians), (medians, each)


def test_the_lecture_has_the_shape():
    got = shape.shape(LECTURE)
    assert got["minutes"] <= shape.MINUTES and got["cells over 60"] == 0
    assert got["lines over 88"] == 0 and got["before section 1"] <= shape.BEFORE_SECTION_1
    assert got["wordy prints"] == 0 and got["chosen texts"] == 0


def test_the_kept_hosts_hide_the_shorter_piece_and_shared_cores_do_not():
    """The optional section's claim on the kept runs (16 cores, 2 ranks); its control, rows as this
    2-core machine gives them (cores shared: overlap near 0 at every ratio), must fail it."""
    kept = streams_bench.spare_core_runs(archive.runs("04_cuda_streams"))
    assert len(kept) >= 2
    for _, rows in kept:
        assert_hides_the_shorter(rows)
    # the optional section's rows of lecture 04 at full size on this 2-core machine (make html,
    # 2026-11-28): cores shared
    shared = [{"ratio": r, "measured ratio": m, "overlap": o}
              for r, m, o in ((0.25, 0.26, -0.02), (0.5, 0.52, -0.06), (1.0, 1.01, 0.04),
                              (2.0, 1.87, 0.09))]
    with pytest.raises(AssertionError):
        assert_hides_the_shorter(shared)
