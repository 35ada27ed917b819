"""Our GPT and its tokenizer as Hugging Face transformers loads them (``GPT2LMHeadModel``, ``AutoTokenizer``):
the one place that knows both sides.

The architectures are the same (learned positions, pre-norm blocks, LayerNorm, GELU MLP, the output projection
tied to the token embedding) but for biases, which ours has none of: the GPT-2 form gets zero biases, which make
it compute exactly what ours does. GPT-2's linear layers are ``Conv1D``, whose weight is the transpose of a
``Linear``'s. Our MLP uses exact GELU (``F.gelu``), which transformers calls ``gelu``; GPT-2's own default,
``gelu_new``, is the tanh approximation and would not agree.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from launcher.core.config import ModelConfig
from launcher.core.dataset import BYTE_VOCAB, END_OF_TEXT, TOKENIZER_FILE

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


def save_tokenizer(directory: Path, source: Optional[Path], eot: Optional[int], max_length: int) -> List[str]:
    """Write the run's tokenizer as ``transformers.AutoTokenizer.from_pretrained(directory)`` loads it: its
    dataset's tokenizer.json (``source``; for byte-level data, which has none, one made here: 256 tokens, id =
    byte value) with tokenizer_config.json and special_tokens_map.json. Returns the files' names."""
    from tokenizers import Tokenizer  # lazy: keeps tokenizers out of start-up

    hf = Tokenizer.from_file(str(source)) if source is not None else byte_tokenizer()
    hf.save(str(directory / TOKENIZER_FILE))
    special = {"eos_token": END_OF_TEXT, "bos_token": END_OF_TEXT} \
        if eot is not None and hf.id_to_token(eot) == END_OF_TEXT else {}
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length,
         "clean_up_tokenization_spaces": False, **special}, indent=2))
    (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=2))
    return [TOKENIZER_FILE, "tokenizer_config.json", "special_tokens_map.json"]


def byte_tokenizer() -> Any:
    """Byte-level text as a tokenizers Tokenizer: every byte its own token, id = the byte's value (GPT-2's
    printable stand-in characters for bytes name them), no merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # lazy: keeps tokenizers out of start-up

    hf = Tokenizer(models.BPE(vocab={char: byte for byte, char in byte_chars().items()}, merges=[]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    hf.decoder = decoders.ByteLevel()
    return hf


def byte_chars() -> Dict[int, str]:
    """GPT-2's map of each byte to a printable character, as the ByteLevel pre-tokenizer and decoder use it:
    printable Latin-1 bytes stand for themselves, the others for characters from U+0100 on."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {byte: chr(byte) for byte in kept}, 0
    for byte in range(BYTE_VOCAB):
        if byte not in chars:
            chars[byte] = chr(BYTE_VOCAB + extra)
            extra += 1
    return chars
