"""Run files (``launcher -f run.yaml``): the file becomes the override list the command line would give."""
from __future__ import annotations

import json

import pytest
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser

from launcher import cli
from launcher.compose.composer import compose_runs
from launcher.compose.runfile import dump, hydra_value, load_yaml, merge, to_overrides


@pytest.mark.parametrize("value", [
    "gpt_1b", "a b", "a,b", "it's", 'say "hi"', "back\\slash", "ends\\", "quote\\'d", "null", "True", "inf",
    "12", "3e-4", "", "${x}", "/data/a-b_c.bin", 0, -3, 2.5, 3e-4, 1e300, True, False, None, [1, "a b", None],
    ["x,y", [2]],
])  # fmt: skip
def test_values_read_back_the_same_through_hydras_grammar(value):
    (parsed,) = OverridesParser.create().parse_overrides([f"k={hydra_value(value)}"])
    assert not parsed.is_sweep_override()
    assert parsed.value() == value and type(parsed.value()) is type(value)


def test_nested_and_dotted_keys_flatten_in_order():
    data = load_yaml("""
model: gpt_1b
gpus: 16
cluster: local
train: {steps: 2000, lr: 3e-4, micro_batch: auto}
parallel: {sharding: hybrid, compile: true}
cluster.partition: gpu
cluster.sbatch_flags: {mail-type: END}
data.path: /d/x y.bin
cluster.setup: [module load x, echo ok]
layout: {nodes: null}
""")
    assert to_overrides(data) == [
        "model=gpt_1b", "gpus=16", "cluster=local", "train.steps=2000", "train.lr=0.0003", "train.micro_batch=auto",
        "parallel.sharding=hybrid", "parallel.compile=true", "cluster.partition=gpu",
        "++cluster.sbatch_flags.mail-type=END", "data.path='/d/x y.bin'",
        "cluster.setup=['module load x','echo ok']", "layout.nodes=null"]  # fmt: skip


@pytest.mark.parametrize("text, message", [
    ("train: {lrr: 1}", "unknown key 'train.lrr' (did you mean 'train.lr'?)"),
    ("modle: gpt_1b", "unknown key 'modle' (did you mean 'model'?)"),
    ("train: {steps: abc}", "train.steps must be an integer, got 'abc'"),
    ("train: {steps: 2.5}", "train.steps must be an integer, got 2.5"),
    ("train.lr: true", "train.lr must be a number, got True"),
    ("parallel.compile: 1", "parallel.compile must be true or false, got 1"),
    ("train: 5", "'train' is a section"),
    ("train.lr: {x: 1}", "unknown key 'train.lr.x': 'train.lr' is a value, not a section"),
    ("model: [a]", "model must be an option name, got ['a']"),
    ("model: gpt_2b", "unknown model 'gpt_2b'"),
    ("gpus: abc", "gpus must be a GPU count"),
    ("cluster.setup: x", "cluster.setup must be a list, got 'x'"),
    ("- a\n- b", "expected a mapping of key: value, got list"),
    ("a: [1, 2", "invalid YAML at line"),
    ("data.path: 2026-11-29", "data.path must be a string, got datetime.date(2026, 11, 29)"),
    ("cluster.sbatch_flags: {begin: 2026-11-29}", "unsupported value datetime.date(2026, 11, 29)"),
    ("1: x", "key 1 is not a name"),
])  # fmt: skip
def test_a_bad_run_file_is_one_line_naming_the_file_and_records_nothing(text, message, tmp_path, capsys,
                                                                        monkeypatch):
    monkeypatch.setenv("LAUNCHER_RUN_ROOT", str(tmp_path / "runs"))
    path = tmp_path / "run.yaml"
    path.write_text(text)
    assert cli.main(["-f", str(path), "gpus=1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"error: run file {path}: ") and err.count("\n") == 1, err
    assert message in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("make, message", [
    (lambda p: None, "No such file or directory"),
    (lambda p: p.mkdir(), "Is a directory"),
    (lambda p: p.write_bytes(b"\xff\xfe bad"), "UnicodeDecodeError"),
])  # fmt: skip
def test_a_missing_or_unreadable_run_file_is_one_line(make, message, tmp_path, capsys):
    path = tmp_path / "run.yaml"
    make(path)
    assert cli.main(["-f", str(path), "dry_run=json"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: cannot read run file {path}: {message}\n"


def test_command_line_overrides_win_over_the_file(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text("model: gpt_1b\ngpus: 8\ntrain: {steps: 7, lr: 0.001}\n")
    # cluster=slurm: on the local cluster this machine's memory would refuse gpt_1b (a dry run then exits 2)
    assert cli.main(["-f", str(path), "gpus=16", "train.steps=9", "cluster=slurm", "dry_run=json"]) == 0
    (plan,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (plan["model"], plan["gpus"], plan["nodes"]) == ("gpt_1b", 16, 2)
    assert plan["overrides"] == ["model=gpt_1b", "train.lr=0.001", "gpus=16", "train.steps=9", "cluster=slurm",
                                 "dry_run=json"]


def test_plan_takes_a_run_file_too(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text("model: gpt_1b\ngpus: 8\n")
    assert cli.main(["plan", "--json", "-f", str(path), "gpus=16"]) == 0
    (est,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (est["model"], est["gpus"]) == ("gpt_1b", 16)


def test_a_file_with_a_command_line_sweep(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text("model: gpt_125m\n")
    assert cli.main(["-m", "-f", str(path), "gpus=8,16", "cluster=slurm", "dry_run=json"]) == 0
    plans = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(p["model"], p["gpus"]) for p in plans] == [("gpt_125m", 8), ("gpt_125m", 16)]


def test_merge_drops_the_files_value_of_a_key_typed_again():
    assert merge(["gpus=8", "train.lr=0.1", "++cluster.sbatch_flags.x=1"], ["+cluster.sbatch_flags.x=2", "gpus=4"]) \
        == ["train.lr=0.1", "+cluster.sbatch_flags.x=2", "gpus=4"]


def test_a_runs_run_file_composes_the_same_run_again(tmp_path):
    data = tmp_path / "a b,c"
    with open(data, "wb") as f:
        f.truncate(64 << 20)  # a (sparse) token file: launch checks that data.path exists and holds enough tokens
    typed = ["model=gpt_125m", "gpus=24", "cluster=slurm", "train.steps=20", "train.lr=3e-4", "name=x", "force=true",
             "+cluster.sbatch_flags.mail-type=END", f"data.path='{data}'", "cluster.setup=[a,'b c']", "dry_run=json"]
    (run,) = compose_runs(typed)
    text = dump(run.run_file)
    assert yaml.safe_load(text) == {
        "model": "gpt_125m", "gpus": 24, "cluster": "slurm", "tracking": "none", "train": {"steps": 20, "lr": 3e-4},
        "cluster.sbatch_flags.mail-type": "END", "data": {"path": str(data)}, "cluster.setup": ["a", "b c"]}
    (again,) = compose_runs(to_overrides(load_yaml(text)))
    assert again.plan == run.plan and again.run_file == run.run_file
    assert again.config.cluster == run.config.cluster and again.config.train == run.config.train


def test_defaulted_choices_are_explicit_and_each_sweep_point_has_its_own():
    runs = compose_runs(["gpus=1,2"], multirun=True)
    assert [run.run_file for run in runs] == [
        {"model": "gpt_tiny", "gpus": 1, "cluster": "local", "tracking": "none"},
        {"model": "gpt_tiny", "gpus": 2, "cluster": "local", "tracking": "none"}]
