"""ModelSpec from config.json: presets, fields honoured, and every kind of bad input refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sympy
from hypothesis import given
from hypothesis import strategies as st

from vrammath.model.presets import load_config_file, load_model, model_names, parse_config_text
from vrammath.model.readers import from_hf_config
from vrammath.model.spec import MLP, Attention, Embeddings, Norms
from vrammath.notation.errors import InputError
from vrammath.notation.symbols import a, b, h, s
from vrammath.terms.activations.layer import hf_layer_bytes, hf_layer_terms
from vrammath.terms.activations.model import hf_activation_terms

BASE = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 100,
}


GPT2_BASE: dict[str, object] = {
    "model_type": "gpt2",
    "n_embd": 64,
    "n_layer": 2,
    "n_head": 4,
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
            "model_type: must be one of deepseek_v3, gemma, gemma2, gemma3_text, gpt2, gpt_neox, "
            "llama, mistral, mixtral, olmo2, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe, starcoder2 "
            "(any other: measure it exactly with `vrammath derive CONFIG.json`, needs the "
            "'measure' extra) (got 'bert')",
        ),
        (
            {"num_local_experts": 8},
            "num_local_experts: mixture-of-experts is not modelled by the llama reader "
            "(readers with mixture-of-experts: deepseek_v3, mixtral, qwen2_moe, qwen3_moe) (got 8)",
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


# --- the parts, and the flat views of them ---------------------------------------------------


def test_qwen2_72b_parts() -> None:
    spec = load_model("qwen2-72b")
    assert (spec.model_type, spec.layers, spec.warnings) == ("qwen2", 80, ())
    assert spec.embeddings == Embeddings(
        vocab=152064, hidden=8192, tied=False, learned_positions=False, max_positions=131072
    )
    assert spec.attention == Attention(
        heads=64, kv_heads=8, head_dim=128, qkv_bias=True, o_bias=False
    )
    assert spec.attention.kind == "GQA"
    assert spec.mlp == MLP(intermediate=29568, gated=True, activation="silu", bias=False)
    assert spec.norms == Norms(kind="rmsnorm", placement="pre", parallel_residual=False)


def test_gpt2_parts_keep_activation_and_dropout() -> None:
    spec = from_hf_config(GPT2_BASE)
    assert spec.mlp == MLP(
        intermediate=256, gated=False, activation="gelu_new", bias=True, dropout=0.1
    )
    assert (spec.attention.fused_qkv, spec.attention.dropout, spec.attention.output_dropout) == (
        True,
        0.1,
        0.1,
    )
    assert (spec.embeddings.learned_positions, spec.embeddings.dropout) == (True, 0.1)
    assert spec.norms.kind == "layernorm"
    tanh = from_hf_config({**GPT2_BASE, "activation_function": "gelu_pytorch_tanh"})
    assert tanh.mlp.activation == "gelu_pytorch_tanh"


def test_mistral_window_on_every_layer_and_qwen2_window_layers() -> None:
    mistral = load_model("mistral-7b")
    assert (mistral.attention.sliding_window, mistral.attention.window_layers) == (4096, 32)
    qwen = {**BASE, "model_type": "qwen2", "num_hidden_layers": 4}
    on = from_hf_config(
        {**qwen, "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1}
    )
    assert (on.attention.sliding_window, on.attention.window_layers) == (16, 3)
    # transformers' defaults: a 4096-token window from layer 28 on, so none of 4 layers slides
    assert from_hf_config({**qwen, "use_sliding_window": True}).attention.window_layers == 0
    typed = {**qwen, "use_sliding_window": True, "sliding_window": 16}
    types = ["full_attention", "sliding_attention", "full_attention", "sliding_attention"]
    assert from_hf_config({**typed, "layer_types": types}).attention.window_layers == 2
    off = load_model("qwen2-7b")
    assert (off.attention.sliding_window, off.attention.window_layers) == (None, 0)


@pytest.mark.parametrize(("kv_heads", "kind"), [(4, "MHA"), (2, "GQA"), (1, "MQA")])
def test_attention_kind(kv_heads: int, kind: str) -> None:
    assert from_hf_config({**BASE, "num_key_value_heads": kv_heads}).attention.kind == kind


@given(
    model_type=st.sampled_from(["llama", "mistral", "qwen2"]),
    heads_kv=st.sampled_from([(4, 4), (4, 2), (8, 1), (6, 3)]),
    head_dim=st.one_of(st.none(), st.integers(1, 64)),
    inter=st.integers(1, 10_000),
    layers=st.integers(1, 100),
    vocab=st.integers(1, 200_000),
    tied=st.booleans(),
    bias=st.booleans(),
)
def test_flat_views_equal_the_parts(
    model_type: str,
    heads_kv: tuple[int, int],
    head_dim: int | None,
    inter: int,
    layers: int,
    vocab: int,
    tied: bool,
    bias: bool,
) -> None:
    heads, kv = heads_kv
    cfg: dict[str, object] = {
        "model_type": model_type,
        "hidden_size": 24 * heads,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
    }
    if model_type == "llama":
        cfg.update(attention_bias=bias, mlp_bias=bias)
    spec = from_hf_config(cfg)
    e, att, mlp = spec.embeddings, spec.attention, spec.mlp
    assert (spec.hidden, spec.vocab, spec.tied_embeddings, spec.max_positions) == (
        e.hidden,
        e.vocab,
        e.tied,
        e.max_positions,
    )
    assert (spec.heads, spec.kv_heads, spec.head_dim, spec.qkv_bias, spec.o_bias) == (
        att.heads,
        att.kv_heads,
        att.head_dim,
        att.qkv_bias,
        att.o_bias,
    )
    assert spec.sliding_window == att.sliding_window
    assert (spec.intermediate, spec.gated_mlp, spec.mlp_bias) == (
        mlp.intermediate,
        mlp.gated,
        mlp.bias,
    )
    assert (spec.norm, spec.learned_positions) == (spec.norms.kind, e.learned_positions)
    # and the parts hold the config's values
    assert (e.hidden, e.vocab, e.tied, spec.layers, mlp.intermediate) == (
        24 * heads,
        vocab,
        tied,
        layers,
        inter,
    )
    assert (att.heads, att.kv_heads, att.head_dim) == (heads, kv, head_dim or 24)
    assert att.qkv_bias == (bias if model_type == "llama" else model_type == "qwen2")
    assert spec.warnings == ()


# --- every key modelled, harmless or refused ---------------------------------------------------


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (
            {**BASE, "attention_dropout": 1.5},
            "attention_dropout: must be a number in [0, 1) (got 1.5)",
        ),
        (
            {**BASE, "attention_dropout": True},
            "attention_dropout: must be a number in [0, 1) (got True)",
        ),
        (
            {**BASE, "model_type": "mistral", "hidden_act": "gelu"},
            "hidden_act: must be one of silu (got 'gelu')",
        ),
        (
            {**GPT2_BASE, "reorder_and_upcast_attn": True},
            "reorder_and_upcast_attn: must be false (the upcast attention is not modelled) (got True)",
        ),
        (
            {**GPT2_BASE, "scale_attn_by_inverse_layer_idx": True},
            "scale_attn_by_inverse_layer_idx: must be false (per-layer attention scaling is not "
            "modelled) (got True)",
        ),
        (
            {**GPT2_BASE, "scale_attn_weights": False},
            "scale_attn_weights: must be true (unscaled attention is not modelled) (got False)",
        ),
        (
            {**GPT2_BASE, "add_cross_attention": True},
            "add_cross_attention: cross-attention is not modelled by the gpt2 reader "
            "(readers with cross-attention: none) (got True)",
        ),
        (
            {**GPT2_BASE, "activation_function": "relu"},
            "activation_function: must be one of gelu, gelu_pytorch_tanh, gelu_new, gelu_fast "
            "(got 'relu')",
        ),
        (
            {**BASE, "output_attentions": True},
            "output_attentions: must be false (its returned tensors are not modelled) (got True)",
        ),
        (
            {**BASE, "model_type": "mistral", "sliding_window": 0},
            "sliding_window: must be a positive integer (got 0)",
        ),
        (
            {**BASE, "model_type": "qwen2", "use_sliding_window": True, "sliding_window": -4},
            "sliding_window: must be a positive integer (got -4)",
        ),
        (
            {
                **BASE,
                "model_type": "qwen2",
                "use_sliding_window": True,
                "layer_types": ["full_attention"],
            },
            "layer_types: must list 2 values (num_hidden_layers), each one of full_attention, "
            "sliding_attention (got ['full_attention'])",
        ),
        (
            {**BASE, "model_type": "qwen2", "layer_types": ["sliding_attention"] * 2},
            "layer_types: lists sliding_attention layers but use_sliding_window is false or "
            "sliding_window is null",
        ),
        (
            {**BASE, "model_type": "qwen2", "max_window_layers": -1},
            "max_window_layers: must be an integer >= 0 (got -1)",
        ),
        (
            {**BASE, "hidden_size": 10**160},
            "hidden_size: must be at most 2**40 (MAX_SIZE) (got a 532-bit integer)",
        ),
        (
            {**BASE, "vocab_size": 2**40 + 1},
            "vocab_size: must be at most 2**40 (MAX_SIZE) (got 1099511627777)",
        ),
        (
            {**BASE, "num_hidden_layers": False},
            "num_hidden_layers: must be a positive integer (got False)",
        ),
        ({**GPT2_BASE, "n_inner": 4.0}, "n_inner: must be a positive integer (got 4.0)"),
    ],
)
def test_keys_that_change_memory_are_refused(cfg: dict[str, object], message: str) -> None:
    with pytest.raises(InputError) as info:
        from_hf_config(cfg)
    assert str(info.value) == message


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2"])
def test_attention_dropout_is_read(model_type: str) -> None:
    spec = from_hf_config({**BASE, "model_type": model_type, "attention_dropout": 0.25})
    assert spec.attention.dropout == 0.25
    plain = from_hf_config({**BASE, "model_type": model_type})
    extra = hf_layer_bytes(spec, "eager", "bf16") - hf_layer_bytes(plain, "eager", "bf16")
    # CUDA: a bool mask more; the dropped-out 16-bit probabilities replace the 16-bit cast
    assert sympy.expand(extra - a * s**2 * b) == 0


@pytest.mark.parametrize(
    ("key", "group", "kept"),
    [
        ("attn_pdrop", "scores", 3 * a * s**2 * b),  # CUDA: bool mask + dropped 16-bit copy
        ("resid_pdrop", "mlp", s * b * h),  # one bool mask after each c_proj
        ("resid_pdrop", "output", s * b * h),
    ],
)
def test_gpt2_each_dropout_is_read(key: str, group: str, kept: sympy.Expr) -> None:
    on, off = from_hf_config(GPT2_BASE), from_hf_config({**GPT2_BASE, key: 0.0})
    assert (off.attention.dropout if key == "attn_pdrop" else off.mlp.dropout) == 0.0
    diff = hf_layer_terms(on, "eager", "bf16")[group] - hf_layer_terms(off, "eager", "bf16")[group]
    assert sympy.expand(diff - kept) == 0


def test_gpt2_embedding_dropout_is_read() -> None:
    off = from_hf_config({**GPT2_BASE, "embd_pdrop": 0.0})
    assert off.embeddings.dropout == 0.0
    assert "embedding_dropout" not in hf_activation_terms(off)
    assert hf_activation_terms(from_hf_config(GPT2_BASE))["embedding_dropout"] == s * b * h


def test_kv_heads_message_is_bounded_and_fast() -> None:
    heads = 2**40  # 41 divisors: listing them all (or scanning range(heads)) would hang
    with pytest.raises(InputError) as info:
        from_hf_config(
            {**BASE, "hidden_size": heads, "num_attention_heads": heads, "num_key_value_heads": 3}
        )
    assert str(info.value) == (
        "num_key_value_heads: must divide num_attention_heads=1099511627776 "
        "(allowed: 1, 2, 4, 8, 16, 32, 64, ..., 1099511627776 (41 divisors)) (got 3)"
    )


def test_unknown_keys_warn_and_harmless_keys_do_not() -> None:
    spec = from_hf_config(
        {
            **BASE,
            "rope_theta": 5e5,
            "rope_scaling": {"rope_type": "llama3"},
            "zeta": 1,
            "alpha": None,
        }
    )
    assert spec.warnings == (
        "alpha: unknown to the llama reader, ignored (it may change memory)",
        "zeta: unknown to the llama reader, ignored (it may change memory)",
    )
    gpt = from_hf_config({**GPT2_BASE, "n_ctx": 1024, "layer_norm_epsilon": 1e-5, "head_dim": 16})
    assert gpt.warnings == ("head_dim: unknown to the gpt2 reader, ignored (it may change memory)",)


def test_presets_and_dumped_configs_read_without_warnings() -> None:
    for name in model_names():
        assert load_model(name).warnings == (), name
    # configs as transformers 5 writes them (every PretrainedConfig key)
    data = json.loads((Path(__file__).parent.parent / "validation" / "lora_kv.json").read_text())
    for row in data["kv"]:
        assert from_hf_config(row["config_dict"]).warnings == (), row["config"]


def test_every_reader_reads_only_its_table() -> None:
    from vrammath.model.readers import READERS, Keys

    for reader in READERS.values():
        k = Keys({}, reader.keys)
        with pytest.raises(KeyError):
            k.has("not_in_any_table")
        assert not set(reader.keys) & set(reader.harmless), reader.model_type


def test_every_public_name_exists() -> None:
    """``from vrammath import *`` works: each name in ``vrammath.__all__`` is bound (FORMULAS and
    formula_exprs were listed but not imported)."""
    import vrammath

    missing = [name for name in vrammath.__all__ if not hasattr(vrammath, name)]
    assert missing == []
    namespace: dict[str, object] = {}
    exec("from vrammath import *", namespace)
    assert "formula_exprs" in namespace
