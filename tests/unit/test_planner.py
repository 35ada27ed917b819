"""The planner (launcher/forecast/) and ``launcher plan``: memory by hand, fit decisions, suggestions,
the CLI and the refusal at launch (the memory model against a real FSDP2 run: tests/cluster/training)."""
from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest

from launcher import cli
from launcher.compose.composer import compose_runs
from launcher.core.config import ModelConfig, RunConfig, TrainConfig
from launcher.core.plan import parameter_counts
from launcher.core.gpus import memory_gib as memory_for_type
from launcher.forecast.estimate import estimate
from launcher.forecast.target import GIB, Assumptions, hardware_for
from launcher.forecast.host import RANK_RUNTIME_GIB, host_fixes, host_memory, machine_memory
from launcher.forecast.memory import activation_components, local_param_numel, memory, shard_numel
from launcher.compose.layout import plan_of as layout_of
from support.helpers import H100, REPO, run_launcher, said



def plan_of(overrides):
    (run,) = compose_runs(list(overrides))
    return estimate(run.config, run.plan, hardware_for(run.config.cluster), overrides=run.overrides)


# --------------------------------------------------------------------------------------------
# Memory by hand


def test_memory_of_a_small_model_by_hand():
    cfg = RunConfig(model=ModelConfig(name="hand", d_model=64, n_heads=2, n_layers=2, seq_len=64, vocab_size=256),
                    train=TrainConfig(batch_per_gpu=2, micro_batch=2))
    cfg.layout.gpus = 4
    plan = layout_of(cfg)
    assert (plan.world_size, plan.micro_batch, plan.grad_accum) == (4, 2, 1)
    # Parameters. Block: ln1 64 + qkv 192*64 + proj 64*64 + ln2 64 + fc 256*64 + proj 64*256
    #   = 12*64^2 + 2*64 = 49,280. Root: tok_emb 256*64 + pos_emb 64*64 + ln_f 64 = 20,544.
    #   P = 20,544 + 2*49,280 = 119,104 (the contract's formula). 3 + 2*6 = 15 tensors.
    block, root, total = 49_280, 20_544, 119_104
    assert parameter_counts(cfg.model)[1] == total
    # Full sharding over 4: every dim 0 (256, 64, 192, ...) divides by 4, so each rank holds P/4 = 29,776.
    local = total // 4
    assert local_param_numel(cfg.model, 4) == local == 29_776
    mem = memory(cfg, plan, H100, Assumptions())
    assert mem.params == 4 * local == 119_104  # fp32 shards
    assert mem.grads == 4 * local == 119_104  # fp32 shards
    assert mem.optimizer == 8 * local + 4 * 15 == 238_268  # exp_avg + exp_avg_sq, fp32, + a 4-byte step each
    # precision auto = bf16 on a GPU: the root and two blocks gathered in bf16.
    assert mem.gathered == 2 * (root + 2 * block) == 238_208
    # The root's bf16 gradient through backward + one block's bf16 gradient and its fp32 reduce-scatter input.
    assert mem.grad_buffers == 2 * root + (2 + 4) * block == 336_768
    # Activations, micro-batch b=2, s=64, h=64, a=2, r=4, V=256, bf16 (2 B), no checkpointing:
    #   per layer s*b*h*(8 + 2r)*2 + 4*a*s*b + 16*s*b = 128*64*16*2 + 4*2*128 + 16*128 = 265,216
    #   two layers 530,432; final norm 2*s*b*h*2 + 8*s*b = 33,792; loss 12*s*b*V = 393,216.
    parts = activation_components(cfg.model, 2, "none", "bf16")
    assert parts == {"layers": 530_432, "recompute": 0, "final_norm": 33_792, "loss_saved": 131_072,
                     "loss_transient": 262_144}
    assert mem.activations == 957_440
    need = 2 * 119_104 + 238_268 + 238_208 + 336_768 + 957_440
    assert need == 2_008_892
    assert mem.margin == int(0.10 * need + GIB)  # 10% + 1 GiB
    assert mem.total == need + mem.margin and mem.capacity == 80 * GIB and mem.fits
    # Gradient accumulation adds nothing: the same micro-batch with grad_accum 4 needs exactly the same
    # (launcher/train/loop.py reduce-scatters every micro-batch into the gradient shards; nothing unsharded survives).
    accumulating = dataclasses.replace(cfg, train=TrainConfig(batch_per_gpu=8, micro_batch=2))
    accumulating.layout.gpus = 4
    plan4 = layout_of(accumulating)
    assert (plan4.micro_batch, plan4.grad_accum) == (2, 4)
    assert memory(accumulating, plan4, H100, Assumptions()) == mem


def test_full_checkpointing_keeps_block_inputs_and_rebuilds_one_block():
    model = ModelConfig(name="m", d_model=64, n_heads=2, n_layers=4, seq_len=64, vocab_size=256)
    none, full = (activation_components(model, 2, level, "bf16") for level in ("none", "full"))
    layer = none["layers"] // 4
    assert full["layers"] == 4 * 64 * 2 * 64 * 2  # L * s*b*h * 2 B
    assert full["recompute"] == layer
    selective = activation_components(model, 2, "selective", "bf16")
    assert selective["layers"] == 2 * layer + 2 * 64 * 2 * 64 * 2  # blocks 0 and 2 checkpointed


def test_uneven_shards_follow_torch_chunk():
    assert [shard_numel((40, 3), 3, i) for i in range(3)] == [14 * 3, 14 * 3, 12 * 3]
    assert [shard_numel((5,), 4, i) for i in range(4)] == [2, 2, 1, 0]
    assert [shard_numel((2,), 4, i) for i in range(4)] == [1, 1, 0, 0]


def test_gpu_memory_table_and_sources():
    assert memory_for_type("h100") == 80 and memory_for_type("nvidia_h100_nvl") == 94
    assert memory_for_type("h200") == 141 and memory_for_type("a100-80gb") == 80 and memory_for_type("a100") == 40
    assert memory_for_type("tpu") is None
    (local,) = compose_runs([])
    hw = hardware_for(local.config.cluster)
    assert (hw.memory_gib, hw.enforce) == (80, True) and "local" in hw.memory_source
    (site,) = compose_runs(["cluster=slurm"])
    assert hardware_for(site.config.cluster).memory_source == "cluster.gpu_memory_gb"
    (typed,) = compose_runs(["cluster=slurm", "cluster.gpu_memory_gb=null", "cluster.gpu_type=h200"])
    hw = hardware_for(typed.config.cluster)
    assert (hw.memory_gib, hw.peak_flops, hw.enforce) == (141, 989e12, True)
    (unknown,) = compose_runs(["cluster=slurm", "cluster.gpu_memory_gb=null"])
    assert hardware_for(unknown.config.cluster).enforce is False


# --------------------------------------------------------------------------------------------
# Fit decisions and suggestions (8 GPUs per node, 80 GiB)


def test_gpt_1b_on_8_gpus_fits():
    est = plan_of(["model=gpt_1b", "gpus=8"])
    assert est.fits and est.memory.total < 80 * GIB
    assert est.max_micro_batch >= est.plan.micro_batch and not est.suggestions


def test_gpt_70b_full_sharding_on_8_gpus_does_not_fit_and_says_what_would():
    est = plan_of(["model=gpt_70b", "gpus=8"])
    assert est.cfg.parallel.sharding == "full" and not est.fits
    # 64.85e9 params x (4 + 4 + 8) B / 8 = 120.8 GiB of training state alone, over 80; 162.4 GiB in all.
    assert est.memory.states / GIB == pytest.approx(64_854_695_936 * 16 / 8 / GIB, rel=1e-6)
    assert est.memory.total / GIB == pytest.approx(162.4, abs=0.05)
    assert est.max_micro_batch == 0 and est.suggestions
    # No micro-batch, checkpointing or sharding change is enough; the fewest GPUs are 24 (3 nodes), as is.
    assert [str(s) for s in est.suggestions] == ["gpus=24 parallel.sharding=full (73.9 GiB)"]
    for suggestion in est.suggestions:  # every suggestion, applied through Hydra, fits
        fixed = plan_of(["model=gpt_70b", "gpus=8", *suggestion.overrides])
        assert fixed.fits, suggestion
        assert fixed.memory.total / GIB == pytest.approx(suggestion.total_gib)
    assert any(o.startswith("gpus=") for s in est.suggestions for o in s.overrides)


def test_gpt_70b_on_128_gpus_fits_at_its_preset():
    # The preset: full sharding (over the gpus preset's hybrid), full checkpointing, the whole per-GPU
    # batch as one micro-batch. The state is 7.6 GiB per GPU.
    base = ["model=gpt_70b", "gpus=128"]
    whole = plan_of(base)
    assert (whole.cfg.parallel.sharding, whole.cfg.parallel.activation_checkpointing) == ("full", "full")
    assert (whole.plan.micro_batch, whole.plan.grad_accum) == (4, 1) and whole.fits and not whole.suggestions
    assert whole.memory.states / GIB == pytest.approx(64_854_695_936 * 16 / 128 / GIB, rel=1e-3)
    assert whole.memory.total / GIB == pytest.approx(37.9, abs=0.05)
    # Micro-batch 1 x grad_accum 4 needs less memory (no unsharded gradients are held: each micro-batch
    # is reduce-scattered) but communicates four times as much per step.
    est = plan_of([*base, "train.micro_batch=1"])
    assert est.plan.grad_accum == 4 and est.fits and est.memory.total / GIB == pytest.approx(23.9, abs=0.05)
    assert est.timing.reduce_scatter_bytes == pytest.approx(4 * whole.timing.reduce_scatter_bytes)
    assert est.timing.allgather_bytes == pytest.approx(4 * whole.timing.allgather_bytes)
    # Hybrid sharding keeps a node's share (1/8) of the state: no fit, and full sharding is the fix.
    hybrid = plan_of([*base, "parallel.sharding=hybrid"])
    assert not hybrid.fits
    assert [str(s) for s in hybrid.suggestions] == ["parallel.sharding=full (37.9 GiB)"]


# Every model preset at the gpus presets (8 GPUs per node, 80 GiB): does it fit as shipped? gpus=1 and
# gpus=8 shard fully, gpus=16 and gpus=128 shard hybrid (one copy of the state per node of 8).
PRESET_FITS = {  # model: (fits on gpus=1, 8, 16, 128)
    "gpt_tiny": (True, True, True, True),
    "gpt_small": (True, True, True, True),
    "gpt_125m": (True, True, True, True),
    "gpt_350m": (True, True, True, True),
    "gpt_760m": (True, True, True, True),
    "gpt_1b": (True, True, True, True),
    "gpt_3b": (True, True, True, True),
    "gpt_7b": (False, True, True, True),
    "gpt_13b": (False, True, True, True),
    "gpt_30b": (False, True, True, True),
    "gpt_70b": (False, False, False, True),  # full sharding: 120.8 GiB of state on 8; fits from gpus=24
}


@pytest.mark.parametrize("model", sorted(PRESET_FITS))
def test_model_presets_fit_at_the_gpus_presets(model):
    for gpus, fits in zip((1, 8, 16, 128), PRESET_FITS[model]):
        est = plan_of([f"model={model}", f"gpus={gpus}"])
        assert est.fits == fits, (model, gpus, est.memory.total / GIB)
        if fits:
            assert est.max_micro_batch >= est.plan.micro_batch
        else:
            assert est.suggestions and all(plan_of([f"model={model}", f"gpus={gpus}", *s.overrides]).fits
                                           for s in est.suggestions)


@pytest.mark.parametrize("model, gpus", [("gpt_7b", 2), ("gpt_13b", 4), ("gpt_30b", 8), ("gpt_70b", 24)])
def test_fewest_gpus_for_the_large_presets(model, gpus):
    # As shipped (micro-batch and checkpointing), with full sharding: the fewest GPUs that fit.
    est = plan_of([f"model={model}", "gpus=1"])
    assert f"gpus={gpus} parallel.sharding=full" in [" ".join(s.overrides) for s in est.suggestions]
    assert plan_of([f"model={model}", f"gpus={gpus}", "parallel.sharding=full"]).fits


def test_checkpointing_and_sharding_suggestions():
    est = plan_of(["model=gpt_3b", "gpus=8", "parallel.activation_checkpointing=none", "train.micro_batch=16"])
    assert not est.fits
    suggested = [" ".join(s.overrides) for s in est.suggestions]
    assert suggested[:2] == ["train.micro_batch=8", "parallel.activation_checkpointing=selective"]
    for suggestion in est.suggestions:
        assert plan_of(["model=gpt_3b", "gpus=8", "parallel.activation_checkpointing=none", "train.micro_batch=16",
                        *suggestion.overrides]).fits
    hybrid = plan_of(["model=gpt_30b", "gpus=16", "train.micro_batch=4"])
    assert hybrid.cfg.parallel.sharding == "hybrid" and not hybrid.fits
    assert ["parallel.sharding=full"] in [s.overrides for s in hybrid.suggestions]


def test_micro_batch_auto_fits_where_its_halving_reaches():
    est = plan_of(["model=gpt_1b", "train.micro_batch=auto", "train.batch_per_gpu=64"])
    assert est.plan.micro_batch == 8 and est.fits


def test_flops_time_and_communication():
    est = plan_of(["model=gpt_1b", "gpus=8"])
    t, p = est.timing, est.plan
    assert t.model_flops == p.flops_per_token * p.tokens_per_step
    # Selective checkpointing runs the forward of 12 of 24 blocks again: 1/3 x half of the blocks' FLOPs.
    assert 1.1 < t.hardware_flops / t.model_flops < 1.2
    full = plan_of(["model=gpt_1b", "gpus=8", "parallel.activation_checkpointing=full"]).timing
    assert full.hardware_flops / full.model_flops == pytest.approx(4 / 3, rel=0.01)
    assert t.compute_s == pytest.approx(t.hardware_flops / 8 / (0.45 * 989e12))
    # Full sharding over 8, per micro-batch (grad_accum 4): all-gather twice in bf16, reduce-scatter once in fp32.
    assert p.grad_accum == 4
    assert t.allgather_bytes == pytest.approx(p.grad_accum * 2 * 2 * p.params * 7 / 8)
    assert t.reduce_scatter_bytes == pytest.approx(p.grad_accum * 4 * p.params * 7 / 8) and t.allreduce_bytes == 0
    # Each at 300 GB/s over NVLink; exposed: each micro-batch's first all-gather (root + first block, out of
    # two gathers of P) and the root's reduce-scatter after its backward.
    ag_s, rs_s = t.allgather_bytes / 300e9, t.reduce_scatter_bytes / 300e9
    root, block = 107_218_944, 50_335_744
    assert t.comm_s == pytest.approx(ag_s + rs_s)
    assert t.exposed_comm_s == pytest.approx((root + block) / p.params / 2 * ag_s + root / p.params * rs_s)
    assert t.step_s == pytest.approx(t.exposed_comm_s + t.compute_s)  # compute-bound
    assert t.step_s >= t.compute_s and t.tokens_per_s_per_gpu == pytest.approx(p.tokens_per_step / 8 / t.step_s)
    # One micro-batch of 32 (grad_accum 1): the same all-gathers and reduce-scatters, once per step.
    once = plan_of(["model=gpt_1b", "gpus=8", "train.micro_batch=32"]).timing
    assert once.reduce_scatter_bytes == pytest.approx(t.reduce_scatter_bytes / 4)
    assert once.allgather_bytes == pytest.approx(t.allgather_bytes / 4)
    # Hybrid over 2 nodes of 8: each micro-batch's shard is also all-reduced across the nodes.
    hybrid = plan_of(["model=gpt_1b", "gpus=16"]).timing
    assert hybrid.allreduce_bytes == pytest.approx(p.grad_accum * 2 * 4 * p.params / 8 * 1 / 2)


# --------------------------------------------------------------------------------------------
# launcher plan


def test_plan_multirun_prints_one_row_per_combination(capsys):
    assert cli.main(["plan", "-m", "gpus=8,16,128", "model=gpt_1b,gpt_70b"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("gpt_")]
    assert len(rows) == 6
    assert "scaling eff." in out and "does not fit; to fit: " in out
    assert out.count("NO") == 2  # gpt_70b on 8 and 16 GPUs: 120.8 and 60.4 GiB of state per GPU


def test_plan_json_keys(capsys):
    assert cli.main(["plan", "--json", "-m", "gpus=8,16", "model=gpt_1b", "--mfu", "0.4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    objects = [json.loads(line) for line in lines]
    for obj in objects:
        assert {"model", "gpus", "sharding", "activation_checkpointing", "precision", "micro_batch", "grad_accum",
                "gpu", "memory_bytes", "activations_gib", "mem_per_gpu_gib", "capacity_gib", "fits", "max_micro_batch",
                "model_flops_per_step", "hardware_flops_per_step", "step_time_s", "tokens_per_s_per_gpu", "comm",
                "scaling_efficiency", "suggestions", "assumptions"} <= obj.keys()
        assert set(obj["activations_gib"]) == {"none", "selective", "full"}
        assert obj["assumptions"]["mfu"] == 0.4
    assert objects[0]["scaling_efficiency"] == 1.0 and 0.5 < objects[1]["scaling_efficiency"] <= 1.0


def test_plan_single_run_table(capsys):
    assert cli.main(["plan", "model=gpt_70b", "gpus=8"]) == 0
    out = capsys.readouterr().out
    for text in ("parameters", "gradients", "optimizer (AdamW)", "gathered params", "activations (full)", "margin",
                 "total", "GPU memory", "largest micro-batch", "model FLOPs / step", "hardware FLOPs / step",
                 "all-gather / GPU", "reduce-scatter / GPU", "step time", "tokens/s/GPU", "DOES NOT FIT", "gpus=",
                 "this machine: gpt_70b on 8 local ranks needs"):
        assert text in out, text
    # Each formula beside its figure, from the function that computed it.
    assert "8 B x P / 8 (m, v fp32) + 4 B x 483 tensors" in out and "hardware FLOPs / 8 GPUs / (0.45 x peak)" in out


def test_plan_help_and_bad_options(capsys):
    assert cli.main(["plan", "--help"]) == 0
    assert "--inter-gbps" in capsys.readouterr().out
    assert cli.main(["plan", "--mfu", "2"]) == 2
    assert "--mfu must be in (0, 1]" in capsys.readouterr().err
    assert cli.main(["plan", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: launcher plan: unrecognized arguments: --bogus") and err.count("\n") == 1


def test_a_gpu_of_unknown_type_is_sized_but_not_timed(tmp_path, monkeypatch, capsys):
    """A cluster file with no gpu_type (as `clusters add` writes for an untyped gres gpu:4): memory is sized with
    its stated assumption; step time, tokens/s, MFU and scaling efficiency are a dash, with one line saying how to
    name the GPU, in a single run's tables, a sweep's comparison and --json alike."""
    files = tmp_path / "config" / "launcher" / "cluster"
    files.mkdir(parents=True)
    (files / "untyped.yaml").write_text(f"name: untyped\nslurm_conf: {tmp_path / 'gone.conf'}\ngpus_per_node: 4\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    line = ("no step time, tokens/s or MFU: GPU type unknown: set cluster.gpu_type=TYPE, or run launcher clusters add "
            "NAME --gpu-type TYPE")
    assert cli.main(["plan", "cluster=untyped", "model=gpt_tiny", "gpus=4"]) == 0
    out = capsys.readouterr().out
    rows = {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", row.strip()) for row in out.splitlines())}
    assert [rows[label][0] for label in ("compute / step", "step time", "tokens/s/GPU", "predicted MFU",
                                         "scaling efficiency")] == ["-"] * 5
    assert out.count(line) == 1 and "80 GiB (assumed (GPU memory unknown: set cluster.gpu_memory_gb)); peak unknown" \
        in out
    assert cli.main(["plan", "-m", "cluster=untyped", "model=gpt_tiny", "gpus=2,4"]) == 0
    out = capsys.readouterr().out
    table = [re.split(r"\s{2,}", row.strip()) for row in out.splitlines() if row.startswith("gpt_tiny")]
    assert [(row[-4], row[-3], row[-1]) for row in table] == [("-", "-", "-")] * 2 and out.count(line) == 1
    assert cli.main(["plan", "--json", "cluster=untyped", "model=gpt_tiny", "gpus=4"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert (obj["step_time_s"], obj["tokens_per_s_per_gpu"], obj["predicted_mfu"], obj["gpu"]["peak_flops"]) == \
        (None, None, None, None) and obj["mem_per_gpu_gib"] > 0 and obj["gpu"]["type"] == "unknown"
    (typed,) = compose_runs(["cluster=untyped", "cluster.gpu_type=a100", "model=gpt_tiny", "gpus=4"])
    assert hardware_for(typed.config.cluster).peak_flops == 312e12  # a type the GPU table knows: as ever


def test_the_local_clusters_stand_in_is_labelled_wherever_a_figure_is(capsys):
    """The local cluster's virtual GPUs are planned as an H100 (the memory check and the 8 -> 128 story rely on
    it), and every figure of that GPU says it is a stand-in's."""
    (local,) = compose_runs(["model=gpt_tiny", "gpus=2"])
    hw = hardware_for(local.config.cluster)
    assert (hw.gpu_type, hw.stand_in, hw.peak_flops, hw.enforce) == ("H100 stand-in", True, 989e12, True)
    assert cli.main(["plan", "model=gpt_tiny", "gpus=2"]) == 0
    out = capsys.readouterr().out
    assert "GPU: H100 stand-in, 80 GiB (default for cluster local's virtual GPUs); peak bf16 989 TFLOP/s" in out
    said = "step time, tokens/s and MFU: of an H100 stand-in for the virtual GPUs, not this machine's"
    assert out.count(said) == 1
    assert cli.main(["plan", "-m", "model=gpt_tiny", "gpus=2,4"]) == 0
    out = capsys.readouterr().out
    assert "GPU: H100 stand-in 80 GiB" in out and out.count(said) == 1


# --------------------------------------------------------------------------------------------
# The refusal at launch


@pytest.fixture
def submissions(monkeypatch):
    """launcher.submit.submitter.launch replaced by a recorder: nothing can reach Slurm."""
    calls = []
    import launcher.submit.submitter

    monkeypatch.setattr(launcher.submit.submitter, "launch",
                        lambda runs, sweep: calls.append(runs) or launcher.submit.submitter.Launched([]))
    return calls


def test_launch_refuses_a_run_that_cannot_fit(submissions, capsys):
    assert cli.main(["model=gpt_70b", "gpus=8"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: gpt_70b on 8 GPUs") and err.count("\n") == 1
    assert "needs 162.4 GiB per GPU (states 120.8, activations 16.9)" in err and "but the GPU has 80 GiB" in err
    assert "to fit: gpus=24 parallel.sharding=full (73.9 GiB)" in err and "force=true" in err
    assert submissions == []


def test_launch_refuses_before_any_run_of_a_sweep_is_submitted(submissions, capsys):
    assert cli.main(["-m", "model=gpt_tiny,gpt_70b", "gpus=8"]) == 2
    assert "(1 of 2 runs refused; nothing was submitted)" in capsys.readouterr().err
    assert submissions == []


def test_force_true_launches_anyway(submissions, capsys):
    assert cli.main(["model=gpt_70b", "gpus=8", "force=true"]) == 0
    assert len(submissions) == 1
    assert "force=true overrides the refusal" in capsys.readouterr().err


def test_small_models_and_unknown_gpus_are_not_refused(submissions, capsys):
    assert cli.main(["model=gpt_tiny"]) == 0
    assert cli.main(["model=gpt_1b", "gpus=8", "cluster=slurm"]) == 0  # 80 GiB GPUs (on local: the host check)
    # GPU memory unknown (no gpu_memory_gb, no type, no Slurm to ask): no refusal.
    assert cli.main(["model=gpt_70b", "cluster=slurm", "cluster.gpu_memory_gb=null"]) == 0
    # Nothing is said of memory. Checkpoints may outgrow the run root's disk (gpt_70b's 2 x 778 GB, and gpt_1b's
    # 2 x 15.8 GB where this machine has less free): that warning depends on this disk, and
    # tests/unit/test_checkpoint_room.py checks it.
    warnings = capsys.readouterr().err.splitlines()
    assert len(submissions) == 3 and all(w.startswith("warning: checkpoints need ") for w in warnings), warnings


def test_dry_runs_print_the_plan_then_the_refusal_and_exit_2(capsys):
    assert cli.main(["model=gpt_70b", "gpus=8", "dry_run=json"]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out)["model"] == "gpt_70b"  # the plan, whole, then what a launch would refuse
    refused = [line for line in said(err) if not line.startswith("warning: checkpoints need")]
    assert [line.split(" needs ")[0] for line in refused] == [  # its GPUs' memory, and this machine's
        "a launch would be refused: gpt_70b on 8 GPUs (full sharding, full checkpointing, micro-batch 4)",
        "a launch would be refused: gpt_70b on 8 local ranks"]
    assert all("or add force=true to launch anyway" in line for line in refused)
    assert cli.main(["model=gpt_70b", "gpus=8", "dry_run=json", "force=true"]) == 0
    assert "force=true overrides the refusal" in capsys.readouterr().err


# The local cluster's real memory: every rank is a process on this machine


def test_host_memory_is_every_ranks_fp32_need_plus_its_runtime():
    (run,) = compose_runs(["model=gpt_1b", "gpus=16"])
    host = host_memory(run.config, run.plan, capacity=64 * GIB)
    fp32 = dataclasses.replace(run.config, parallel=dataclasses.replace(run.config.parallel, precision="fp32"))
    rank = memory(fp32, run.plan, H100, Assumptions(overhead_gib=RANK_RUNTIME_GIB))
    assert (host.ranks, host.rank.total, host.total) == (16, rank.total, 16 * rank.total)
    assert rank.total > rank.states + rank.activations + RANK_RUNTIME_GIB * GIB  # margin on top
    assert round(host.total / GIB, 1) == 726.8 and not host.fits
    assert host.summary().startswith("gpt_1b on 16 local ranks needs 726.8 GiB of this machine's memory "
                                     "(16 x 45.42 GiB: states 2.45, activations 36.98, runtime 0.35 per rank")
    assert host.summary().endswith("but it has 64.0 GiB (MemTotal)")
    for model, gpus in (("gpt_tiny", 16), ("gpt_small", 16), ("gpt_small", 4)):  # what the tests and demo run
        (small,) = compose_runs([f"model={model}", f"gpus={gpus}"])
        assert host_memory(small.config, small.plan, capacity=8 * GIB).fits, (model, gpus)
    (mid,) = compose_runs(["model=gpt_125m", "gpus=1"])
    assert host_fixes(mid.config, mid.plan, 24 * GIB) == ["train.micro_batch=8 (23.0 GiB)"]


def test_machine_memory_is_memtotal(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24684092 kB\nMemFree:        23000000 kB\nMemAvailable:   24082484 kB\n")
    assert machine_memory(meminfo) == 24684092 * 1024
    assert machine_memory(tmp_path / "absent") is None
    assert machine_memory() > 2**30  # this machine's


def test_launch_refuses_a_run_the_machine_cannot_hold(submissions, capsys):
    """gpt_1b fits the local cluster's stand-in 80 GiB GPUs on 16 ranks, but its ranks need 726.8 GiB of
    this machine's RAM together."""
    assert cli.main(["model=gpt_1b", "gpus=16"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and submissions == []
    assert err.startswith("error: gpt_1b on 16 local ranks needs 726.8 GiB of this machine's memory (16 x 45.42 GiB")
    assert re.search(r"but it has \d+\.\d GiB \(MemTotal\); to fit: .*; or add force=true to launch anyway "
                     r"\(details: 'launcher plan model=gpt_1b gpus=16'\)$", err)
    assert cli.main(["model=gpt_1b", "gpus=16", "force=true"]) == 0 and len(submissions) == 1
    assert "gpt_1b on 16 local ranks needs 726.8 GiB" in (err := capsys.readouterr().err)
    assert "force=true overrides the refusal" in err
    assert cli.main(["model=gpt_1b", "gpus=16", "dry_run=json"]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out)["model"] == "gpt_1b" and "a launch would be refused: gpt_1b on 16 local ranks" in err
    assert cli.main(["-m", "model=gpt_tiny,gpt_small", "gpus=16"]) == 0 and len(submissions) == 2
    assert capsys.readouterr().err == ""


def test_python_m_launcher_refuses_without_submitting(tmp_path):
    env = {**os.environ, "LAUNCHER_RUN_ROOT": str(tmp_path / "runs"),
           "SLURM_CONF": str(tmp_path / "no-such-slurm.conf")}  # a submission could not reach any cluster
    result = run_launcher("model=gpt_70b", "gpus=8", cwd=REPO, env=env, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: gpt_70b on 8 GPUs") and "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()


# --------------------------------------------------------------------------------------------
# Against a real run: FSDP2 on CPU (gloo), launcher/train/'s own model, sharding and optimizer


def test_saved_activations_match_the_formula():
    """What autograd keeps for backward after the forward of launcher/train/model.py's GPT (parameters excluded),
    against the planner's kept part (layers + final norm + fp32 log-probs), in fp32 on CPU: exact."""
    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    from launcher.train.model import GPT

    cfg = ModelConfig(name="t", d_model=64, n_heads=4, n_layers=4, seq_len=128, vocab_size=512)
    for level in ("none", "selective", "full"):
        model = GPT(cfg)
        for i, block in enumerate(model.blocks):
            if level == "full" or (level == "selective" and i % 2 == 0):
                model.blocks[i] = checkpoint_wrapper(block)
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        kept = {}

        def pack(t):
            storage = t.untyped_storage()
            if t.is_floating_point() and storage.data_ptr() not in params:
                kept[storage.data_ptr()] = storage.nbytes()
            return t

        idx, targets = (torch.randint(0, cfg.vocab_size, (3, cfg.seq_len)) for _ in range(2))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(idx, targets)
        parts = activation_components(cfg, 3, level, "fp32")
        # + 4 B: the loss's scalar total weight
        assert sum(kept.values()) == parts["layers"] + parts["final_norm"] + parts["loss_saved"] + 4, level


def test_plan_does_not_import_torch():
    result = run_launcher("plan", "-m", "gpus=8,16", "model=gpt_1b", cwd=REPO, check=True, flags=("-X", "importtime"))
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "launcher.forecast.estimate" in imported and "launcher.compose.composer" in imported
    assert not {name for name in imported if name == "torch" or name.startswith("torch.")}
