#!/bin/bash
# One torchrun agent per node, as the SLURM scripts beside this file start it (srun, one task per
# node); every agent meets the others at the c10d rendezvous and starts NPROC_PER_NODE ranks.
#   cluster/torchrun.sh -m helpers.bench -b 1K -e 1G      (or: notebooks/nd3d.py --dp 2 --tp 2 --pp 2)
# Set by SLURM (or by hand, e.g. two agents on one machine as tests/test_cluster.py does):
#   NNODES (default SLURM_NNODES), NPROC_PER_NODE (default: the node's GPUs, else 1),
#   RDZV_ENDPOINT host:port of the first node, RDZV_ID a job-unique id (default SLURM_JOB_ID).
# PYTHON: the course's environment (default .venv/bin/python, from the repository root).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
NNODES=${NNODES:-${SLURM_NNODES:?set NNODES (or run under SLURM)}}
RDZV_ENDPOINT=${RDZV_ENDPOINT:?set RDZV_ENDPOINT=host:port of the first node}
RDZV_ID=${RDZV_ID:-${SLURM_JOB_ID:?set RDZV_ID (any id shared by the agents of one job)}}
if [ -z "${NPROC_PER_NODE:-}" ]; then
    NPROC_PER_NODE=$("$PYTHON" -c "import torch; print(max(1, torch.cuda.device_count()))")
fi
exec "$PYTHON" -m torch.distributed.run --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" \
    --rdzv-backend c10d --rdzv-endpoint "$RDZV_ENDPOINT" --rdzv-id "$RDZV_ID" \
    --max-restarts 0 "$@"
