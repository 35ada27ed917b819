"""The launcher must answer without importing torch (about 4 s on its own)."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_python(*args):
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=60, check=True)


def test_launcher_modules_do_not_import_torch():
    run_python(
        "-c",
        "import launcher.cli, launcher.compose.runs, launcher.core.plan, launcher.slurm.batch, launcher.core.config, sys; "
        "assert 'torch' not in sys.modules",
    )


def test_dry_runs_do_not_import_torch():
    for mode in ("json", "true"):
        result = run_python("-X", "importtime", "-m", "launcher", f"dry_run={mode}")
        imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
        assert "launcher.compose.runs" in imported  # the trace covers the launcher's own imports
        assert not {name for name in imported if name == "torch" or name.startswith("torch.")}


def test_data_and_sample_commands_load_without_their_heavy_dependencies():
    """``data`` and ``sample`` import numpy, tokenizers, pyarrow and torch only when they run, and the
    launch-time data checks none of them: a launch stays as fast as before."""
    run_python(
        "-c",
        "import launcher.commands.data, launcher.commands.sample, launcher.dataset.check, sys; "
        "heavy = {'torch', 'numpy', 'tokenizers', 'pyarrow'} & set(sys.modules); assert not heavy, heavy",
    )
