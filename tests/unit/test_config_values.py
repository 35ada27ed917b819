"""Every bad value or argument is refused before anything is submitted or recorded: exit status 2, one line
on stderr naming the key (or option), and the run root untouched. The ranges themselves live in one table,
launcher/compose/ranges.py's RANGES, which docs/configuration.md lists."""
from __future__ import annotations

import dataclasses
import os
import sys
import types
import typing

import pytest

from launcher import cli
from launcher.core.config import RunConfig
from launcher.compose.ranges import RANGES
from support.helpers import REPO, run_launcher, said


TYPES = [
    (["train.steps=abc"], "train.steps"), (["train.steps=1.5"], "train.steps"), (["train.lr=abc"], "train.lr"),
    (["train.lr=[1]"], "train.lr"), (["model.d_model=big"], "model.d_model"), (["train.seed=1.5"], "train.seed"),
    (["cluster.exclusive=maybe"], "cluster.exclusive"), (["parallel.compile=2"], "parallel.compile"),
    (["force=1"], "force"), (["cluster.setup=abc"], "cluster.setup"), (["cluster.sbatch_flags=5"], "cluster.sbatch_flags"),
    (["train=5"], "train"), (["train.lr=null"], "train.lr"), (["model.name=null"], "model.name"),
    (["train.micro_batch=big"], "train.micro_batch"), (["train.micro_batch=1.5"], "train.micro_batch"),
    (["dry_run=maybe"], "dry_run"), (["gpus=abc"], "gpus"), (["sweep.parallel=all"], "sweep.parallel"),
]  # fmt: skip
RANGE = [
    (["train.lr=0"], "train.lr"), (["train.lr=-1"], "train.lr"), (["train.beta1=1"], "train.beta1"),
    (["train.beta1=2"], "train.beta1"), (["train.beta1=-0.1"], "train.beta1"), (["train.beta2=1.0"], "train.beta2"),
    (["train.grad_clip=0"], "train.grad_clip"), (["train.grad_clip=-1"], "train.grad_clip"),
    (["train.warmup_steps=-1"], "train.warmup_steps"), (["train.weight_decay=-0.1"], "train.weight_decay"),
    (["train.min_lr_ratio=1.5"], "train.min_lr_ratio"), (["train.min_lr_ratio=-0.1"], "train.min_lr_ratio"),
    (["train.log_every=0"], "train.log_every"), (["train.eval_every=-1"], "train.eval_every"),
    (["train.eval_batches=0"], "train.eval_batches"), (["train.checkpoint_every=-1"], "train.checkpoint_every"),
    (["train.keep_checkpoints=0"], "train.keep_checkpoints"), (["train.seed=-1"], "train.seed"),
    (["train.seed=4294967296"], "train.seed"), (["train.steps=0"], "train.steps"), (["train.steps=-5"], "train.steps"),
    (["train.steps=100000000000000000000000"], "train.steps"), (["train.stall_timeout_s=0"], "train.stall_timeout_s"),
    (["train.preflight_timeout_s=0"], "train.preflight_timeout_s"),
    (["train.global_batch=0"], "train.global_batch"), (["train.batch_per_gpu=0"], "train.batch_per_gpu"),
    (["train.micro_batch=0"], "train.micro_batch"), (["train.micro_batch=-2"], "train.micro_batch"),
    (["data.val_fraction=1"], "data.val_fraction"), (["data.val_fraction=1.5"], "data.val_fraction"),
    (["data.val_fraction=-0.1"], "data.val_fraction"), (["data.val_fraction=0"], "data.val_fraction"),
    (["data.store.retry_s=0"], "data.store.retry_s"), (["data.store.stall_s=-1"], "data.store.stall_s"),
    (["data.stream_cache_gb=0"], "data.stream_cache_gb"), (["data.stream_window=0"], "data.stream_window"),
    (["data.read_ahead=-1"], "data.read_ahead"), (["data.stream_connections=0"], "data.stream_connections"),
    (["cluster.store.retry_s=0"], "cluster.store.retry_s"), (["cluster.store.stall_s=0"], "cluster.store.stall_s"),
    (["model.d_model=0"], "model.d_model"), (["model.n_heads=0"], "model.n_heads"), (["model.n_layers=-1"], "model.n_layers"),
    (["model.seq_len=0"], "model.seq_len"), (["model.vocab_size=0"], "model.vocab_size"),
    (["model.mlp_ratio=0"], "model.mlp_ratio"), (["model.d_model=65"], "model.d_model"),
    (["gpus=custom", "layout.gpus=0"], "layout.gpus"), (["layout.nodes=0"], "layout.nodes"), (["gpus=0"], "gpus"),
    (["cluster.gpus_per_node=0"], "cluster.gpus_per_node"), (["cluster.gpu_memory_gb=0"], "cluster.gpu_memory_gb"),
    (["cluster.cpus_per_gpu=0"], "cluster.cpus_per_gpu"), (["cluster.time_limit_min=0"], "cluster.time_limit_min"),
    (["cluster.signal_delay_s=-1"], "cluster.signal_delay_s"), (["cluster.max_requeues=-1"], "cluster.max_requeues"),
    (["train.export_every=-1"], "train.export_every"), (["train.export_every=30"], "train.export_every"),
    (["cluster.max_retries=-1"], "cluster.max_retries"), (["cluster.ssh_timeout_s=0"], "cluster.ssh_timeout_s"),
    (["cluster.time_limit_min=1", "cluster.signal_delay_s=60"], "cluster.signal_delay_s"),
    (["sweep.parallel=0"], "sweep.parallel"), (["sweep.parallel=-1"], "sweep.parallel"),
    (["-m", "search=optuna", "search.trials=0", "train.lr=interval(1e-4,1e-3)"], "search.trials"),
    (["-m", "search=optuna", "search.parallel=0", "train.lr=interval(1e-4,1e-3)"], "search.parallel"),
    (["-m", "search=optuna", "search.max_failures=-1", "train.lr=interval(1e-4,1e-3)"], "search.max_failures"),
    (["-m", "search=optuna", "search.startup_trials=-1", "train.lr=interval(1e-4,1e-3)"], "search.startup_trials"),
]  # fmt: skip
NON_FINITE = [
    (["train.lr=nan"], "train.lr"), (["train.lr=inf"], "train.lr"), (["train.lr=-inf"], "train.lr"),
    (["train.beta1=nan"], "train.beta1"), (["train.grad_clip=inf"], "train.grad_clip"),
    (["train.weight_decay=nan"], "train.weight_decay"), (["train.min_lr_ratio=nan"], "train.min_lr_ratio"),
    (["data.val_fraction=nan"], "data.val_fraction"), (["cluster.gpu_memory_gb=inf"], "cluster.gpu_memory_gb"),
    (["train.stall_timeout_s=-inf"], "train.stall_timeout_s"),
]  # fmt: skip
EMPTY = [
    (["name=''"], "name"), (["model.name=''"], "model.name"), (["data.path=''"], "data.path"),
    (["data.cache_dir=''"], "data.cache_dir"), (["cluster.partition=''"], "cluster.partition"),
    (["cluster.account=' '"], "cluster.account"), (["cluster.mem_per_gpu=''"], "cluster.mem_per_gpu"),
    (["cluster.gpu_type=''"], "cluster.gpu_type"), (["cluster.container_image=''"], "cluster.container_image"),
    (["run_root=''"], "run_root"), (["model=''"], "model"), (["cluster=''"], "cluster"),
]  # fmt: skip
DUPLICATES = [
    (["train.lr=1e-3", "train.lr=2e-3"], "train.lr"), (["gpus=8", "gpus=16"], "gpus"),
    (["train.steps=5", "+train.steps=6"], "train.steps"),
    (["-f", "FILE:train: {lr: 0.001, lr: 0.002}\n"], "lr"), (["-f", "FILE:train: {lr: 0.001}\ntrain.lr: 0.002\n"], "train.lr"),
]  # fmt: skip
ADDED_KEYS = [
    (["+train.newkey=1"], "train.newkey"), (["++train.newkey=1"], "train.newkey"), (["+model.depth=3"], "model.depth"),
    (["+newtop=1"], "newtop"), (["+cluster.setup.x=1"], "cluster.setup.x"), (["+train.lr=1"], "train.lr"),
    (["+cluster.sbatch_flags.BAD=1"], "cluster.sbatch_flags"), (["train.lrr=1e-3"], "train.lrr"),
]  # fmt: skip
ODD_NAMES = [
    (["name='a\nb'"], "name"), (["name='a b'"], "name"), (["name=../x"], "name"), (["name=.hidden"], "name"),
    (["name=" + "x" * 65], "name"), (["name='a;b'"], "name"), (["cluster.partition='a\nb'"], "cluster.partition"),
    (["data.path='/tmp/a\nb'"], "data.path"), (["model.name='x\ty'"], "model.name"),
    (["cluster.setup=['echo a\nb']"], "cluster.setup"), (["cluster.qos='a b'"], "cluster.qos"),
    (["+cluster.sbatch_flags.mail-type='a b'"], "cluster.sbatch_flags.mail-type"), (["a\nb=1"], "a\\nb=1"),
]  # fmt: skip
SUBCOMMANDS = [
    (["runs", "--status", "DONE"], "--status"), (["runs", "--limit", "0"], "--limit"), (["runs", "--since", "yesterday"], "--since"),
    (["runs", "--watch", "--interval", "0"], "--interval"), (["runs", "--gpus", "two"], "--gpus"),
    (["logs", "x", "--tail", "abc"], "--tail"), (["logs", "nope"], "nope"), (["describe"], "RUN"), (["describe", "nope"], "nope"),
    (["plan", "--mfu", "2"], "--mfu"), (["plan", "--mfu", "0"], "--mfu"), (["plan", "train.lr=nan"], "train.lr"),
    (["plan", "+train.newkey=1"], "train.newkey"), (["stop"], "--sweep"), (["compare"], "--sweep"),
    (["compare", "--sweep", "zzz"], "zzz"), (["delete", "nope", "--yes"], "nope"), (["resume", "nope"], "nope"),
    (["secrets", "create", "env", "bad name"], "bad name"), (["secrets", "frob"], "frob"), (["clusters", "--bogus"], "--bogus"),
    (["-f", "/nonexistent/run.yaml"], "/nonexistent/run.yaml"), (["statuss"], "statuss"), (["--bogus"], "--bogus"),
]  # fmt: skip
ROWS = TYPES + RANGE + NON_FINITE + EMPTY + DUPLICATES + ADDED_KEYS + ODD_NAMES + SUBCOMMANDS


def outside_its_range(args: list, key: str) -> bool:
    """Whether a RANGE row gives ``key`` a value that RANGES[key] refuses (the other rows of a key are refused
    for another reason: a cross-check with another setting)."""
    value = next(float(arg.split("=", 1)[1]) for arg in args if arg.split("=", 1)[0] == key)
    return key in RANGES and not RANGES[key].allows(value)


def test_every_range_has_a_row_outside_it():
    """The table against the product's ranges: every key of RANGES has a row giving it a value its range refuses
    (whose refusal test_a_bad_value_... checks states the range), and no row repeats another."""
    assert len({tuple(args) for args, _ in ROWS}) == len(ROWS)
    covered = {key for args, key in RANGE if outside_its_range(args, key)}
    assert sorted(set(RANGES) - covered) == []


@pytest.fixture
def root(tmp_path, monkeypatch):
    """An empty run root, and a submission that would fail the test instead of reaching Slurm."""
    monkeypatch.setenv("LAUNCHER_RUN_ROOT", str(tmp_path / "runs"))
    (tmp_path / "runs").mkdir()
    fake = types.ModuleType("launcher.submit.submitter")
    fake.launch = lambda runs, sweep: pytest.fail(f"submitted {[r.overrides for r in runs]}")
    fake.resubmit = lambda run_dir, **kwargs: pytest.fail(f"resubmitted {run_dir}")
    monkeypatch.setitem(sys.modules, "launcher.submit.submitter", fake)
    return tmp_path / "runs"


def with_files(args, tmp_path):
    """``FILE:<yaml>`` arguments written to a run file, replaced by its path."""
    out = []
    for index, arg in enumerate(args):
        if arg.startswith("FILE:"):
            path = tmp_path / f"run{index}.yaml"
            path.write_text(arg[5:])
            arg = str(path)
        out.append(arg)
    return out


@pytest.mark.parametrize("args, key", ROWS, ids=[" ".join(a) for a, _ in ROWS])
def test_a_bad_value_is_one_line_naming_it_and_nothing_is_recorded(args, key, root, tmp_path, capsys):
    assert cli.main(with_files(args, tmp_path)) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and err.count("\n") == 1, err
    assert key in err, err
    if (args, key) in RANGE and outside_its_range(args, key):  # it states the range, as docs/configuration.md does
        assert err.startswith(f"error: {key} must be {RANGES[key]}, got "), err
    assert list(root.iterdir()) == []


@pytest.mark.parametrize("args, key", [
    (["train.lr=nan"], "train.lr"), (["cluster.signal_delay_s=-5"], "cluster.signal_delay_s"),
    (["+train.newkey=1"], "train.newkey"), (["name=a\nb"], "name"), (["runs", "--limit", "0"], "--limit"),
])  # fmt: skip
def test_the_real_command_line_says_the_same(args, key, tmp_path):
    """A few rows through ``python -m launcher`` itself, with Slurm out of reach: nothing may get that far."""
    env = {**os.environ, "LAUNCHER_RUN_ROOT": str(tmp_path), "SLURM_CONF": "/nonexistent/slurm.conf"}
    result = run_launcher(*args, cwd=REPO, env=env, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1 and key in result.stderr
    assert list(tmp_path.iterdir()) == []


def numeric_settings(node=RunConfig, prefix=""):
    """Every int or float setting of the typed config, by dotted key."""
    for name, kind in typing.get_type_hints(node).items():
        kind = next((arg for arg in typing.get_args(kind) if arg is not type(None)), kind)
        if dataclasses.is_dataclass(kind):
            yield from numeric_settings(kind, f"{prefix}{name}.")
        elif kind in (int, float):
            yield prefix + name


def test_every_numeric_setting_has_a_range_and_the_docs_list_them_all():
    assert sorted(numeric_settings()) == sorted(RANGES)
    docs = (REPO / "docs" / "configuration.md").read_text()
    for key, rule in RANGES.items():
        assert f"| `{key}` | {rule} |" in docs, f"docs/configuration.md lacks the row of {key}: {rule}"


@pytest.mark.parametrize("args", [
    ["train.lr=1e30"], ["train.warmup_steps=0", "train.weight_decay=0", "train.eval_every=0", "data.val_fraction=0"],
    ["cluster.max_requeues=0", "cluster.max_retries=0", "cluster.signal_delay_s=0", "train.checkpoint_every=0"], ["train.beta1=0", "train.seed=0"],
    ["+cluster.sbatch_flags.mail-type=END"], ["train.steps=10000000"],
])  # fmt: skip
def test_the_edges_of_the_ranges_are_allowed(args, capsys):
    assert cli.main([*args, "dry_run=json"]) == 0
    assert said(capsys.readouterr().err) == []


def test_a_run_that_cannot_finish_in_its_time_budget_is_warned_of(capsys):
    args = ["model=gpt_1b", "gpus=16", "train.steps=100000", "cluster.time_limit_min=60", "cluster.max_requeues=1",
            "force=true", "dry_run=json"]
    assert cli.main(args) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "train.steps" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: train.steps=100000 at the planned ")
    assert "more than the 2.0 h of (cluster.max_requeues+1) x cluster.time_limit_min = 2 x 60 min" in warnings[0]


@pytest.mark.parametrize("command", [["plan"], ["dry_run=true"], ["dry_run=json"]])
def test_a_share_group_that_is_not_a_group_is_refused_before_any_submission(command):

    res = run_launcher(*command, "model=gpt_tiny", "gpus=2", "share_group=nosuchgroup", timeout=60)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "share_group='nosuchgroup' is not a group on this machine" in res.stderr


def test_an_enroot_image_as_the_docs_write_it_is_taken_on_the_command_line(capsys):
    """``nvcr.io#nvidia/pytorch:25.01-py3``: Hydra's grammar reads no unquoted ``#``; the launcher quotes it."""
    from launcher.compose.composer import compose_runs

    (run,) = compose_runs(["gpus=2", "cluster.container.image=nvcr.io#nvidia/pytorch:25.01-py3"])
    assert run.config.cluster.container.image == "nvcr.io#nvidia/pytorch:25.01-py3"
    assert cli.main(["model=gpt_tiny", "gpus=2", "name=a#b", "dry_run=true"]) == 2  # not an image: still refused
    assert "name" in capsys.readouterr().err
