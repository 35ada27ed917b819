"""The model: its size is the contract's formula, it builds on meta, and it is causal."""
import math

import pytest
import torch

from launcher.core.config import ModelConfig
from launcher.core.plan import parameter_counts
from launcher.train.model import GPT

CONFIGS = [
    ModelConfig(name="a", d_model=32, n_heads=2, n_layers=2, seq_len=16, vocab_size=256),
    ModelConfig(name="b", d_model=48, n_heads=3, n_layers=3, seq_len=40, vocab_size=300, mlp_ratio=2),
    ModelConfig(name="c", d_model=768, n_heads=12, n_layers=12, seq_len=2048, vocab_size=50304),  # gpt_125m
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
def test_parameter_count_is_the_contract_formula(cfg):
    with torch.device("meta"):
        model = GPT(cfg)
    non_embedding, params = parameter_counts(cfg)
    assert sum(p.numel() for p in model.parameters()) == params
    embeddings = model.tok_emb.weight.numel() + model.pos_emb.weight.numel()
    assert sum(p.numel() for p in model.parameters()) - embeddings == non_embedding


def test_gpt_125m_by_hand():
    # 12 blocks of (qkv 3d^2 + out d^2 + mlp 8d^2 + 2 LayerNorms of d), final LayerNorm, V*d and T*d embeddings.
    d = 768
    non_embedding = 12 * (3 * d * d + d * d + 8 * d * d + 2 * d) + d
    assert non_embedding == 84_953_856
    assert parameter_counts(CONFIGS[2]) == (non_embedding, non_embedding + 50304 * d + 2048 * d)
    assert parameter_counts(CONFIGS[2]) == (84_953_856, 125_160_192)


def test_meta_then_to_empty_then_init_equals_direct_build():
    cfg = CONFIGS[1]
    direct = GPT(cfg)
    direct.init_weights(seed=7)
    with torch.device("meta"):
        lazy = GPT(cfg)
    assert all(p.is_meta for p in lazy.parameters())
    lazy.to_empty(device="cpu")
    lazy.init_weights(seed=7)
    for (name, a), (_, b) in zip(direct.named_parameters(), lazy.named_parameters()):
        assert torch.equal(a, b), name
    other = GPT(cfg)
    other.init_weights(seed=8)
    assert not torch.equal(other.tok_emb.weight, direct.tok_emb.weight)


def test_init_scales():
    cfg = ModelConfig(name="d", d_model=256, n_heads=4, n_layers=8, seq_len=64, vocab_size=512)
    model = GPT(cfg)
    block = model.blocks[0]
    assert torch.equal(block.ln1.weight, torch.ones(256)) and torch.equal(model.ln_f.weight, torch.ones(256))
    assert model.tok_emb.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert block.mlp.fc.weight.std().item() == pytest.approx(0.02, rel=0.05)
    residual = 0.02 / math.sqrt(2 * cfg.n_layers)
    assert block.attn.proj.weight.std().item() == pytest.approx(residual, rel=0.05)
    assert block.mlp.proj.weight.std().item() == pytest.approx(residual, rel=0.05)
    assert all(m.bias is None for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.LayerNorm)))


def test_causal_and_tied():
    torch.manual_seed(0)
    cfg = CONFIGS[0]
    model = GPT(cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % cfg.vocab_size
    logits, logits_changed = model(idx), model(changed)
    assert logits.shape == (2, cfg.seq_len, cfg.vocab_size)
    assert torch.allclose(logits[:, :10], logits_changed[:, :10], atol=1e-6)
    assert not torch.allclose(logits[:, 10:], logits_changed[:, 10:])
    # Output projection is the token embedding: one matrix in the state dict.
    assert "lm_head.weight" not in model.state_dict()
    targets = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    loss = model(idx, targets)
    assert loss.item() == pytest.approx(math.log(cfg.vocab_size), rel=0.05)  # near uniform at init
    with pytest.raises(ValueError, match="longer than seq_len"):
        model(torch.zeros(1, cfg.seq_len + 1, dtype=torch.long))
