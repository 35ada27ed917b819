"""Our GPT as Hugging Face transformers' ``GPT2LMHeadModel``: the one place that knows both.

The architectures are the same (learned positions, pre-norm blocks, LayerNorm, GELU MLP, the output projection
tied to the token embedding) but for biases, which ours has none of: the GPT-2 form gets zero biases, which make
it compute exactly what ours does. GPT-2's linear layers are ``Conv1D``, whose weight is the transpose of a
``Linear``'s. Our MLP uses exact GELU (``F.gelu``), which transformers calls ``gelu``; GPT-2's own default,
``gelu_new``, is the tanh approximation and would not agree.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from launcher.core.config import ModelConfig

LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which launcher/train/model.py keeps


@dataclass(frozen=True)
class Tensor:
    """One tensor of GPT2LMHeadModel's state dict: its name and shape there, and where it comes from in ours
    (``source`` None: a zero bias; ``transposed``: a Linear's weight as Conv1D holds it)."""

    name: str
    shape: Tuple[int, ...]
    source: Optional[str] = None
    transposed: bool = False


def gpt2_tensors(cfg: ModelConfig) -> List[Tensor]:
    """Every tensor GPT2LMHeadModel loads, in its order (the head is tied to ``wte`` and not stored)."""
    d, inner = cfg.d_model, cfg.mlp_ratio * cfg.d_model
    out = [Tensor("transformer.wte.weight", (cfg.vocab_size, d), "tok_emb.weight"),
           Tensor("transformer.wpe.weight", (cfg.seq_len, d), "pos_emb.weight")]
    for i in range(cfg.n_layers):
        hf, ours = f"transformer.h.{i}", f"blocks.{i}"
        out += [Tensor(f"{hf}.ln_1.weight", (d,), f"{ours}.ln1.weight"), Tensor(f"{hf}.ln_1.bias", (d,)),
                Tensor(f"{hf}.attn.c_attn.weight", (d, 3 * d), f"{ours}.attn.qkv.weight", True),
                Tensor(f"{hf}.attn.c_attn.bias", (3 * d,)),
                Tensor(f"{hf}.attn.c_proj.weight", (d, d), f"{ours}.attn.proj.weight", True),
                Tensor(f"{hf}.attn.c_proj.bias", (d,)),
                Tensor(f"{hf}.ln_2.weight", (d,), f"{ours}.ln2.weight"), Tensor(f"{hf}.ln_2.bias", (d,)),
                Tensor(f"{hf}.mlp.c_fc.weight", (d, inner), f"{ours}.mlp.fc.weight", True),
                Tensor(f"{hf}.mlp.c_fc.bias", (inner,)),
                Tensor(f"{hf}.mlp.c_proj.weight", (inner, d), f"{ours}.mlp.proj.weight", True),
                Tensor(f"{hf}.mlp.c_proj.bias", (d,))]
    return out + [Tensor("transformer.ln_f.weight", (d,), "ln_f.weight"), Tensor("transformer.ln_f.bias", (d,))]


def gpt2_config(cfg: ModelConfig, dtype: str, eot: Optional[int]) -> Dict[str, Any]:
    """config.json of the exported model (``dtype``: float32 or bfloat16; ``eot``: the end-of-text token)."""
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": cfg.vocab_size, "n_positions": cfg.seq_len, "n_embd": cfg.d_model, "n_layer": cfg.n_layers,
        "n_head": cfg.n_heads, "n_inner": cfg.mlp_ratio * cfg.d_model, "activation_function": "gelu",
        "layer_norm_epsilon": LAYER_NORM_EPS, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "initializer_range": 0.02, "scale_attn_weights": True, "tie_word_embeddings": True, "use_cache": True,
        "bos_token_id": eot, "eos_token_id": eot, "dtype": dtype,
    }


def generation_config(eot: Optional[int]) -> Dict[str, Any]:
    """generation_config.json: stop at end-of-text, where the run's tokenizer has one."""
    return {"bos_token_id": eot, "eos_token_id": eot}
