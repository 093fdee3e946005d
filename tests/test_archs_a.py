"""Qwen3, OLMo-2, Phi-3 / Phi-4 and StarCoder2: readers, parameter counts, activations, LoRA, KV."""

from __future__ import annotations

import pytest
import sympy

from vrammath.model.params import param_count, size_values, tensors
from vrammath.model.presets import load_model
from vrammath.model.readers import from_hf_config
from vrammath.notation.errors import InputError
from vrammath.notation.symbols import I, a, a_kv, b, d, h, s
from vrammath.serve.kv_cache import kv_bytes_per_token
from vrammath.terms.activations.layer import hf_layer_bytes, hf_layer_terms, qk_norm_bytes
from vrammath.terms.activations.model import hf_activation_terms
from vrammath.terms.lora.adapters import lora_param_count
from vrammath.terms.lora.linears import adapted_linears

BASE: dict[str, object] = {
    "hidden_size": 72,
    "intermediate_size": 100,
    "num_hidden_layers": 3,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "vocab_size": 131,
}


def cfg(model_type: str, **extra: object) -> dict[str, object]:
    return {"model_type": model_type, **BASE, **extra}


# Presets: (exact total, the model card's figure in billions). The exact totals equal
# transformers' own count on the meta device (tests/measure/test_archs_a.py).
PRESETS = {
    "qwen3-8b": (8_190_735_360, "8.2"),
    "qwen3-32b": (32_762_123_264, "32.8"),
    "phi-3-mini": (3_821_079_552, "3.8"),
    "phi-3-medium": (13_960_238_080, "14"),
    "phi-4": (14_659_507_200, "14.7"),
    "olmo-2-7b": (7_298_617_344, "7.3"),
    "starcoder2-15b": (15_655_899_136, "15"),  # the card's "15B" cuts 15.66B
}


@pytest.mark.parametrize(("name", "total", "card"), [(n, *v) for n, v in PRESETS.items()])
def test_presets_exact_and_published(name: str, total: int, card: str) -> None:
    spec = load_model(name)
    assert spec.warnings == ()
    count = param_count(spec)
    assert count == total
    decimals = len(card.split(".")[1]) if "." in card else 0
    unit = 10 ** (9 - decimals)
    cut = f"{count // unit / 10**decimals:.{decimals}f}"
    assert card in {f"{count / 1e9:.{decimals}f}", cut}


def test_phi_3_mini_is_the_published_3_82b() -> None:
    assert f"{param_count(load_model('phi-3-mini')) / 1e9:.2f}" == "3.82"


def test_qwen3_reader() -> None:
    spec = from_hf_config(cfg("qwen3", attention_bias=True))
    assert spec.attention.qk_norm == "head"
    assert spec.attention.head_dim == 128  # transformers' Qwen3Config default, not 72 / 6
    assert (spec.attention.qkv_bias, spec.attention.o_bias) == (True, True)
    assert from_hf_config(cfg("qwen3", head_dim=20)).head_dim == 20
    names = [t.name for t in tensors(spec)]
    assert "self_attn.q_norm.weight" in names
    assert "self_attn.o_proj.bias" in names
    with pytest.raises(InputError, match="use_sliding_window: must be false"):
        from_hf_config(cfg("qwen3", use_sliding_window=True))
    with pytest.raises(InputError, match="layer_types"):
        from_hf_config(cfg("qwen3", layer_types=["sliding_attention"] * 3))
    assert from_hf_config(cfg("qwen3", attention_dropout=0.1)).attention.dropout == 0.1
    assert from_hf_config(cfg("qwen3", my_key=1)).warnings == (
        "my_key: unknown to the qwen3 reader, ignored (it may change memory)",
    )


def test_olmo2_reader_and_norm_tensors() -> None:
    spec = from_hf_config(cfg("olmo2"))
    assert spec.attention.qk_norm == "projection"
    assert spec.norms.placement == "post"
    shapes = {t.name: t.shape for t in tensors(spec)}
    assert shapes["self_attn.q_norm.weight"] == (a * d,)
    assert shapes["self_attn.k_norm.weight"] == (a_kv * d,)
    assert "post_feedforward_layernorm.weight" in shapes
    assert "input_layernorm.weight" not in shapes


def test_phi3_reader_fused_projections() -> None:
    spec = from_hf_config(cfg("phi3", sliding_window=2047))
    assert spec.attention.fused_qkv_linear
    assert spec.mlp.fused_gate_up
    assert spec.sliding_window == 2047
    shapes = {t.name: t.shape for t in tensors(spec)}
    assert shapes["self_attn.qkv_proj.weight"] == ((a + 2 * a_kv) * d, h)
    assert shapes["mlp.gate_up_proj.weight"] == (2 * I, h)
    for key in ("resid_pdrop", "embd_pdrop"):
        with pytest.raises(InputError, match=key):
            from_hf_config(cfg("phi3", **{key: 0.1}))
    with pytest.raises(InputError, match="partial_rotary_factor"):
        from_hf_config(cfg("phi3", partial_rotary_factor=0.75))
    with pytest.raises(InputError, match="attention_bias"):
        from_hf_config(cfg("phi3", attention_bias=True))


def test_starcoder2_reader() -> None:
    spec = from_hf_config(cfg("starcoder2"))
    assert spec.norms.kind == "layernorm"
    assert not spec.mlp.gated
    assert spec.mlp.bias
    assert spec.tied_embeddings
    names = {t.name for t in tensors(spec)}
    assert {"mlp.c_fc.bias", "input_layernorm.bias", "self_attn.o_proj.bias"} <= names
    drop = from_hf_config(
        cfg("starcoder2", attention_dropout=0.1, residual_dropout=0.2, embedding_dropout=0.3)
    )
    assert drop.attention.dropout == 0.1
    assert (drop.attention.output_dropout, drop.mlp.dropout) == (0.2, 0.2)
    assert drop.embeddings.dropout == 0.3
    with pytest.raises(InputError, match="residual_dropout"):
        from_hf_config(cfg("starcoder2", residual_dropout=1.5))
    with pytest.raises(InputError, match="hidden_act"):
        from_hf_config(cfg("starcoder2", hidden_act="gelu_new"))
    with pytest.raises(InputError, match="norm_type"):
        from_hf_config(cfg("starcoder2", norm_type="rms_norm"))
    spec15 = load_model("starcoder2-15b")
    assert spec15.sliding_window == 4096
    assert spec15.attention.dropout == 0.1


def test_qk_norm_terms() -> None:
    qwen3 = from_hf_config(cfg("qwen3"))
    assert qk_norm_bytes(qwen3, "fp32") == sympy.expand(
        8 * s * b * (a + a_kv) * d + 4 * s * b * (a + a_kv)
    )
    llama = from_hf_config(cfg("llama", head_dim=128))
    extra = hf_layer_bytes(qwen3, "sdpa", "bf16") - hf_layer_bytes(llama, "sdpa", "bf16")
    assert sympy.expand(extra - qk_norm_bytes(qwen3, "bf16")) == 0
    olmo2 = from_hf_config(cfg("olmo2"))
    # OLMo-2's norms multiply the fp32 normalised tensor: 4 bytes whatever the precision
    assert hf_layer_terms(olmo2, "sdpa", "bf16")["norms"] == 2 * (8 * s * b * h + 4 * b * s)
    assert hf_activation_terms(olmo2)["rope"] == 8 * s * d


def test_phi3_sdpa_keeps_the_fused_qkv_output() -> None:
    phi3 = from_hf_config(cfg("phi3"))
    llama = from_hf_config(cfg("llama"))
    extra = hf_layer_bytes(phi3, "sdpa", "bf16") - hf_layer_bytes(llama, "sdpa", "bf16")
    assert sympy.expand(extra - 2 * s * b * ((a + a_kv) * d + a * d)) == 0
    assert hf_layer_bytes(phi3, "eager", "fp32") == hf_layer_bytes(llama, "eager", "fp32")
    # under autocast one fused linear keeps one 16-bit copy of its input, not three (two)
    auto = hf_layer_terms(phi3, "sdpa", "autocast-bf16")["inputs"]
    assert auto == 4 * s * b * h


def test_starcoder2_plain_mlp_terms() -> None:
    spec = from_hf_config(cfg("starcoder2"))
    terms = hf_layer_terms(spec, "sdpa", "bf16", device="cpu")
    assert terms["mlp"] == 4 * s * b * I  # GeLU-tanh input and output, 2 bytes each
    assert terms["norms"] == 2 * (2 * s * b * h + 4 * b * s)


def test_starcoder2_dropout_terms() -> None:
    spec = from_hf_config(
        cfg("starcoder2", attention_dropout=0.1, residual_dropout=0.1, embedding_dropout=0.1)
    )
    plain = from_hf_config(cfg("starcoder2"))
    extra = hf_layer_bytes(spec, "eager", "bf16") - hf_layer_bytes(plain, "eager", "bf16")
    # CUDA: a bool mask per dropout; the dropped-out probabilities beside the softmax output
    assert sympy.expand(extra - (a * s**2 * b + 2 * s * b * h)) == 0
    assert hf_activation_terms(spec)["embedding_dropout"] == s * b * h
    # a CPU's SDPA runs the math kernel: fp32 Q, K, V at a heads and 12 bytes per score
    cpu = hf_layer_terms(spec, "sdpa", "bf16", device="cpu")
    assert (cpu["qkv"], cpu["scores"]) == (12 * s * b * a * d, 12 * a * s**2 * b)
    # under autocast the probabilities are fp32 when dropped: a fp32 noise on a CPU
    auto = hf_layer_terms(spec, "eager", "autocast-bf16", device="cpu")
    assert auto["scores"] == 10 * a * s**2 * b


def test_lora_fused_targets() -> None:
    phi3 = from_hf_config(cfg("phi3"))
    mods = [(m.module, m.in_features, m.out_features) for m in adapted_linears(phi3, "qkv,o")]
    assert mods == [
        ("self_attn.qkv_proj", h, (a + 2 * a_kv) * d),
        ("self_attn.o_proj", a * d, h),
    ]
    values = size_values(phi3)
    r = 8
    # qkv adapts the whole fused qkv_proj: r (h + (a + 2 a_kv) d); q alone does not exist
    assert lora_param_count(phi3, r, "qkv") == 3 * r * (72 + 120)
    assert lora_param_count(phi3, r, "mlp") == 3 * r * (72 + 200 + 100 + 72)
    with pytest.raises(InputError, match="^lora_targets: must be one of qkv, o, gate_up, down"):
        adapted_linears(phi3, "q")
    assert values[d] == 12
    star = from_hf_config(cfg("starcoder2"))
    assert [m.module for m in adapted_linears(star, "up,down")] == ["mlp.c_fc", "mlp.c_proj"]
    with pytest.raises(InputError, match="lora_targets"):
        adapted_linears(star, "gate")


def test_kv_cache_per_token() -> None:
    # 2 (K, V) x layers x KV heads x head_dim x 2 bytes
    assert kv_bytes_per_token(load_model("qwen3-8b")) == 2 * 36 * 8 * 128 * 2
    assert kv_bytes_per_token(load_model("phi-3-mini")) == 2 * 32 * 32 * 96 * 2
    assert kv_bytes_per_token(load_model("olmo-2-7b")) == 2 * 32 * 32 * 128 * 2
    assert kv_bytes_per_token(load_model("starcoder2-15b")) == 2 * 40 * 4 * 128 * 2
