"""The machines the series speaks of: one definition, every figure with its source ("the H100 model").

    from helpers import machines
    h100 = machines.H100                 # a DGX H100 node: 8 H100 SXM, NVSwitch, a 400 Gb/s NIC per GPU
    h100.gemm_flops, h100.nvlink_bw      # 794.5e12 FLOP/s achieved (measured), 450e9 B/s per direction
    machines.ring_all_reduce(h100, 2**30, k=8)          # s: NCCL's model of a ring all-reduce
    machines.source(h100, "nvlink_bw")   # where a figure comes from

A figure is a datasheet's (a peak, named as such), a published measurement (achieved), or NCCL's own
tuning model (its latencies: what NCCL assumes when it picks an algorithm and a protocol); never one
of this series' runs. Published curves measured on these machines are kept in data/published/
(`machines.published`), each with its citation, to set beside the model: never the data a model
was fitted to. A timed lesson runs on a machine's model at a stated time scale (helpers.standins'
Scaled): its times are the model's, never called measurements.

Units: bytes, seconds, FLOP/s, bytes/s (one direction of a link unless the name says otherwise).
"""
import json
from dataclasses import dataclass, field
from pathlib import Path

PUBLISHED = Path(__file__).resolve().parents[1] / "data" / "published"

SOURCES = {
    "H100": "NVIDIA, H100 Tensor Core GPU, https://www.nvidia.com/en-us/data-center/h100/ : H100 SXM, "
            "80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s and PCIe Gen5 128 GB/s (both directions), 989 "
            "dense BF16 TFLOP/s (the datasheet's 1,979 is with sparsity)",
    "A100": "NVIDIA, A100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/a100/ : "
            "A100 SXM 80GB, HBM2e 2,039 GB/s, 312 dense BF16 TFLOP/s, NVLink 600 GB/s and PCIe Gen4 "
            "64 GB/s (both directions)",
    "NVLink": "NVIDIA, NVLink and NVSwitch, https://www.nvidia.com/en-us/data-center/nvlink/ : 900 GB/s "
              "per GPU (4th generation, H100), 600 GB/s (3rd, A100), both directions",
    "DGX H100": "NVIDIA DGX BasePOD reference architecture, core components, https://docs.nvidia.com/"
                "dgx-basepod/reference-architecture-infrastructure-foundation-enterprise-ai/latest/"
                "core-components.html : eight H100 GPUs, four NVSwitch chips, eight single-port "
                "ConnectX-7 (400 Gb/s InfiniBand) for the compute fabric, one per GPU",
    "DGX A100": "Narayanan et al. 2021 (SC21), section 5: DGX A100 nodes, 8 A100 80GB, NVSwitch, eight "
                "200 Gb/s HDR InfiniBand HCAs per node (one per GPU)",
    "IBTA": "InfiniBand Trade Association roadmap, https://www.infinibandta.org/infiniband-roadmap/ : "
            "HDR 200 Gb/s, NDR 400 Gb/s per 4x port",
    "gemm": "S. Bekman, Machine Learning Engineering, compute/accelerator/README.md (stas00/ml-engineering "
            "@744d01e, lines 342-361), achieved BF16 matmul TFLOP/s, mean of 100 iterations after 50 "
            "warm-up, best shape: H100 SXM 794.5 of 989 (2048x2048x13312, torch 2.7.0+cu126); A100 SXM "
            "271.2 of 312 (1024x10240x5120, torch 2.6.0+cu126)",
    "nccl-tuning": "NCCL 2.30.7, src/graph/tuning.cc (github.com/NVIDIA/nccl, tag v2.30.7-1): baseLatencies (lines "
                   "149-155) and hwLatencies (156-176) in us, per algorithm and protocol (LL, LL128, "
                   "Simple); a ring's latency = base + nsteps x the link's latency, nsteps = 2(K-1) for "
                   "an all-reduce (line 289, 401-412); ring LL bandwidth = min(llMaxBw, 0.5 B) (line "
                   "327; llMaxBw 87.7 GB/s Ampere, 141 Hopper, lines 180-181), LL128 0.92 B (line 329)",
    "nccl-topo": "NCCL 2.30.7, src/graph/topo.h (tag v2.30.7-1): SM80_NVLINK_BW 20.0 and SM90_NVLINK_BW 20.6 "
                 "(lines 21-22), GB/s per NVLink, used as count x that figure per GPU pair "
                 "(src/graph/topo.cc:830-857); a link's line rate is 25 GB/s each way (nccl-tests/issues/149)",
    "nccl-net": "NCCL's maintainers on a ring across nodes: it spreads its channels over the node's NICs, so "
                "the node's NICs together bound its busbw: \"On an Nvidia DGX-A100 system we have 8x200Gbit/s "
                "IB cards and we measure 192GB/s AllReduce BusBW\" (github.com/NVIDIA/nccl/issues/812, "
                "NVIDIA, 2023-03-31); \"you can add more NICs and you should get more bandwidth, up to "
                "160GB/s which is the NVLink intra-node bandwidth\" (nccl/issues/412, NVIDIA, 2023-04-24)",
    "contention": "Lee et al. 2025, Characterizing Compute-Communication Overlap in GPU-Accelerated "
                  "Distributed Deep Learning, arXiv:2507.03114: on A100, H100, MI250 and MI210, "
                  "compute overlapped with communication slowed by 18.9 % on average, 40.0 % at most, "
                  "against the same compute with no communication",
}


@dataclass(frozen=True)
class Machine:
    """A node of GPUs as the series models it. Every figure names its source in `sources`."""
    name: str
    arch: str                  # "Hopper", "Ampere": the row of NCCL's per-architecture constants
    gpus_per_node: int
    peak_flops: float          # dense BF16 tensor-core peak (datasheet), FLOP/s
    gemm_flops: float          # achieved by a large BF16 matmul (published measurement), FLOP/s
    memory: float              # bytes of HBM per GPU
    hbm_bw: float              # HBM bandwidth (datasheet), bytes/s
    nvlink_bw: float           # NVLink per GPU per direction (datasheet's both-ways figure / 2)
    nic_bw: float              # the GPU's own NIC per direction
    pcie_bw: float             # PCIe x16 per direction
    contention: tuple          # (average, most): compute beside a collective is slowed by this share
    sources: dict = field(default_factory=dict)


H100 = Machine(
    name="DGX H100", arch="Hopper", gpus_per_node=8, peak_flops=989e12, gemm_flops=794.5e12,
    memory=80e9, hbm_bw=3.35e12, nvlink_bw=450e9, nic_bw=400e9 / 8, pcie_bw=64e9,
    contention=(0.189, 0.40),
    sources={"gpus_per_node": "DGX H100", "peak_flops": "H100", "gemm_flops": "gemm", "memory": "H100",
             "hbm_bw": "H100", "nvlink_bw": "NVLink", "nic_bw": "DGX H100", "pcie_bw": "H100",
             "contention": "contention"})

A100 = Machine(
    name="DGX A100", arch="Ampere", gpus_per_node=8, peak_flops=312e12, gemm_flops=271.2e12,
    memory=80e9, hbm_bw=2.039e12, nvlink_bw=300e9, nic_bw=200e9 / 8, pcie_bw=32e9,
    contention=(0.189, 0.40),
    sources={"gpus_per_node": "DGX A100", "peak_flops": "A100", "gemm_flops": "gemm", "memory": "A100",
             "hbm_bw": "A100", "nvlink_bw": "NVLink", "nic_bw": "DGX A100", "pcie_bw": "A100",
             "contention": "contention"})

# NCCL's tuning model (SOURCES["nccl-tuning"]), ring algorithm, per protocol: the collective's base
# latency, one step's latency on NVLink and across the network (s), and the share of the link's
# bandwidth the protocol moves (LL: half, and at most LL_MAX_BW; LL128: 0.92).
PROTOCOLS = ("LL", "LL128", "Simple")
RING_BASE = {"LL": 6.6e-6, "LL128": 14.0e-6, "Simple": 8.4e-6}
RING_STEP = {"nvlink": {"LL": 0.6e-6, "LL128": 1.9e-6, "Simple": 3.4e-6},
             "net": {"LL": 2.7e-6, "LL128": 4.0e-6, "Simple": 14.0e-6}}
SHARE = {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}
LL_MAX_BW = {"Ampere": 87.7e9, "Hopper": 141.0e9}


def source(machine, figure):
    """The citation of one of a machine's figures."""
    return SOURCES[machine.sources[figure]]


# NCCL's bandwidth of one NVLink, per direction, as its topology search and tuning model use it
# (SOURCES["nccl-topo"]): about 82 % of a link's 25 GB/s line rate (protocol overhead, gpu_facts item 4).
NCCL_NVLINK_BW = {"Ampere": 20.0e9, "Hopper": 20.6e9}
NVLINK_LINE_RATE = 25e9          # one NVLink (3rd and 4th generation), per direction


def ring_bw(machine, nodes=1):
    """B of a ring, per GPU and direction, as NCCL models it: inside a node the GPU's NVLinks
    (datasheet bandwidth / 25 GB/s a link: 18 on H100, 12 on A100) times NCCL's figure per link;
    across nodes NCCL's channels leave the node through all its NICs, so the node's NICs together
    bound it too (SOURCES["nccl-net"]): min(NVLink's, GPUs per node x one NIC)."""
    nvlink = machine.nvlink_bw / NVLINK_LINE_RATE * NCCL_NVLINK_BW[machine.arch]
    return nvlink if nodes == 1 else min(nvlink, machine.gpus_per_node * machine.nic_bw)


def link(machine, nodes=1):
    """(alpha, B) of one ring step in NCCL's bandwidth protocol (Simple): NVLink's step latency
    inside a node, the network's across nodes (an upper bound there: only 2(nodes-1) of a ring's
    steps leave a node, ring_all_reduce), and the ring's B (ring_bw)."""
    where = "nvlink" if nodes == 1 else "net"
    return RING_STEP[where]["Simple"], ring_bw(machine, nodes)


def ring_all_reduce(machine, n, k, nodes=1, protocol=None):
    """Seconds of a ring all-reduce of n bytes on k GPUs over `nodes` nodes, as NCCL's tuning model
    prices it: base + (2(K-1) - inter) intra-node steps + inter steps across nodes (2(nodes-1)) of
    latency, plus 2(K-1)/K n over the protocol's share of the ring's B; the fastest protocol unless
    one is named. No NVLS, tree or CollNet: the ring only."""
    steps, inter = 2 * (k - 1), 2 * (nodes - 1)
    bw = ring_bw(machine, nodes)
    times = {}
    for p in ([protocol] if protocol else PROTOCOLS):
        share = min(LL_MAX_BW[machine.arch], SHARE[p] * bw) if p == "LL" else SHARE[p] * bw
        latency = RING_BASE[p] + (steps - inter) * RING_STEP["nvlink"][p] + inter * RING_STEP["net"][p]
        times[p] = latency + 2 * (k - 1) / k * n / share
    return min(times.values())


def published(name):
    """A published measurement kept in data/published/NAME.json: its citation, what it measured and
    its rows, as transcribed (never fitted to, never one of this series' runs)."""
    return json.loads((PUBLISHED / f"{name}.json").read_text())


@dataclass(frozen=True)
class Scaled:
    """A machine's model run on this machine's stand-ins at a time scale: every second of the model
    takes `time` seconds here, and every byte moved here stands for `bytes` bytes of the model (the
    real tensors stay small, so that their own transfer and arithmetic stay far below the model's
    times). The times a lesson prints from it are the model's, never measurements of the machine.

        h100 = machines.Scaled(machines.H100, time=1000, bytes=64)   # 1 us of the model: 1 ms here
        with standins.paced_link(*h100.link()): ...                  # NVLink's ring step, scaled
        standins.device_compute(h100.compute(flops))                  # a GEMM's time, scaled
    """
    machine: Machine
    time: float
    bytes: int = 1
    nodes: int = 1

    def link(self):
        """(gbps, alpha_s) for helpers.standins.paced_link: one ring step of the model's link
        (machines.link), both terms scaled, the bytes as the bytes here."""
        alpha, bw = link(self.machine, self.nodes)
        return self.paced(bw, alpha)

    def paced(self, bw, alpha):
        """(gbps, alpha_s) for helpers.standins.paced_link of a link of the model moving bw
        bytes/s after alpha seconds (e.g. a GPU's own NIC), scaled, the bytes as the bytes here."""
        return bw / (self.bytes * self.time) / 1e9, alpha * self.time

    def compute(self, flops):
        """Seconds here of `flops` of the model's achieved GEMM rate."""
        return flops / self.machine.gemm_flops * self.time

    def wall(self, model_s):
        """Seconds here of `model_s` seconds of the model."""
        return model_s * self.time

    def model(self, wall_s):
        """Seconds of the model that `wall_s` seconds here stand for."""
        return wall_s / self.time

    def rows(self, rows):
        """helpers.bench rows of a run on this scaled model, in the model's units: sizes times
        `bytes`, times over `time`, algbw and busbw times both."""
        us = ("time_us", "p10_us", "p90_us")
        gb = self.bytes * self.time
        return [{**r, "size": r["size"] * self.bytes, **{k: r[k] / self.time for k in us},
                 "times_us": [t / self.time for t in r.get("times_us", [])],
                 "algbw": r["algbw"] * gb, "busbw": r["busbw"] * gb} for r in rows]
