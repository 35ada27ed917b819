"""Every user mistake is one line on stderr, ``error: ...``, and exit status 2."""
import json
import os
import subprocess
import sys
import types

import pytest

from launcher import cli
from launcher.views import lookup as common
from launcher.submit.submitter import Launched
from support.helpers import REPO, run_launcher


BAD_INPUTS = [
    (["model=gpt_2b"], "unknown model 'gpt_2b' (did you mean 'gpt_7b'?); valid: gpt_1b, gpt_3b"),
    (["cluster=nope"], "unknown cluster 'nope'; valid: local, slurm"),
    (["gpus=abc"], "gpus must be a GPU count (presets: 1, 2, 4, 8, 16, 128;"),
    (["gpus=2.5"], "gpus must be a GPU count"),
    (["gpus=0"], "gpus must be a positive number of GPUs, got 0"),
    (["gpus=-8"], "gpus must be a positive number of GPUs, got -8"),
    (["gpus=custom"], "gpus=custom needs layout.gpus=N"),
    (["gpus=12"], "gpus=12 cannot be laid out on cluster local (8 GPUs per node); use at most 8 or a multiple of 8"),
    (["gpus=16", "layout.nodes=1"], "needs 16 GPUs per node; cluster local has 8"),
    (["train.global_batch=20"], "global batch 20 is not divisible by world_size x micro_batch = 8 x 2"),
    (["modle=gpt_1b"], "unknown key 'modle' (did you mean 'model'?)"),
    (["gpu=8"], "unknown key 'gpu' (did you mean 'gpus'?)"),
    (["train.lrr=1e-3"], "unknown key 'train.lrr' (did you mean 'train.lr'?)"),
    (["train.lr.x=1"], "unknown key 'train.lr.x': 'train.lr' is a value, not a section"),
    (["parallel.sharding=fulll"], "parallel.sharding must be one of full, hybrid, grad_op; got 'fulll' (did you mean 'full'?)"),
    (["parallel.activation_checkpointing=some"], "parallel.activation_checkpointing must be one of none, selective, full"),
    (["parallel.precision=fp16"], "parallel.precision must be one of auto, bf16, fp32; got 'fp16'"),
    (["dry_run=yes"], "dry_run must be false, true or json; got 'yes'"),
    (["train.micro_batch=0"], "train.micro_batch must be a positive integer or auto, got '0'"),
    (["train.steps=0"], "train.steps must be in [1, 10,000,000], got 0"),
    (["train.lr=abc"], "Value 'abc' of type 'str' could not be converted to Float"),
    (["name=-bad"], "invalid run name '-bad'"),
    (["name='$(touch /tmp/launcher-test)'"], "invalid run name '$(touch /tmp/launcher-test)'"),
    (["name='a;b'"], "invalid run name 'a;b'"),
    (["name='ok\n'"], "invalid run name 'ok\\n'"),
    (["name=" + "x" * 65], "invalid run name"),
    (["cluster.partition='$(touch /tmp/launcher-test)'"], "cluster.partition='$(touch /tmp/launcher-test)' is not allowed"),
    (["cluster.account='`id`'"], "cluster.account='`id`' is not allowed"),
    (["+cluster.sbatch_flags.nodes=1"], "cluster.sbatch_flags.nodes is set by the launcher"),
    (["name=$(touch /tmp/launcher-test)"], "cannot parse override 'name=$(touch /tmp/launcher-test)'"),
    (["gpus=8,16"], "'gpus=8,16' is a sweep; add -m (--multirun)"),
    (["-m", "gpus=8,12"], "error: [gpus=12 dry_run=json] gpus=12 cannot be laid out"),
    (["-m", "train.lr=interval(0,1)"], "cannot be enumerated"),
    (["statuss"], "unknown command 'statuss'"),
    (["--bogus"], "launcher: unrecognized arguments: --bogus"),
    (["-m", "gpus=8,16", "dry_run=true,json"], "dry_run must be the same for every run of a sweep"),
]  # fmt: skip


@pytest.mark.parametrize("args, message", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_and_exit_2(args, message, capsys):
    if not any(arg.startswith("dry_run=") for arg in args):
        args = [*args, "dry_run=json"]  # never submit, even if validation let something through
    assert cli.main(args) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err


@pytest.mark.parametrize(
    "args, message",
    [(["model=gpt_2b"], "unknown model 'gpt_2b'"), (["modle=gpt_1b"], "did you mean 'model'?"),
     (["gpus=12"], "cannot be laid out"), (["name='x;touch /tmp/launcher-test'"], "invalid run name")],
)  # fmt: skip
def test_python_m_launcher_reports_errors_without_traceback(args, message):
    result = run_launcher(*args, "dry_run=json", cwd=REPO, timeout=60)
    assert result.returncode == 2
    assert result.stdout == "" and result.stderr.startswith("error: ") and message in result.stderr
    assert "Traceback" not in result.stderr
    assert not os.path.exists("/tmp/launcher-test")


def test_dry_run_json_prints_one_object_per_run(capsys):
    # cluster=slurm: on the local cluster this machine's memory would refuse some (a dry run then exits 2)
    assert cli.main(["-m", "gpus=8,16,128", "model=gpt_125m,gpt_1b", "cluster=slurm", "dry_run=json"]) == 0
    plans = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(p["gpus"], p["model"]) for p in plans] == [
        (8, "gpt_125m"), (8, "gpt_1b"), (16, "gpt_125m"), (16, "gpt_1b"), (128, "gpt_125m"), (128, "gpt_1b")]  # fmt: skip
    keys = "nodes tasks_per_node micro_batch grad_accum global_batch tokens_per_step params"
    assert set(keys.split()) <= set(plans[0])
    assert plans[2]["nodes"] == 2 and plans[4]["nodes"] == 16


def test_dry_run_true_prints_plan_and_script(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCHER_RUN_ROOT", str(tmp_path))
    assert cli.main(["gpus=16", "name=demo", "dry_run=true"]) == 0
    out = capsys.readouterr().out
    assert "tasks_per_node" in out and "hybrid" in out
    assert "#SBATCH --nodes=2" in out and "#SBATCH --job-name=demo" in out
    assert str(tmp_path / "demo" / "submitit") in out
    assert not (tmp_path / "demo").exists()  # a dry run writes nothing


def test_help_lists_the_groups(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "gpt_1b" in out and "slurm" in out and "--multirun" in out


def test_a_real_launch_goes_to_submit_launch(monkeypatch):
    calls = []
    fake = types.ModuleType("launcher.submit.submitter")
    fake.launch = lambda runs, sweep: calls.append((runs, sweep)) or Launched([])
    monkeypatch.setitem(sys.modules, "launcher.submit.submitter", fake)
    assert cli.main(["-m", "gpus=8,16"]) == 0
    ((runs, sweep),) = calls
    assert sweep is True and [r.plan.gpus for r in runs] == [8, 16]


def test_subcommands_dispatch_lazily(monkeypatch):
    module = types.ModuleType("fake_subcommand")
    module.configure = lambda parser: parser.add_argument("--all", action="store_true")
    module.main = lambda args: 7 if args.all else 1
    monkeypatch.setitem(sys.modules, "fake_subcommand", module)
    monkeypatch.setitem(cli.COMMANDS, "runs", cli.Command("fake_subcommand", "fake"))
    assert cli.main(["runs", "--all"]) == 7


def test_help_and_version_import_no_command_or_hydra():
    code = ("import sys; from launcher import cli; assert cli.main(['--help']) == 0; "
            "assert cli.main(['--version']) == 0; assert cli.main([]) == 0; "
            "loaded = [m for m in sys.modules if m.startswith(('hydra', 'omegaconf', 'submitit', 'torch', "
            "'launcher.commands.runs', 'launcher.commands.plan'))]; assert not loaded, loaded")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "launcher 0.1.0" in result.stdout and "compose runs from conf/" in result.stdout


def test_runs_imports_only_what_it_needs(tmp_path):
    code = (f"import sys; from launcher import cli; assert cli.main(['runs', '--json', '--root', {str(tmp_path)!r}]) == 0; "
            "loaded = [m for m in sys.modules if m.startswith(('hydra', 'omegaconf', 'submitit', 'torch', 'yaml', "
            "'launcher.commands.launch', 'launcher.compose.composer', 'launcher.compose.catalog'))]; assert not loaded, loaded")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_overrides_after_an_option_are_overrides(capsys):
    assert cli.main(["gpus=8", "-m", "model=gpt_125m,gpt_1b", "cluster=slurm", "dry_run=json"]) == 0
    assert [json.loads(line)["model"] for line in capsys.readouterr().out.splitlines()] == ["gpt_125m", "gpt_1b"]


@pytest.mark.parametrize("argv0, on_path, expected", [
    ("/opt/venv/bin/launcher", "/opt/venv/bin/launcher", "launcher"),
    ("/opt/venv/bin/launcher", None, "/opt/venv/bin/launcher"),
    ("/opt/venv/bin/launcher", "/usr/bin/launcher", "/opt/venv/bin/launcher"),
    ("/repo/launcher/__main__.py", "/opt/venv/bin/launcher", f"{sys.executable} -m launcher"),
])  # fmt: skip
def test_hints_name_the_command_as_it_was_invoked(monkeypatch, argv0, on_path, expected):
    monkeypatch.setattr(sys, "argv", [argv0])
    monkeypatch.setattr(common.shutil, "which", lambda name: on_path if name == "launcher" else None)
    assert common.invocation() == expected


def test_a_pasted_hint_runs(tmp_path):
    """The describe hint printed after a submission works when pasted into a shell elsewhere."""
    env = {**os.environ, "LAUNCHER_RUN_ROOT": str(tmp_path)}
    hint = subprocess.run([sys.executable, "-c", "from launcher.views.lookup import invocation; print(invocation())"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60).stdout.strip()
    assert hint == f"{sys.executable} -m launcher"
    result = subprocess.run(f"{hint} runs --json", shell=True, cwd=tmp_path, capture_output=True, text=True,
                            timeout=60, env={**env, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr


def test_the_hints_after_a_launch_are_shell_quoted_to_paste(capsys):
    """A run root with a space (``/scratch/my runs``): each printed command still pastes into a shell."""
    from launcher.commands.launch import print_submitted
    from launcher.core.run_index import RunRecord
    from launcher.submit.submitter import Launched

    rec = RunRecord(name="r1", run_dir="/scratch/my runs/r1", model="gpt_tiny", gpus=2, nodes=1, gpus_per_node=2,
                    steps=10, cluster="local", submitted_at=1.0, job_id="7")
    print_submitted(Launched([rec]))
    out = capsys.readouterr().out
    assert "  run dir  '/scratch/my runs/r1'\n" in out and " -f '/scratch/my runs/r1/run.yaml'\n" in out
