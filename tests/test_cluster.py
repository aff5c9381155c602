"""The SLURM scripts of cluster/, run as far as a laptop can: `srun` and `scontrol` are stand-ins
that start one torchrun agent per "node" on this machine (SLURM_NNODES of them, each its own
process), so the batch file, cluster/torchrun.sh and torchrun's c10d rendezvous on the loopback run
for real, two agents as two nodes, one rank each (gloo). The stand-in nodes see no GPU: under
torchrun 'auto' picks NCCL when a node has a GPU per local rank (right on real nodes), and on a
one-GPU machine both stand-ins would take cuda:0, which NCCL refuses."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.beside  # times nothing: `make test` runs these beside the rest (Makefile)

ROOT = Path(__file__).resolve().parent.parent
SRUN = """#!/bin/bash
# srun's stand-in: run the command once per node (SLURM_NNODES), each with its SLURM_NODEID
while [[ "$1" == --* ]]; do shift; done
pids=()
for ((i = 0; i < SLURM_NNODES; i++)); do SLURM_NODEID=$i SLURM_PROCID=$i "$@" & pids+=($!); done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done; exit $rc
"""
SCONTROL = '#!/bin/bash\n[ "$1 $2" = "show hostnames" ] && echo 127.0.0.1\n'


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sbatch(script, tmp_path, **env):
    """Run cluster/<script> as sbatch would on two nodes; (exit status, output)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_NNODES": "2",
           "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_ID": f"t{os.getpid()}",
           "SLURM_SUBMIT_DIR": str(ROOT), "NPROC_PER_NODE": "1", "PYTHON": sys.executable,
           "RDZV_ENDPOINT": f"127.0.0.1:{free_port()}", "CUDA_VISIBLE_DEVICES": "", **env}
    env.pop("HELPERS_SPAWN_RANK", None)
    out = subprocess.run(["bash", str(ROOT / "cluster" / script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=240)
    return out.returncode, out.stdout + out.stderr


def test_the_benchmark_runs_on_two_agents_as_two_nodes(tmp_path):
    results = tmp_path / "results.json"
    rc, out = sbatch("bench.sbatch", tmp_path, BENCH="-b 1K -e 4K -f 4 -n 2 -w 1 -c 1 --no-progress "
                     "--collectives all_reduce", RESULTS=str(results))
    assert rc == 0, out[-3000:]
    run = json.loads(results.read_text())
    assert run["world_size"] == 2 and "torchrun" in run["launcher"], {k: run[k] for k in list(run)[:8]}
    rows = run["rows"]
    assert {r["size"] for r in rows} == {1024, 4096} and all(r["wrong"] == 0 for r in rows), rows


def test_the_3d_program_runs_its_pipeline_across_the_two_nodes(tmp_path):
    rc, out = sbatch("nd3d.sbatch", tmp_path, DP="1", TP="1", PP="2")
    assert rc == 0, out[-3000:]
    assert "nd3d OK: dp=1 tp=1 pp=2 on 2 ranks" in out, out[-3000:]


def test_a_missing_rendezvous_is_one_sentence_before_anything_starts(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RDZV_", "NNODES"))}
    out = subprocess.run(["bash", str(ROOT / "cluster" / "torchrun.sh"), "notebooks/nd3d.py"],
                         env={**env, "NNODES": "2"}, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "set RDZV_ENDPOINT" in out.stderr, out.stderr
