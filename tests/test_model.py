"""ModelSpec from config.json: presets, fields honoured, and every kind of bad input refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vrammath.errors import InputError
from vrammath.model import from_hf_config
from vrammath.presets import load_config_file, load_model, model_names, parse_config_text

BASE = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 100,
}


def test_presets_load() -> None:
    names = model_names()
    for required in (
        "llama-7b",
        "llama-2-7b",
        "llama-2-70b",
        "mistral-7b",
        "qwen2-7b",
        "qwen2-72b",
        "gpt-22b",
        "gpt-175b",
        "gpt-530b",
        "gpt-1t",
    ):
        assert required in names
    assert load_model("mistral-7b").sliding_window == 4096
    assert load_model("qwen2-72b").kv_heads == 8
    assert load_model("qwen2-72b").qkv_bias
    assert load_model("gpt-175b").tied_embeddings
    assert load_model("gpt-175b").intermediate == 4 * 12288


def test_current_presets_fields() -> None:
    """Llama-3.1 (rope_scaling llama3), Mistral-7B-v0.3 (no sliding window) and Qwen2.5 presets."""
    for name, layers in (("llama-3.1-8b", 32), ("llama-3.1-70b", 80), ("llama-3.1-405b", 126)):
        spec = load_model(name)
        assert (spec.layers, spec.kv_heads, spec.vocab) == (layers, 8, 128256)
        assert (spec.max_positions, spec.tied_embeddings, spec.qkv_bias) == (131072, False, False)
    mistral = load_model("mistral-7b-v0.3")
    assert (mistral.vocab, mistral.sliding_window) == (32768, None)
    for name, kv in (("qwen2.5-7b", 4), ("qwen2.5-72b", 8)):
        spec = load_model(name)
        assert (spec.kv_heads, spec.vocab, spec.qkv_bias, spec.o_bias) == (kv, 152064, True, False)
        assert spec.sliding_window is None  # use_sliding_window is false


def test_explicit_head_dim_and_gqa() -> None:
    spec = from_hf_config({**BASE, "head_dim": 32, "num_key_value_heads": 2})
    assert (spec.head_dim, spec.kv_heads) == (32, 2)


def test_attention_bias_llama() -> None:
    spec = from_hf_config({**BASE, "attention_bias": True})
    assert spec.qkv_bias
    assert spec.o_bias


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_size": -1}, "hidden_size: must be a positive integer (got -1)"),
        ({"hidden_size": 0}, "hidden_size: must be a positive integer (got 0)"),
        ({"hidden_size": 64.5}, "hidden_size: must be a positive integer (got 64.5)"),
        ({"hidden_size": "64"}, "hidden_size: must be a positive integer (got '64')"),
        ({"hidden_size": True}, "hidden_size: must be a positive integer (got True)"),
        (
            {"num_key_value_heads": 3},
            "num_key_value_heads: must divide num_attention_heads=4 (allowed: 1, 2, 4) (got 3)",
        ),
        (
            {"model_type": "bert"},
            "model_type: must be one of gpt2, llama, mistral, qwen2 (got 'bert')",
        ),
        (
            {"num_local_experts": 8},
            "num_local_experts: mixture-of-experts is not supported yet (dense decoders only) (got 8)",
        ),
        ({"hidden_act": "gelu"}, "hidden_act: must be one of silu (got 'gelu')"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings: must be true or false (got 'yes')"),
        (
            {"hidden_size": 66},
            "head_dim: is required when hidden_size=66 is not a multiple of num_attention_heads=4",
        ),
    ],
)
def test_bad_configs(change: dict[str, object], message: str) -> None:
    with pytest.raises(InputError) as info:
        from_hf_config({**BASE, **change})
    assert str(info.value) == message
    assert "\n" not in str(info.value)


def test_missing_key() -> None:
    cfg = dict(BASE)
    del cfg["vocab_size"]
    with pytest.raises(InputError, match="^vocab_size: is required"):
        from_hf_config(cfg)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"model_type": "llama", "hidden', "x.json: is not valid JSON"),
        ("[1, 2]", "x.json: must hold a JSON object (got 'list')"),
        ("", "x.json: is not valid JSON"),
    ],
)
def test_bad_json(text: str, message: str) -> None:
    with pytest.raises(InputError) as info:
        parse_config_text(text, "x.json")
    assert str(info.value).startswith(message)


def test_config_file(tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(BASE))
    spec = load_config_file(folder / "config.json")
    assert spec.name == "my-model"
    with pytest.raises(InputError, match="^config: must be a preset name"):
        load_config_file(tmp_path / "missing.json")


def test_unknown_preset() -> None:
    with pytest.raises(InputError, match="^model: must be one of .*llama-7b"):
        load_model("llama-8b")
