"""The launcher must answer without importing torch (about 4 s on its own), and a task whose Python has none
fails with what to do."""
import os
import subprocess
import sys
from support.helpers import REPO, run_launcher
from support.helpers import events as read_events



def run_python(*args):
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=60, check=True)


def test_launcher_modules_do_not_import_torch():
    run_python(
        "-c",
        "import launcher.cli, launcher.compose.composer, launcher.core.plan, launcher.slurm.batch, launcher.core.config, sys; "
        "assert 'torch' not in sys.modules",
    )


def test_dry_runs_do_not_import_torch():
    for mode in ("json", "true"):
        result = run_launcher(f"dry_run={mode}", flags=("-X", "importtime"), cwd=REPO, check=True)
        imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
        assert "launcher.compose.composer" in imported  # the trace covers the launcher's own imports
        assert not {name for name in imported if name == "torch" or name.startswith("torch.")}


def test_data_and_sample_commands_load_without_their_heavy_dependencies():
    """``data`` and ``sample`` import numpy, tokenizers, pyarrow and torch only when they run, and the
    launch-time data checks none of them: a launch stays as fast as before."""
    run_python(
        "-c",
        "import launcher.commands.data, launcher.commands.sample, launcher.dataset.check, sys; "
        "heavy = {'torch', 'numpy', 'tokenizers', 'pyarrow'} & set(sys.modules); assert not heavy, heavy",
    )


# A Python without torch, as a cluster's environment installed without the [train] extra: importing torch or
# any of its modules fails as it does there (ModuleNotFoundError naming "torch"), whatever this environment has.
WITHOUT_TORCH = """
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            raise ModuleNotFoundError("No module named 'torch'", name="torch")
sys.meta_path.insert(0, NoTorch())
"""


def test_a_task_whose_python_has_no_torch_records_the_cause_in_one_line_and_is_not_retried(tmp_path):
    """The task's ``failed`` event is the cause in the user's words, naming the interpreter and what to do
    (not "ModuleNotFoundError: No module named 'torch'"), and the attempt's judgement gives up on it at once,
    on a later attempt as on the first."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    code = (WITHOUT_TORCH + "from launcher.job.entry import TrainTask, NoTorch\n"
            f"try:\n    TrainTask({str(tmp_path / 'store')!r})({str(run_dir)!r})\n"
            "except NoTorch:\n    print(sys.executable)\n")
    env = {**os.environ, "SLURM_PROCID": "1", "SLURMD_NODENAME": "node7", "SLURM_JOB_ID": "42"}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                            env=env)
    assert result.returncode == 0 and result.stdout.strip() == sys.executable, result.stderr
    (event,) = read_events(run_dir)
    assert {k: event[k] for k in ("event", "rank", "node", "short")} == {"event": "failed", "rank": 1,
                                                                          "node": "node7", "short": "no torch"}
    assert event["error"] == (f"the tasks' Python {sys.executable} has no torch: install 'slurm-gpt-launcher[train]' "
                              "there (cluster.python, or cluster.container.python in a container)")

    from launcher.core.events import decode
    from launcher.job.attempts import attribute
    from launcher.job.policy import decide

    cause = attribute([decode(event)], [], [])
    assert cause.text == f"rank 1 on node7: {event['error']}" and cause.short == "no torch"
    earlier = [decode({"event": "attempt", "attempt": 1}), decode({"event": "attempt_ended", "outcome": "COMPLETED"})]
    for events, progressed in (([], False), (earlier, True)):
        decision = decide(events, cause, max_retries=3, progressed=progressed)
        assert not decision.retry
        assert decision.reason == "the tasks' Python has no torch: the same on every node and every try, not retried"

