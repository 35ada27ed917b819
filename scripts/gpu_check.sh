#!/usr/bin/env bash
# Throughput and MFU of launcher/train/ on one NVIDIA GPU (written for an H200; any CUDA GPU runs it).
#
# Trains gpt_125m and gpt_1b (shapes and batch settings from conf/model/*.yaml) in bf16
# for $STEPS steps (default 50), each without and with torch.compile, through
# `python -m launcher.train` as a world of one, then prints tokens/s and MFU and appends a
# dated table to docs/performance.md. Data: the default byte-level corpus.
# MFU uses the contract's FLOPs/token (6N + 12*L*d*T, N without embeddings),
# which reads ~3 points lower than llm-foundry's convention at 1B (see
# tests/unit/test_train_metrics.py); references: llm-foundry MPT-1B 41.8% on 8xH100.
#
# Each run directory is composed and written by the launcher's own code (compose_runs, then
# write_run_files: config.yaml, plan.json, run.yaml exactly as a launch writes them), so what is
# measured is what a launched run trains.
#
#   scripts/gpu_check.sh                 # all four runs (about 5 minutes on an H200)
#   STEPS=20 MODELS=gpt_125m scripts/gpu_check.sh
#   scripts/gpu_check.sh --quick         # CPU smoke run in seconds: gpt_tiny, fp32, no compile, nothing appended
#   DEVICE=cpu MODELS=gpt_tiny STEPS=12 COMPILE=false APPEND=0 scripts/gpu_check.sh   # the same, spelled out
#
# DEVICE=cpu hides any GPU from the runs, skips nvidia-smi, trains in fp32 and (unless COMPILE says
# otherwise) without torch.compile; its figures are not GPU figures, so APPEND defaults to 0 there.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--quick" ]; then
  DEVICE=cpu MODELS=${MODELS:-gpt_tiny} STEPS=${STEPS:-12} COMPILE=${COMPILE:-false} APPEND=0
  shift
fi
[ $# -eq 0 ] || { echo "usage: [DEVICE=cpu] [MODELS=...] [STEPS=N] [COMPILE='false true'] $0 [--quick]" >&2; exit 2; }
PY=${PYTHON:-.venv/bin/python}
DEVICE=${DEVICE:-cuda}
STEPS=${STEPS:-50}
MODELS=${MODELS:-"gpt_125m gpt_1b"}
WORK=${WORK:-$(mktemp -d)}
if [ "$DEVICE" = cpu ]; then
  PRECISION=fp32 COMPILE=${COMPILE:-false} APPEND=${APPEND:-0}
  export CUDA_VISIBLE_DEVICES=""
  gpu="CPU ($(nproc) cores)"
else
  PRECISION=bf16 COMPILE=${COMPILE:-"false true"} APPEND=${APPEND:-1}
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
fi
LOG_EVERY=$(( STEPS >= 20 ? 10 : (STEPS + 1) / 2 ))

echo "device: $gpu; $PRECISION; runs under $WORK"
rows=()
for model in $MODELS; do
  for compile in $COMPILE; do
    run="$WORK/${model}_compile_${compile}"
    overrides="model=$model gpus=1 cluster=local parallel.precision=$PRECISION parallel.compile=$compile
      train.steps=$STEPS train.log_every=$LOG_EVERY train.eval_every=0 train.checkpoint_every=0
      train.warmup_steps=5 train.keep_checkpoints=1"
    # shellcheck disable=SC2086  # the overrides are words
    "$PY" - "$run" $overrides <<'EOF'
import sys
from pathlib import Path


def make_run_dir(overrides, run_dir):
    """A run directory as a launch writes it; the launcher's two entry points are imported here only,
    so that a move of them touches one line."""
    from launcher.compose.composer import compose_runs
    from launcher.submit.submitter import write_run_files
    (run,) = compose_runs(overrides)
    run_dir.mkdir(parents=True)
    write_run_files(run, run_dir)
    return run


run = make_run_dir(sys.argv[2:], Path(sys.argv[1]))
m, p = run.config.model, run.plan
print(f"composed: {m.name} d_model={m.d_model} n_layers={m.n_layers} n_heads={m.n_heads} seq_len={m.seq_len}; "
      f"global_batch {p.global_batch} = micro_batch {p.micro_batch} x grad_accum {p.grad_accum}; "
      f"precision {run.config.parallel.precision} compile {run.config.parallel.compile}")
EOF
    echo "== $model compile=$compile"
    env -u RANK -u WORLD_SIZE -u SLURM_PROCID "$PY" -m launcher.train "$run" > "$run/stdout.log" 2>&1 \
      || { tail -30 "$run/stdout.log"; exit 1; }
    row=$("$PY" - "$run" "$model" "$compile" <<'EOF'
import json, sys
run, model, compile_ = sys.argv[1:]
final = json.loads(open(f"{run}/metrics.jsonl").read().splitlines()[-1])
mfu = f"{final['mfu']:.1%}" if final.get("mfu") is not None else "n/a"
print(f"| {model} | {compile_} | {final['tokens_per_s_per_gpu']:,.0f} | {mfu} | {final['step_time']:.3f} | "
      f"{final['peak_mem_gb']:.1f} | {final['micro_batch']}x{final['grad_accum']} | {final['loss']:.3f} |")
EOF
)
    echo "$row"
    rows+=("$row")
  done
done

echo "| model | compile | tokens/s/GPU | MFU | s/step | peak GB | micro x accum | final loss |"
printf '%s\n' "${rows[@]}"
if [ "$APPEND" != 1 ]; then
  echo "not appended to docs/performance.md (APPEND=$APPEND)"
  exit 0
fi
[ -f docs/performance.md ] || printf '# Measured performance\n\nAppended by scripts/gpu_check.sh.\n' > docs/performance.md
{
  printf '\n## %s, %s, 1 GPU, %s, %s steps\n\n' "$(date -u +%Y-%m-%d)" "$gpu" "$PRECISION" "$STEPS"
  echo "| model | compile | tokens/s/GPU | MFU | s/step | peak GB | micro x accum | final loss |"
  echo "|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} >> docs/performance.md
echo "appended to docs/performance.md"
