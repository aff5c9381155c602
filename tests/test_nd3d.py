"""notebooks/nd3d.py, lecture 13's 3D-parallel program: equal to the single process on a few meshes,
its communication counted as the formulas say, and the torchrun program run on 8 CPU ranks.

ND3D_PATH points at another copy of nd3d.py (default: <repo>/notebooks/nd3d.py)."""
import os
import subprocess
import sys
import time

import pytest

import helpers
from helpers.spawn import spawn

REPO = os.path.dirname(os.path.dirname(os.path.abspath(helpers.__file__)))
ND3D = os.environ.get("ND3D_PATH", os.path.join(REPO, "notebooks", "nd3d.py"))
sys.path.insert(0, os.path.dirname(os.path.abspath(ND3D)))  # here and in the spawned ranks
import nd3d  # noqa: E402

STEPS, MICRO = 2, 2


def expected_bytes(cfg, dp, tp, pp, stage, params):
    """Bytes a rank sends per step: ring all-reduces 2(n-1)/n of the tensor, a send the tensor."""
    b, s, h, w = cfg["batch"] // (dp * MICRO), cfg["seq"], cfg["dim"], 8   # a micro-batch, float64
    act = b * s * h * w
    ends = (stage > 0) + (stage < pp - 1)                                   # backward and forward sends
    return {"tp": 4 * (cfg["depth"] // pp) * MICRO * 2 * (tp - 1) / tp * act,  # 2 g fwd + 2 f bwd per layer
            "pp": MICRO * ends * act,
            "dp": 2 * (dp - 1) / dp * params * w}


@pytest.mark.parametrize("dp, tp, pp", [(2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1), (1, 2, 2), (2, 1, 2)])
def test_train_equals_the_single_process_and_counts_its_bytes(dp, tp, pp):
    cfg = dict(nd3d.CFG, depth=2)
    res = spawn(nd3d.train, dp * tp * pp, args=(dp, tp, pp, cfg, STEPS, MICRO), backend="gloo", timeout=60)
    assert nd3d.check(res, cfg, STEPS) <= 1e-12
    for r in res:
        params = sum(p.numel() for p in r["params"].values())
        want = expected_bytes(cfg, dp, tp, pp, r["coord"]["pp"], params)
        assert r["bytes"] == pytest.approx(want, rel=0, abs=1e-9), r["coord"]
        assert r["calls"]["tp"].get("all_reduce", 0) == (4 * cfg["depth"] // pp * MICRO if tp > 1 else 0)
        assert r["calls"]["dp"].get("all_reduce", 0) == (dp > 1)
        assert megatron_groups(r["groups"], dp, tp, pp), r["groups"]


def megatron_groups(groups, dp, tp, pp):
    """Megatron's layout (lecture 13): a tp group is tp consecutive ranks (one node's GPUs on
    NVLink), a dp group steps by tp, a pp group by dp*tp (pipeline neighbours across nodes)."""
    steps = {"tp": 1, "dp": tp, "pp": dp * tp}
    return all(len(groups[d]) == n and all(b - a == steps[d] for a, b in zip(groups[d], groups[d][1:]))
               for d, n in (("tp", tp), ("dp", dp), ("pp", pp)))


def test_a_mesh_with_tp_outside_is_not_megatrons_layout():
    """The layout check can fail: on (pp, tp, dp) = (1, 2, 2), rank 0's tp group is [0, 2]."""
    assert megatron_groups({"tp": [0, 1], "dp": [0, 2], "pp": [0]}, 2, 2, 1)
    assert not megatron_groups({"tp": [0, 2], "dp": [0, 1], "pp": [0]}, 2, 2, 1)


def test_a_wrong_split_is_caught_by_the_check():
    """The check can fail: a parameter changed on one rank breaks it."""
    res = spawn(nd3d.train, 2, args=(1, 2, 1, nd3d.CFG, 1, 1), backend="gloo", timeout=60)
    name = "blocks.0.attn.qkv.weight"
    res[1]["params"][name] = res[1]["params"][name] + 1e-9
    with pytest.raises(AssertionError):
        nd3d.check(res, nd3d.CFG, 1)


def test_torchrun_runs_the_program_on_8_cpu_ranks():
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # the CPU (gloo) path, as CI runs it
    start = time.monotonic()
    # --standalone: a free port of its own, so two runs at once do not collide on 29500
    done = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "8", ND3D], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=150)
    took = time.monotonic() - start
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "nd3d OK: dp=2 tp=2 pp=2 on 8 ranks (gloo)" in done.stdout, done.stdout[-2000:]
    print(f"torchrun --nproc-per-node 8: {took:.1f} s")
