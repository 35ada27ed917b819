#!/usr/bin/env bash
# Throughput and MFU of train/ on one NVIDIA GPU (written for an H200; any CUDA GPU runs it).
#
# Trains gpt_125m and gpt_1b (shapes and batch settings from conf/model/*.yaml) in bf16
# for $STEPS steps (default 50), each without and with torch.compile, through
# `python -m train` as a world of one, then prints tokens/s and MFU and appends a
# dated table to docs/performance.md. Data: the default byte-level corpus.
# MFU uses the contract's FLOPs/token (6N + 12*L*d*T, N without embeddings),
# which reads ~3 points lower than llm-foundry's convention at 1B (see
# tests/test_train_metrics.py); references: llm-foundry MPT-1B 41.8% on 8xH100.
#
#   scripts/gpu_check.sh                 # all four runs (about 5 minutes on an H200)
#   STEPS=20 MODELS=gpt_125m scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
STEPS=${STEPS:-50}
MODELS=${MODELS:-"gpt_125m gpt_1b"}
WORK=${WORK:-$(mktemp -d)}

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $gpu; runs under $WORK"
rows=()
for model in $MODELS; do
  for compile in false true; do
    run="$WORK/${model}_compile_${compile}"
    # A run directory as the launcher writes it: config.yaml (the model's size file plus
    # overrides) and its plan.json.
    "$PY" - "$run" "$model" "$compile" "$STEPS" <<'EOF'
import json, sys
from pathlib import Path
from omegaconf import OmegaConf
from launcher.core.config import load_run_config
from launcher.core.plan import PLAN, single_node_plan
run, model, compile_, steps = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "true", int(sys.argv[4])
size = OmegaConf.load(f"conf/model/{model}.yaml")
cfg = OmegaConf.merge(size, {"parallel": {"precision": "bf16", "compile": compile_},
                             "train": {"steps": steps, "log_every": 10, "eval_every": 0, "checkpoint_every": 0,
                                       "warmup_steps": 5, "keep_checkpoints": 1}})
run.mkdir(parents=True)
OmegaConf.save(cfg, run / "config.yaml")
(run / PLAN).write_text(json.dumps(single_node_plan(load_run_config(run / "config.yaml"), 1).to_dict()))
EOF
    echo "== $model compile=$compile"
    env -u RANK -u WORLD_SIZE -u SLURM_PROCID "$PY" -m train "$run" > "$run/stdout.log" 2>&1 \
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

[ -f docs/performance.md ] || printf '# Measured performance\n\nAppended by scripts/gpu_check.sh.\n' > docs/performance.md
{
  printf '\n## %s, %s, 1 GPU, bf16, %s steps\n\n' "$(date -u +%Y-%m-%d)" "$gpu" "$STEPS"
  echo "| model | compile | tokens/s/GPU | MFU | s/step | peak GB | micro x accum | final loss |"
  echo "|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} >> docs/performance.md
echo "appended to docs/performance.md"
