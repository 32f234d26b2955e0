#!/bin/bash
# gpu-rank.sh COMMAND [ARG…]: runs COMMAND (one MPI rank) with its own GPU as the only one it
# sees, so that `--device cuda` (= cuda:0, docs/GPU.md) is a different GPU for every rank of
# a node. pipelines/slurm/gpu.sbatch starts each rank through it (docs/SLURM.md, "GPU nodes").
#
# The local rank is the first of OMPI_COMM_WORLD_LOCAL_RANK (mpirun), MPI_LOCALRANKID (MPICH)
# and SLURM_LOCALID (srun) that is set, else 0: the order gradkit's NCCL backend reads them
# in (lib/cuda/src/nccl.rs). CUDA_VISIBLE_DEVICES, as SLURM leaves it for the task:
#   one GPU (srun --gpus-per-task=1 with SLURM's per-task binding): kept, it is cuda:0;
#   several (--gres=gpu:N, or mpirun inside the allocation): the local rank-th of them;
#   unset (no SLURM GPU binding at all): the GPU numbered by the local rank.
set -euo pipefail
if [ $# -eq 0 ]; then
  echo "usage: gpu-rank.sh COMMAND [ARG…]" >&2
  exit 2
fi
local_rank=${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-${SLURM_LOCALID:-0}}}
if ! [[ $local_rank =~ ^[0-9]+$ ]]; then
  echo "error: gpu-rank.sh: the local rank '$local_rank' is not a number" >&2
  exit 1
fi
if [ -z "${CUDA_VISIBLE_DEVICES+set}" ]; then
  export CUDA_VISIBLE_DEVICES=$local_rank
elif [ -n "$CUDA_VISIBLE_DEVICES" ]; then
  IFS=, read -r -a gpus <<< "$CUDA_VISIBLE_DEVICES"
  if [ "${#gpus[@]}" -gt 1 ]; then
    if [ "$local_rank" -ge "${#gpus[@]}" ]; then
      echo "error: gpu-rank.sh: local rank $local_rank on $(hostname) but" \
        "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES lists ${#gpus[@]} GPUs:" \
        "--ntasks-per-node must not exceed the GPUs per node" >&2
      exit 1
    fi
    export CUDA_VISIBLE_DEVICES=${gpus[$local_rank]}
  fi
fi
# (An empty CUDA_VISIBLE_DEVICES hides every GPU: kept, and `--device cuda` says so.)
exec "$@"
