#!/usr/bin/env bash
# The main job: set up (idempotent), bring the local multi-node Slurm cluster up, train gpt_small with
# FSDP across 2 nodes x 2 GPUs (tasks), follow its progress, and show its status and final loss.
# Extra arguments are passed to the launcher as overrides, e.g. `scripts/demo.sh train.steps=200`.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
bash scripts/setup.sh
bash slurm/up.sh
source slurm/env.sh
L=(.venv/bin/python -m launcher)

echo "== the local cluster"
"${L[@]}" clusters
echo "== launching"
out=$("${L[@]}" gpus=4 model=gpt_small train.steps=60 train.log_every=10 train.eval_every=20 "$@")
echo "$out"
name=$(sed -n 's/^Submitted \([^ ]*\) as Slurm job.*/\1/p' <<<"$out")
echo "== following rank 0 until the job ends (squeue shows the same progress in its comment)"
"${L[@]}" logs "$name" --follow
echo "== status"
"${L[@]}" runs --limit 5
"${L[@]}" describe "$name" | sed -n '1,2p;/^Final metrics/,/^$/p'
