"""The machine model (helpers/machines.py, "the H100 model") and the published measurements kept
beside it (data/published/): every figure has a source; the model prices a ring as NCCL's tuning
model does; the published files carry their citations; and the model's latency meets the published
small messages, where a model of one protocol does not. The ring's published plateau is lecture
02's claim (tests/test_lecture_02.py)."""
import json
import math
from dataclasses import fields
from pathlib import Path

import pytest

from helpers import cost, machines

PUBLISHED = Path(machines.PUBLISHED)


def test_every_figure_of_every_machine_names_its_source():
    for m in (machines.H100, machines.A100):
        figures = [f.name for f in fields(m) if f.name not in ("name", "arch", "sources")]
        assert sorted(m.sources) == sorted(figures), m.name
        assert all(key in machines.SOURCES for key in m.sources.values()), m.name
        assert m.gemm_flops < m.peak_flops, "an achieved rate is below the datasheet's peak"


def test_the_ring_is_priced_as_nccl_prices_it():
    """8 GPUs on NVLink: 14 steps. A tiny message pays LL's latency, 6.6 + 14 x 0.6 us; a large one
    Simple's bandwidth, 2(K-1)/K N / B; two nodes pay 2 of their steps at the network's latency."""
    h = machines.H100
    assert machines.ring_all_reduce(h, 8, 8) == pytest.approx(15.0e-6, rel=1e-3)
    big = 2**32
    assert machines.ring_all_reduce(h, big, 8) == pytest.approx(
        8.4e-6 + 14 * 3.4e-6 + 1.75 * big / (18 * 20.6e9), rel=1e-9)
    two = machines.ring_all_reduce(h, big, 16, nodes=2, protocol="Simple")
    assert two == pytest.approx(8.4e-6 + 28 * 3.4e-6 + 2 * 14e-6 + 30 / 16 * big / (18 * 20.6e9),
                                rel=1e-9)


def test_a_ring_across_nodes_moves_at_the_node_s_nics_together_and_one_nic_does_not():
    """NVIDIA's figure for two DGX A100 (8 x 200 Gb/s IB a node): 192 GB/s all-reduce busbw
    (SOURCES["nccl-net"], not fitted). The model's ring at 8 GiB on 16 GPUs reads within 0.9-1 of
    its busbw; the ring at one NIC's B (the model's old mistake) is 8 times off."""
    a, n, k = machines.A100, 8 * 2**30, 16
    busbw = lambda t: cost.busbw("all_reduce", n, t, k)           # noqa: E731
    model = busbw(machines.ring_all_reduce(a, n, k, nodes=2))
    assert 0.9 <= 192 / model <= 1.0, model
    one_nic = busbw(2 * (k - 1) / k * n / a.nic_bw)
    assert not 0.9 <= 192 / one_nic <= 1.0


def test_a_scaled_machine_gives_the_paced_link_its_scaled_terms():
    s = machines.Scaled(machines.H100, time=1000, bytes=64)
    gbps, alpha = s.link()
    assert alpha == pytest.approx(3.4e-3)                       # 3.4 us of the model: 3.4 ms here
    assert gbps * 1e9 == pytest.approx(18 * 20.6e9 / 64 / 1000)   # a byte here is 64 of the model
    assert s.compute(794.5e12) == pytest.approx(1000.0)          # one second of the GEMM rate
    gbps, alpha = s.paced(machines.H100.nic_bw, 14e-6)            # a GPU's own NIC
    assert alpha == pytest.approx(14e-3) and gbps * 1e9 == pytest.approx(50e9 / 64 / 1000)


def test_every_published_file_names_its_source_and_is_listed():
    readme = (PUBLISHED / "README.md").read_text()
    files = sorted(PUBLISHED.glob("*.json"))
    assert files
    for f in files:
        doc = json.loads(f.read_text())
        assert doc["title"] and doc["measured"] and f.name in readme, f.name
        for row in doc["rows"]:
            assert len(row) == len(doc["columns"]), f.name
        if "citation" in doc:                                   # a table from one source
            assert doc["citation"].count("https://") >= 1 and doc["machine"] in ("H100", "A100")
        else:                                                   # statements, each with its own
            assert all(r[doc["columns"].index("source")].startswith("https://") for r in doc["rows"])


def test_the_models_latency_meets_the_published_small_messages_and_simple_alone_does_not():
    """8 B to 64 KiB on 8 H100 (NVIDIA's sample output): the model's fastest protocol (LL) within
    35 % of the published time; the Simple protocol alone (56 us of latency) is not."""
    doc = machines.published("h100_8gpu_all_reduce_dgxc")
    small = [r for r in doc["rows"] if r[0] <= 2**16]
    published = sorted(r[1] * 1e-6 for r in small)[len(small) // 2]
    model = machines.ring_all_reduce(machines.H100, 2**10, 8)
    assert abs(model / published - 1) <= 0.35, (model, published)
    simple = machines.ring_all_reduce(machines.H100, 2**10, 8, protocol="Simple")
    assert abs(simple / published - 1) > 0.35
    assert math.isclose(model, machines.ring_all_reduce(machines.H100, 2**10, 8, protocol="LL"))
