"""Composition from conf/: every model x GPU preset, counts as typed, sweeps."""
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from launcher.compose.catalog import CONF_DIR, gpu_presets, options
from launcher.compose.composer import compose_runs
from launcher.core.config import RunConfig, load_run_config

# One worker makes its composed grid (a module-scoped fixture) for all the tests here.
pytestmark = pytest.mark.xdist_group("compose")

MODELS = options("model")
PRESETS = gpu_presets()
# gpus preset -> (nodes, sharding) on the local cluster's 8-GPU nodes
LAYOUT = {1: (1, "full"), 2: (1, "full"), 4: (2, "full"), 8: (1, "full"), 16: (2, "hybrid"), 128: (16, "hybrid")}


@pytest.fixture(scope="module")
def grid():
    """Every model x every preset, composed as one multirun (one Hydra initialisation)."""
    runs = compose_runs([f"model={','.join(MODELS)}", f"gpus={','.join(map(str, PRESETS))}"], multirun=True)
    return {(run.config.model.name, run.config.layout.gpus): run for run in runs}


def test_conf_offers_the_documented_options():
    assert PRESETS == [1, 2, 4, 8, 16, 128]
    assert "custom" in options("gpus")
    assert options("cluster") == ["local", "slurm"]
    sizes = ["125m", "350m", "760m", "1b", "3b", "7b", "13b", "30b", "70b"]
    assert set(MODELS) == {"gpt_tiny", "gpt_small"} | {f"gpt_{size}" for size in sizes}


def test_grid_is_complete(grid):
    assert len(grid) == len(MODELS) * len(PRESETS)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("gpus", sorted(LAYOUT))
def test_every_model_on_every_preset(grid, model, gpus):
    run = grid[(model, gpus)]
    cfg, plan = run.config, run.plan
    assert isinstance(cfg, RunConfig)
    assert cfg.model.name == model
    nodes, sharding = LAYOUT[gpus]
    if model == "gpt_70b":
        sharding = "full"  # its size file overrides the preset: only full sharding fits its state
    assert (plan.nodes, plan.tasks_per_node, plan.gpus_per_node) == (nodes, gpus // nodes, gpus // nodes)
    assert plan.world_size == gpus
    assert plan.sharding == cfg.parallel.sharding == sharding
    assert plan.global_batch == cfg.train.batch_per_gpu * gpus
    assert plan.micro_batch * plan.grad_accum * plan.world_size == plan.global_batch
    assert plan.tokens_per_step == plan.global_batch * cfg.model.seq_len


def test_size_files_set_the_mpt_shapes_and_training_defaults(grid):
    big = grid[("gpt_70b", 8)].config
    assert (big.model.d_model, big.model.n_heads, big.model.n_layers, big.model.seq_len, big.model.vocab_size) == (
        8192, 64, 80, 2048, 50304)  # fmt: skip
    assert big.parallel.activation_checkpointing == "full"
    tiny = grid[("gpt_tiny", 8)].config
    assert (tiny.model.d_model, tiny.model.seq_len, tiny.model.vocab_size) == (64, 64, 256)
    assert tiny.parallel.activation_checkpointing == "none"


def test_default_run_and_global_batch_scaling():
    (run,) = compose_runs([])
    assert (run.config.model.name, run.config.layout.gpus, run.config.cluster.name) == ("gpt_tiny", 8, "local")
    assert (run.config.cluster.overcommit, run.config.cluster.cpus_per_gpu) == (False, 1)
    batches = {r.plan.gpus: r.plan.global_batch for r in compose_runs(["gpus=8,16,128"], multirun=True)}
    assert batches == {8: 16, 16: 32, 128: 256}


def test_gpus_as_typed_preset_and_custom():
    (preset,) = compose_runs(["gpus=16"])
    assert (preset.plan.nodes, preset.plan.tasks_per_node, preset.config.parallel.sharding) == (2, 8, "hybrid")
    assert preset.overrides == ["gpus=16"]
    (custom,) = compose_runs(["gpus=24"])
    assert (custom.config.layout.gpus, custom.plan.nodes, custom.plan.tasks_per_node) == (24, 3, 8)
    assert custom.plan.global_batch == 48
    (explicit,) = compose_runs(["gpus=custom", "layout.gpus=3"])
    assert (explicit.plan.nodes, explicit.plan.tasks_per_node) == (1, 3)


def test_multirun_expands_the_cartesian_product_in_order():
    runs = compose_runs(["gpus=8,16,128", "model=gpt_125m,gpt_1b", "dry_run=json"], multirun=True)
    assert [(r.plan.gpus, r.plan.model) for r in runs] == [
        (8, "gpt_125m"), (8, "gpt_1b"), (16, "gpt_125m"), (16, "gpt_1b"), (128, "gpt_125m"), (128, "gpt_1b")]  # fmt: skip
    assert runs[2].overrides == ["gpus=16", "model=gpt_125m", "dry_run=json"]


def test_range_choice_and_glob_sweeps():
    steps = [r.config.train.steps for r in compose_runs(["train.steps=range(10,40,10)"], multirun=True)]
    assert steps == [10, 20, 30]
    lrs = [r.config.train.lr for r in compose_runs(["train.lr=choice(0.1,0.2)"], multirun=True)]
    assert lrs == [0.1, 0.2]
    models = [r.config.model.name for r in compose_runs(["model=glob(gpt_t*)"], multirun=True)]
    assert models == ["gpt_tiny"]


def test_cluster_files_and_extra_sbatch_flags(monkeypatch):
    monkeypatch.setenv("SLURM_CONF", "/etc/test/slurm.conf")
    (local,) = compose_runs([])
    assert local.config.cluster.slurm_conf == "/etc/test/slurm.conf"
    (site,) = compose_runs(["cluster=slurm", "+cluster.sbatch_flags.mail-type=END"])
    assert site.config.cluster.partition == "gpu" and site.config.cluster.exclusive is True
    assert site.config.cluster.sbatch_flags == {"mail-type": "END"}


def test_resolved_config_round_trips_through_load_run_config(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCHER_RUN_ROOT", str(tmp_path / "runs"))
    (run,) = compose_runs(["model=gpt_small", "train.micro_batch=auto", "name=rt"])
    path = tmp_path / "config.yaml"
    OmegaConf.save(run.resolved, path)
    assert "${" not in path.read_text()
    loaded = load_run_config(path)
    assert loaded == run.config
    assert loaded.run_root == str(tmp_path / "runs") and loaded.train.micro_batch == "auto"


def test_conf_dir_is_the_repository_conf():
    assert CONF_DIR == Path(__file__).resolve().parents[2] / "conf"
    root = OmegaConf.load(CONF_DIR / "config.yaml")
    # The schema first, then gpus before model (a size may override its preset's sharding), then the app's own.
    assert OmegaConf.to_container(root) == {"defaults": [
        "base", {"gpus": "8"}, {"model": "gpt_tiny"}, {"cluster": "local"}, {"tracking": "none"}, {"search": "none"},
        "_self_"]}
    # Each default is one of its group's files, and is what a run without overrides gets.
    for group, choice in {"gpus": "8", "model": "gpt_tiny", "cluster": "local", "tracking": "none"}.items():
        assert choice in options(group) and (CONF_DIR / group / f"{choice}.yaml").is_file(), group
    (run,) = compose_runs([])
    assert (run.config.layout.gpus, run.config.model.name, run.config.cluster.name,
            run.config.tracking.backend) == (8, "gpt_tiny", "local", "none")


def test_hydras_own_runtime_config_is_not_composed_and_the_apps_config_is_unchanged(monkeypatch):
    """compose_runs leaves out Hydra's own defaults (logging, output dirs, help), which compose() drops
    anyway: the runs' configs are exactly what the full Hydra config gives."""
    from hydra.conf import HydraConf

    from launcher.compose import composer as composing

    sweep = ["gpus=1,16,24", "model=gpt_1b,gpt_tiny", "cluster=local,slurm", "train.steps=7",
             "+cluster.sbatch_flags.mail-type=END"]
    light = composing.compose_runs(sweep, multirun=True)
    monkeypatch.setattr(composing, "hydra_node", HydraConf)
    full = composing.compose_runs(sweep, multirun=True)
    assert len(light) == 12
    assert [OmegaConf.to_yaml(run.resolved) for run in light] == [OmegaConf.to_yaml(run.resolved) for run in full]
    assert [run.config for run in light] == [run.config for run in full]
