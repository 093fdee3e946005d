"""Readers and formulas of sliding windows, Gemma-2 and GPT-NeoX (the measured side is in
tests/measure/test_archs_b.py)."""

from __future__ import annotations

import pytest
import sympy

import vrammath as vm
from vrammath.model.params import param_count, size_values
from vrammath.model.presets import load_model
from vrammath.model.readers import from_hf_config
from vrammath.notation.errors import InputError
from vrammath.notation.symbols import b, s, w_win
from vrammath.serve.kv_cache import kv_cache_bytes
from vrammath.terms.activations.layer import hf_layer_terms, window_reached
from vrammath.terms.activations.model import hf_activation_bytes

SMALL_GEMMA2 = {
    "model_type": "gemma2",
    "hidden_size": 72,
    "intermediate_size": 130,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 20,
    "vocab_size": 999,
    "sliding_window": 16,
}


@pytest.mark.parametrize(
    ("preset", "exact", "published"),
    [
        ("gemma-2-9b", 9_241_705_984, "9.24"),  # model card, billions
        ("gemma-2-27b", 27_227_128_320, "27.2"),
        ("gpt-neox-20b", 20_554_567_680, "20.55"),  # Black et al. 2022
        ("gemma-3-27b-text", 27_009_346_304, "27.0"),  # the card's 27.4B adds the vision tower
    ],
)
def test_preset_param_counts(preset: str, exact: int, published: str) -> None:
    n = param_count(load_model(preset))
    assert n == exact
    assert round(n / 1e9, len(published.split(".")[1])) == float(published)


def test_gemma2_preset_parts() -> None:
    spec = load_model("gemma-2-9b")
    att = spec.attention
    assert (att.head_dim, att.softcap, att.sliding_window) == (256, 50.0, 4096)
    assert (att.window_layers, att.last_layer_slides) == (21, False)  # 42 layers alternate
    assert (spec.embeddings.logit_softcap, spec.embeddings.tied) == (30.0, True)
    assert (spec.norms.placement, spec.norms.unit_offset) == ("sandwich", True)
    assert spec.warnings == ()


def test_gpt_neox_preset_parts() -> None:
    spec = load_model("gpt-neox-20b")
    assert (spec.attention.rotary_dim, spec.attention.fused_qkv) == (24, True)
    assert (spec.norms.parallel_residual, spec.norms.kind) == (True, "layernorm")
    assert (spec.mlp.activation, spec.mlp.gated) == ("gelu_fast", False)
    assert spec.warnings == ()


def test_window_reached_switches_at_the_window() -> None:
    assert [window_reached().subs({s: n, w_win: 16}) for n in (15, 16, 17)] == [0, 1, 1]


def test_mistral_sdpa_at_the_window_repeats_kv_and_keeps_a_mask() -> None:
    spec = load_model("mistral-7b")
    values = {**size_values(spec), b: 1}
    below = hf_activation_bytes(spec, "sdpa", "bf16").subs({**values, s: 4095})
    at = hf_activation_bytes(spec, "sdpa", "bf16").subs({**values, s: 4096})
    plain = hf_activation_bytes(spec, "sdpa", "bf16").subs({**values, s: 4096, w_win: 10**6})
    # per layer: K and V at 32 heads instead of 8 (2 * 2 * s * 128 * 24) and a bf16 (s, s) mask
    assert at - plain == 32 * (2 * 2 * 4096 * 128 * 24 + 2 * 4096**2)
    assert below < plain  # below the window nothing changes but s
    # eager keeps the same tensors with or without a window
    e_at = hf_activation_bytes(spec, "eager", "bf16").subs({**values, s: 4096})
    assert e_at == hf_activation_bytes(spec, "eager", "bf16").subs(
        {**values, s: 4096, w_win: 10**6}
    )


def test_qwen2_window_layers_only_the_top_ones() -> None:
    cfg = {
        "model_type": "qwen2",
        "hidden_size": 80,
        "intermediate_size": 136,
        "num_hidden_layers": 3,
        "num_attention_heads": 5,
        "num_key_value_heads": 1,
        "vocab_size": 777,
        "use_sliding_window": True,
        "sliding_window": 16,
        "max_window_layers": 1,
    }
    spec = from_hf_config(cfg)
    assert spec.attention.window_layers == 2
    # serving: the two windowed layers hold 16 tokens, the global one the whole context
    full = kv_cache_bytes(spec, 1, 100, window_layers=0)
    windowed = kv_cache_bytes(spec, 1, 100)
    assert full - windowed == 2 * 2 * 1 * 16 * (100 - 16) * 2


def test_gemma2_sdpa_is_refused_with_softcapping() -> None:
    spec = from_hf_config(SMALL_GEMMA2)
    with pytest.raises(InputError, match="attn_logit_softcapping"):
        hf_layer_terms(spec, "sdpa", "bf16")
    no_cap = from_hf_config({**SMALL_GEMMA2, "attn_logit_softcapping": None})
    assert no_cap.attention.softcap is None
    assert sympy.Add(*hf_layer_terms(no_cap, "sdpa", "bf16").values()) != 0


def test_gemma2_eager_layer_terms() -> None:
    from vrammath.notation.symbols import I, a, d, h

    spec = from_hf_config(SMALL_GEMMA2)
    terms = hf_layer_terms(spec, "eager", "bf16")
    # four fp32 norms (input and normalised copies, inverse RMS, 1 + weight), softcap's tanh
    assert terms["norms"] == 4 * (8 * s * b * h + 4 * b * s + 4 * h)
    assert terms["scores"] == (4 + 2 + 2) * a * s**2 * b
    assert terms["mlp"] == 8 * s * b * I
    assert terms["qkv"] == 2 * s * b * d * 3 * a


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("sliding_window", 0, "sliding_window"),
        ("layer_types", ["sliding_attention"], "layer_types"),
        ("hidden_activation", "relu", "hidden_activation"),
        ("attn_logit_softcapping", -1, "attn_logit_softcapping"),
        ("use_bidirectional_attention", True, "use_bidirectional_attention"),
        ("attention_dropout", 0.1, "attention_dropout"),
    ],
)
def test_gemma2_bad_input(key: str, value: object, match: str) -> None:
    with pytest.raises(InputError, match=match):
        from_hf_config({**SMALL_GEMMA2, key: value})


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("rotary_pct", 0, "rotary_pct"),
        ("rotary_pct", 0.01, "rotary_pct"),
        ("hidden_dropout", 0.1, "hidden_dropout"),
        ("num_attention_heads", 7, "num_attention_heads"),
        ("hidden_act", "relu", "hidden_act"),
    ],
)
def test_gpt_neox_bad_input(key: str, value: object, match: str) -> None:
    cfg = {
        "model_type": "gpt_neox",
        "hidden_size": 72,
        "intermediate_size": 200,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "vocab_size": 999,
    }
    with pytest.raises(InputError, match=match):
        from_hf_config({**cfg, key: value})


def test_gemma2_estimate_runs_with_eager() -> None:
    spec = load_model("gemma-2-9b")
    est = vm.estimate(vm.Setup(spec, attention="eager", micro_batch=1, seq_len=8192))
    assert est.gpu_bytes > param_count(spec) * 16  # mixed-precision AdamW states and more
    with pytest.raises(InputError, match="attn_logit_softcapping"):
        vm.estimate(vm.Setup(spec, attention="sdpa"))


def test_gemma3_preset_parts() -> None:
    spec = load_model("gemma-3-27b-text")
    att = spec.attention
    # one global layer in six: layers 5, 11, ..., 59 are global, the top one (61) slides
    assert (att.window_layers, att.last_layer_slides, att.sliding_window) == (52, True, 1024)
    assert (att.qk_norm, att.softcap, spec.embeddings.logit_softcap) == ("head", None, None)
    assert spec.vocab == 262208
    assert spec.warnings == ()


def test_gemma_v1_reads_legacy_gelu_as_tanh() -> None:
    spec = from_hf_config(
        {
            "model_type": "gemma",
            "hidden_size": 88,
            "intermediate_size": 150,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 24,
            "vocab_size": 555,
            "hidden_act": "gelu",
        }
    )
    assert (spec.mlp.activation, spec.norms.unit_offset, spec.norms.placement) == (
        "gelu_pytorch_tanh",
        True,
        "pre",
    )
