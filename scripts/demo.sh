#!/usr/bin/env bash
# The main job: set up (idempotent), bring the local multi-node Slurm cluster up and show it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
bash scripts/setup.sh
bash slurm/up.sh
source slurm/env.sh
sinfo -N -o '%N %P %T %G %c'
