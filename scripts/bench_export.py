"""How much memory ``launcher export`` takes: peak resident memory of the export against the largest shard it
writes (launcher/train/hf_export.py reads one tensor at a time and holds one shard), for gpt_350m.

A checkpoint of the model, freshly initialised, is saved with DCP in a child process (as training saves it, one
rank); each export then runs in a fresh child, which reports its peak resident set (``ru_maxrss``) after it and,
as the baseline, after importing torch and the exporter. The ratio (peak - baseline) / shard is what the memory
of an export costs per byte of its largest file: about 1-2 (the shard, plus the tensor being converted), whatever
the model's size. ``--quick``: gpt_small, for the suite (tests/cluster/test_bench_quick.py).

    python scripts/bench_export.py [--model gpt_350m] [--quick]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SAVE = """
import sys, torch, torch.distributed.checkpoint as dcp
from omegaconf import OmegaConf
from launcher.core.config import ModelConfig
from launcher.train.model import GPT
cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.create(sys.argv[1])))
dcp.save({"model": GPT(cfg).state_dict()}, checkpoint_id=sys.argv[2])
"""
EXPORT = """
import json, resource, sys
from omegaconf import OmegaConf
from launcher.core.config import ModelConfig
from launcher.train.hf_export import write_model
cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.create(sys.argv[1])))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
written = write_model(cfg, sys.argv[2], __import__("pathlib").Path(sys.argv[3]), "fp32", int(sys.argv[4]), None)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"base": base, "peak": peak, "total": written.total_bytes, "files": len(written.files) - 2}))
"""


def child(code: str, *args: str) -> str:
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "2"})
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return out.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt_350m")
    parser.add_argument("--quick", action="store_true", help="gpt_small")
    args = parser.parse_args()
    model = "gpt_small" if args.quick else args.model
    from omegaconf import OmegaConf

    from launcher.compose.composer import compose_runs

    cfg = compose_runs([f"model={model}", "gpus=1", "dry_run=true"])[0].config.model
    spec = json.dumps(OmegaConf.to_container(OmegaConf.structured(cfg)))
    with tempfile.TemporaryDirectory(prefix="bench-export-") as work:
        checkpoint = Path(work) / "step_00000000"
        child(SAVE, spec, str(checkpoint))
        for shard in (2_000_000_000, 500_000_000):
            out = Path(work) / f"out-{shard}"
            out.mkdir()
            found = json.loads(child(EXPORT, spec, str(checkpoint), str(out), str(shard)))
            largest = max(p.stat().st_size for p in out.glob("*.safetensors"))
            used = found["peak"] - found["base"]
            print(f"export {model} ({found['total'] / 1e6:,.1f} MB fp32, {found['files']} file(s), largest "
                  f"{largest / 1e6:,.1f} MB; --max-shard-size {shard / 1e6:g}MB): peak {found['peak'] / 1e6:,.0f} MB, "
                  f"{used / 1e6:,.0f} MB over the imports: (peak - imports) / largest shard = {used / largest:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
