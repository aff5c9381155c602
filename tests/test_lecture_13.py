"""Lecture 13 (N-D parallelism on a device mesh): its key measured claim with negative controls.

The claim (notebooks/13_nd_parallelism.ipynb, section 1, DTensor): each `redistribute` of a small
float64 tensor on the "tp" dimension of a (2, 2) mesh issues exactly the collective of the lecture's
table (Partial -> Replicate: all-reduce; Partial -> Shard(0): reduce-scatter; Shard(0) -> Replicate:
all-gather; Shard(0) -> Shard(1): all-to-all, which torch 2.13 replaces on CPU by an all-gather and
a local chunk; Replicate -> Shard(0): nothing), on the tp group, sending the ring's bytes
(`assert_redistribute`), and every rank's piece equals the full tensor's. Counts do not depend on
the machine's load. Made wrong on purpose, it must fail:
- a table that maps Partial -> Shard(0) to an all-reduce;
- the table's all-to-all held against the CPU run (no fallback allowed);
- the right table with the bytes of one row off by a factor of two.

Section 4's `differences` (torch's fake-process-group counts against planner.traffic) is checked on
the planner's own dicts: none against itself, and a layout off by one factor is seen; the counts
themselves are tests/test_fake_mesh.py's.

The code shown in section 3's markdown is nd3d.py's own, line by line.
"""
import json
import re
from pathlib import Path

import pytest
import torch

from course.nd_parallelism import (CPU_ALL_TO_ALL, REDISTRIBUTE, assert_redistribute,
                                   differences, redistribute_calls)
from helpers import fake_mesh, planner, shape
from helpers.spawn import spawn

LECTURE = Path(shape.NOTEBOOKS) / "13_nd_parallelism.ipynb"
SHAPE, TP = (2, 2), 2
FULL = torch.arange(6 * TP ** 2, dtype=torch.float64).view(2 * TP, -1)
N = FULL.numel() * FULL.element_size()


@pytest.fixture(scope="module")
def moved():
    return spawn(redistribute_calls, 4, args=(SHAPE, FULL), backend="gloo")


def _calls(run):
    return {move: calls for move, (calls, _) in run.items()}


def test_every_redistribute_issues_the_tables_collective(moved):
    for r, run in enumerate(moved):
        assert_redistribute(_calls(run), N, TP)
        for (src, dst), (_, local) in run.items():
            k = int(dst[-2]) if dst.startswith("Shard") else None
            want = FULL if k is None else FULL.tensor_split(TP, k)[r % TP]
            torch.testing.assert_close(local, want, rtol=0, atol=0)


def test_a_wrong_table_fails(moved):
    counted = _calls(moved[0])
    wrong_kind = {**REDISTRIBUTE, ("Partial", "Shard(0)"): REDISTRIBUTE["Partial", "Replicate"]}
    with pytest.raises(AssertionError):
        assert_redistribute(counted, N, TP, table=wrong_kind)
    with pytest.raises(AssertionError):                  # the GPU's all-to-all, held against CPU
        assert_redistribute(counted, N, TP, cpu=False)
    kind, sent = REDISTRIBUTE["Shard(0)", "Replicate"]
    wrong_bytes = {**REDISTRIBUTE, ("Shard(0)", "Replicate"): (kind, lambda N, n: 2 * sent(N, n))}
    with pytest.raises(AssertionError):
        assert_redistribute(counted, N, TP, table=wrong_bytes)
    assert CPU_ALL_TO_ALL[1](N, TP) == TP * REDISTRIBUTE["Shard(0)", "Shard(1)"][1](N, TP)


def test_differences_sees_a_layout_off_by_a_factor():
    model = fake_mesh.stack_model(2, 4096, 32, 32)
    right = planner.traffic(model, 128, 1, 128, 8, 1, zero=3)
    assert differences(right, right) == {}
    off = differences(planner.traffic(model, 128, 1, 128, 4, 1, zero=3), right)   # tp off by 2
    assert set(off) == {("data", "all_gather"), ("data", "reduce_scatter")}       # S: t x fewer
    redo = differences(planner.traffic(model, 128, 1, 128, 8, 1, zero=3, recompute="none"), right)
    assert redo == {("tensor", "all_reduce"): (-2 * 2, -2 * 2 * 2 * 32 * 4096)}    # 2 a layer


def test_section_3_shows_nd3d_s_own_lines():
    source = {line.strip() for line in (LECTURE.parent / "nd3d.py").read_text().splitlines()}
    cells = json.loads(LECTURE.read_text())["cells"]
    shown = [line.strip() for c in cells if c["cell_type"] == "markdown"
             for block in re.findall(r"```python\n(.*?)```", "".join(c["source"]), re.S)
             for line in block.splitlines() if line.strip()]
    assert len(shown) >= 8
    assert [line for line in shown if line not in source] == []
