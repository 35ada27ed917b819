"""Peak GPU memory per rank: the model's tensors as FSDP2 shards them, the training state, gathered
units, gradient buffers and activations (docs/planning.md, "Memory"). The model follows what
launcher/train/parallel.py and launcher/train/loop.py do; tests/cluster/training/test_planner.py checks the
training-state part byte for byte against a real run."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence

from launcher.core.config import ModelConfig, RunConfig, checkpointed
from launcher.core.plan import Plan, divisors, param_shapes
from launcher.forecast.target import GIB, Assumptions, TargetGpu, dtype_bytes, precision_of


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def shard_numel(shape: Sequence[int], shards: int, index: int = 0) -> int:
    """Elements of shard ``index`` of ``shards`` as FSDP2 cuts a tensor: ``torch.chunk`` on dim 0
    (chunks of ceil(rows/shards) rows, the last ones shorter or empty)."""
    rows = shape[0]
    chunk = -(-rows // shards)
    return max(0, min(chunk, rows - index * chunk)) * _numel(shape[1:])


def local_param_numel(model: ModelConfig, shards: int, index: int = 0) -> int:
    """Parameter elements on shard ``index`` (rank 0's shard is the largest)."""
    root, block = param_shapes(model)
    return sum(shard_numel(s, shards, index) for s in root) + model.n_layers * sum(
        shard_numel(s, shards, index) for s in block)


def shard_group(plan: Plan, sharding: str) -> int:
    """Ranks that one parameter is sharded over: the world, or one node's ranks for hybrid."""
    return plan.tasks_per_node if sharding == "hybrid" else plan.world_size


def checkpointed_blocks(n_layers: int, level: str) -> int:
    """Blocks wrapped by checkpoint_wrapper at ``level`` (launcher.core.config.checkpointed)."""
    return sum(checkpointed(level, block) for block in range(n_layers))


# ----------------------------------------------------------------------------------------------
# Memory


@dataclass(frozen=True)
class Term:
    """A number and the formula that produced it, written where the number is computed, so that what
    ``launcher plan`` prints beside a figure is the arithmetic that made it."""

    value: int
    formula: str


def activation_terms(model: ModelConfig, micro_batch: int, level: str, precision: str) -> Dict[str, Term]:
    """Activation bytes of one micro-batch on one GPU, by part (docs/planning.md, "Activations").

    Korthikanti et al. 2022 count s*b*h*(34 + 5*a*s/h) bytes per layer in 16-bit. This model has
    no dropout (no masks: -2*s*b*h - a*s^2*b) and attention runs in SDPA (flash), which keeps a
    fp32 log-sum-exp (4*a*s*b) instead of the scores and softmax (-4*a*s^2*b), and whose output
    is the output projection's input (no copy). That leaves s*b*h*(8 + 2r) values per layer
    (32*s*b*h bytes at r = 4 in 16-bit: norm inputs and outputs 4, q k v 3, attention output 1,
    MLP hidden before and after GELU 2r), plus the log-sum-exp and 16*s*b bytes of LayerNorm
    statistics. A checkpointed block keeps only its input, and one block's activations are
    rebuilt at a time in backward. The loss keeps fp32 log-probabilities (4*s*b*V, Korthikanti
    §4.1) and, in its backward, their gradient and the input's (8*s*b*V more).
    """
    s, h, a, r, n_layers, vocab = (model.seq_len, model.d_model, model.n_heads, model.mlp_ratio, model.n_layers,
                                   model.vocab_size)
    act = dtype_bytes(precision)
    tokens = s * micro_batch
    layer = tokens * h * (8 + 2 * r) * act + 4 * a * tokens + 16 * tokens
    layer_text = f"s*b*h*{(8 + 2 * r) * act} + 4*a*s*b + 16*s*b B"
    kept = checkpointed_blocks(n_layers, level)
    return {
        "layers": Term((n_layers - kept) * layer + kept * tokens * h * act,
                       f"{n_layers - kept} x layer ({layer_text}) + {kept} checkpointed x s*b*h*{act} B"),
        "recompute": Term(layer if kept else 0, "one layer rebuilt at a time in backward" if kept else "none"),
        "final_norm": Term(2 * tokens * h * act + 8 * tokens, f"2*s*b*h*{act} + 8*s*b B"),
        "loss_saved": Term(4 * tokens * vocab, "4*s*b*V B fp32 log-probs"),
        "loss_transient": Term(8 * tokens * vocab, "8*s*b*V B more in the loss's backward"),
    }


def activation_components(model: ModelConfig, micro_batch: int, level: str, precision: str) -> Dict[str, int]:
    return {name: term.value for name, term in activation_terms(model, micro_batch, level, precision).items()}


def activation_bytes(model: ModelConfig, micro_batch: int, level: str, precision: str) -> int:
    return sum(activation_components(model, micro_batch, level, precision).values())


@dataclass(frozen=True)
class Memory:
    """Bytes per GPU at the peak (the start of backward), by part; ``total`` includes the margin.
    ``formulas`` holds, by part, the formula each was computed with."""

    params: int  # fp32 parameter shards (FSDP2 keeps the original dtype; bf16 is cast for the all-gather)
    grads: int  # fp32 gradient shards
    optimizer: int  # AdamW exp_avg + exp_avg_sq (fp32 shards) + one fp32 step count per tensor
    gathered: int  # all-gathered units in the compute dtype (transient)
    grad_buffers: int  # unsharded gradients before their reduce-scatter (transient, within one micro-batch)
    activations: int
    margin: int
    total: int
    capacity: int
    formulas: Dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def states(self) -> int:
        return self.params + self.grads + self.optimizer

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity


def memory(cfg: RunConfig, plan: Plan, hw: TargetGpu, opts: Assumptions, micro_batch: Optional[int] = None) -> Memory:
    """Peak memory per GPU of ``cfg`` laid out as ``plan`` (optionally at another micro-batch).

    grad_accum does not enter: every micro-batch's gradients are reduce-scattered into the
    sharded fp32 gradients (launcher/train/loop.py), so nothing unsharded outlives a micro-batch."""
    model, sharding = cfg.model, cfg.parallel.sharding
    micro_batch = micro_batch or plan.micro_batch
    precision = precision_of(cfg)
    cb = dtype_bytes(precision)
    root, block = param_shapes(model)
    root_numel, block_numel = sum(map(_numel, root)), sum(map(_numel, block))
    total_numel = root_numel + model.n_layers * block_numel
    n = shard_group(plan, sharding)
    local = local_param_numel(model, n)
    shard = f"/ {n}" if n > 1 else "(1 GPU)"
    tensors = len(root) + model.n_layers * len(block)
    if sharding == "grad_op":  # reshard_after_forward=False: every unit stays gathered until its backward
        gathered = Term(cb * total_numel, f"{cb} B x P (grad_op: all units stay gathered)")
    else:  # the root (embedding, used again by the head) for the whole pass, a block and the prefetched next
        gathered = Term(cb * (root_numel + 2 * block_numel),
                        f"{cb} B x (root {root_numel:,} + 2 x block {block_numel:,})")
    level = cfg.parallel.activation_checkpointing
    terms = {
        "params": Term(4 * local, f"4 B x P {shard} (fp32 shards)"),
        "grads": Term(4 * local, f"4 B x P {shard} (fp32 shards)"),
        "optimizer": Term(8 * local + 4 * tensors, f"8 B x P {shard} (m, v fp32) + 4 B x {tensors} tensors"),
        "gathered": gathered,
        # The root's gradient (tied embedding, produced first in backward by the head) lives through backward;
        # a block's unsharded gradient and its fp32 reduce-scatter input exist while it is reduced.
        "grad_buffers": Term(cb * root_numel + (cb + 4) * block_numel, f"{cb} B x root + ({cb} + 4) B x block"),
        "activations": Term(activation_bytes(model, micro_batch, level, precision),
                            f"micro-batch {micro_batch}, {level} checkpointing, by part below"),
    }
    need = sum(term.value for term in terms.values())
    terms["margin"] = Term(int(opts.margin * need + opts.overhead_gib * GIB),
                           f"{100 * opts.margin:g}% + {opts.overhead_gib:g} GiB")
    return Memory(**{name: term.value for name, term in terms.items()}, total=need + terms["margin"].value,
                  capacity=int(hw.memory_gib * GIB), formulas={name: term.formula for name, term in terms.items()})


def max_micro_batch(cfg: RunConfig, plan: Plan, hw: TargetGpu, opts: Assumptions) -> int:
    """The largest micro-batch dividing the per-GPU batch that fits; 0 if none does (memory grows
    with the micro-batch and not with grad_accum, so if micro-batch 1 does not fit, nothing does)."""
    fitting = [m for m in divisors(plan.per_rank_batch) if memory(cfg, plan, hw, opts, m).fits]
    return max(fitting, default=0)


def micro_batch_limit(cfg: RunConfig, plan: Plan, hw: TargetGpu, opts: Assumptions) -> int:
    """The largest micro-batch memory allows, whatever the batch size (0: none)."""
    one = memory(cfg, plan, hw, opts, 1)
    per_sample = activation_bytes(cfg.model, 1, cfg.parallel.activation_checkpointing, precision_of(cfg))
    fixed = one.total - one.margin - per_sample
    usable = (one.capacity - opts.overhead_gib * GIB) / (1 + opts.margin)
    return max(0, int((usable - fixed) // per_sample))


