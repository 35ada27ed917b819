"""Plan arithmetic: parameter/FLOPs formulas, layouts, batch and micro-batch."""
import json
import re

import pytest

from launcher.core.config import ModelConfig, RunConfig
from launcher.errors import LaunchError
from launcher.core.plan import PLAN, Plan, flops_per_token, parameter_counts, read_plan
from launcher.compose.layout import layout
from launcher.compose.layout import plan_of


def tiny_run(**train) -> RunConfig:
    cfg = RunConfig(model=ModelConfig(name="gpt_tiny", d_model=64, n_heads=2, n_layers=2, seq_len=64, vocab_size=256))
    for key, value in train.items():
        setattr(cfg.train, key, value)
    return cfg


def test_parameter_and_flops_formulas_by_hand():
    model = tiny_run().model
    # block: (4 + 2*4)*64^2 + 2*64 = 49280; 2 blocks + final norm 64
    assert parameter_counts(model) == (98_624, 98_624 + 256 * 64 + 64 * 64)
    assert flops_per_token(model) == 6 * 98_624 + 12 * 2 * 64 * 64


@pytest.mark.parametrize(
    "d, heads, layers, low, high",
    [(768, 12, 12, 0.12e9, 0.13e9), (2048, 16, 24, 1.3e9, 1.35e9), (4096, 32, 32, 6.6e9, 6.8e9), (8192, 64, 80, 64e9, 70e9)],
)
def test_mpt_sizes_have_their_nominal_parameter_counts(d, heads, layers, low, high):
    _, params = parameter_counts(ModelConfig(name="m", d_model=d, n_heads=heads, n_layers=layers))
    assert low < params < high


@pytest.mark.parametrize(
    "gpus, nodes, expected",
    [(1, None, (1, 1)), (3, None, (1, 3)), (8, None, (1, 8)), (16, None, (2, 8)), (24, None, (3, 8)),
     (128, None, (16, 8)), (4, 2, (2, 2)), (16, 4, (4, 4))],
)  # fmt: skip
def test_layout(gpus, nodes, expected):
    assert layout(gpus, nodes, 8, "local") == expected


@pytest.mark.parametrize(
    "gpus, nodes, message",
    [(12, None, "use at most 8 or a multiple of 8 (16, 24, 32, ...)"),
     (6, 4, "cannot be split evenly over layout.nodes=4"),
     (32, 2, "needs 16 GPUs per node; cluster local has 8")],
)  # fmt: skip
def test_layout_errors(gpus, nodes, message):
    with pytest.raises(LaunchError, match=re.escape(message)):
        layout(gpus, nodes, 8, "local")


def test_batch_arithmetic_and_plan_keys():
    cfg = tiny_run(batch_per_gpu=4, micro_batch=2)
    cfg.layout.gpus = 16
    plan = plan_of(cfg)
    assert (plan.nodes, plan.tasks_per_node, plan.world_size) == (2, 8, 16)
    assert (plan.global_batch, plan.micro_batch, plan.grad_accum) == (64, 2, 2)
    assert plan.tokens_per_step == 64 * 64
    assert plan.gpus_per_node == plan.tasks_per_node == 8
    contract = "model gpus nodes tasks_per_node micro_batch micro_batch_auto grad_accum global_batch " \
        "tokens_per_step seq_len params non_embedding_params flops_per_token sharding"
    assert list(plan.to_dict()) == contract.split()  # docs/design-contract.md, "plan.json keys"


def test_plan_json_reads_back_typed(tmp_path):
    plan = plan_of(tiny_run())
    (tmp_path / PLAN).write_text(json.dumps(plan.to_dict()))
    assert read_plan(tmp_path) == plan
    old = {**plan.to_dict(), "world_size": 8, "gpus_per_node": 8}  # properties of a plan, not its keys
    with pytest.raises(ValueError, match="plan.json has keys no plan has: gpus_per_node, world_size"):
        Plan.from_dict(old)
    del old["grad_accum"]
    with pytest.raises(ValueError, match="plan.json lacks grad_accum"):
        Plan.from_dict(old)


def test_explicit_global_batch_must_divide():
    with pytest.raises(LaunchError, match=r"global batch 20 is not divisible by world_size x micro_batch = 8 x 2"):
        plan_of(tiny_run(global_batch=20))


@pytest.mark.parametrize(
    "model, global_batch, expected",
    [("gpt_1b", None, 8),  # gpt_1b.yaml's micro-batch 8 divides the per-rank batch 32
     ("gpt_1b", 24, 3),  # per-rank batch 3: the largest divisor not above 8
     ("no_such_file", 40, 5)],  # no size file: start from the whole per-rank batch
)  # fmt: skip
def test_auto_micro_batch_starts_from_the_model_default(model, global_batch, expected):
    cfg = tiny_run(micro_batch="auto", global_batch=global_batch, batch_per_gpu=32)
    cfg.model.name = model
    plan = plan_of(cfg)
    assert (plan.micro_batch, plan.micro_batch_auto) == (expected, True)
    assert plan.micro_batch * plan.grad_accum * plan.world_size == plan.global_batch
