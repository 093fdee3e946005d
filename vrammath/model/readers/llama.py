"""Readers of the LLaMA-style decoders: llama, mistral, qwen2 (RMSNorm, RoPE, a gated SiLU MLP).

Examples
========

>>> sorted(QWEN2.keys.keys() - LLAMA.keys.keys())
['layer_types', 'max_window_layers', 'sliding_window', 'use_sliding_window']
"""

from __future__ import annotations

from vrammath.model.readers.keys import Keys, Parts, Reader, _head_dim, _kv_heads, bounded_int
from vrammath.model.spec import MLP, Attention, Embeddings, Norms
from vrammath.notation.errors import InputError, one_of

_DECODER_KEYS: dict[str, str] = {
    "hidden_size": "embeddings.hidden",
    "vocab_size": "embeddings.vocab",
    "tie_word_embeddings": "embeddings.tied",
    "max_position_embeddings": "embeddings.max_positions",
    "num_hidden_layers": "layers",
    "num_attention_heads": "attention.heads",
    "num_key_value_heads": "attention.kv_heads",
    "head_dim": "attention.head_dim",
    "attention_dropout": "attention.dropout",
    "intermediate_size": "mlp.intermediate",
    "hidden_act": "mlp.activation (silu only)",
}

_DECODER_HARMLESS: tuple[str, ...] = (
    "max_sequence_length",
    "pretraining_tp",
    "rms_norm_eps",
    "rope_parameters",
    "rope_scaling",
    "rope_theta",
)
"""RoPE's base and scaling (Llama 3.x) change the angles, not the tensors kept; ``pretraining_tp``
splits the matmuls of the model's pretraining only when > 1, which transformers 5 ignores."""


def _decoder_parts(
    k: Keys,
    *,
    qkv_bias: bool,
    o_bias: bool,
    mlp_bias: bool,
    window: int | None,
    window_layers: int,
) -> Parts:
    """The parts shared by LLaMA, Mistral and Qwen2: RMSNorm, RoPE, a gated SiLU MLP."""
    hidden = k.size("hidden_size")
    heads = k.size("num_attention_heads")
    layers = k.size("num_hidden_layers")
    activation = k.raw("hidden_act", "silu")
    if activation != "silu":
        raise one_of("hidden_act", activation, ["silu"])
    embeddings = Embeddings(
        vocab=k.size("vocab_size"),
        hidden=hidden,
        tied=k.flag("tie_word_embeddings", False),
        learned_positions=False,
        max_positions=k.size("max_position_embeddings", 2048),
    )
    attention = Attention(
        heads=heads,
        kv_heads=_kv_heads(k, "num_key_value_heads", heads),
        head_dim=_head_dim(k, hidden, heads),
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        sliding_window=window,
        window_layers=window_layers if window is not None else 0,
        dropout=k.probability("attention_dropout", 0.0),
    )
    mlp = MLP(
        intermediate=k.size("intermediate_size"), gated=True, activation="silu", bias=mlp_bias
    )
    return layers, embeddings, attention, mlp, Norms(kind="rmsnorm")


def _llama(k: Keys) -> Parts:
    bias = k.flag("attention_bias", False)
    return _decoder_parts(
        k,
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=k.flag("mlp_bias", False),
        window=None,
        window_layers=0,
    )


def _mistral(k: Keys) -> Parts:
    window = k.size("sliding_window") if k.has("sliding_window") else None
    return _decoder_parts(
        k,
        qkv_bias=False,
        o_bias=False,
        mlp_bias=False,
        window=window,
        window_layers=k.size("num_hidden_layers"),
    )


def _qwen2(k: Keys) -> Parts:
    layers = k.size("num_hidden_layers")
    use_window = k.flag("use_sliding_window", False)
    # checked even when off (the presets carry the window they would use); defaults as
    # transformers' Qwen2Config: a 4096-token window from layer 28 on
    explicit_null = "sliding_window" in k.cfg and k.cfg["sliding_window"] is None
    window = None if explicit_null else k.size("sliding_window", 4096)
    full_layers = bounded_int("max_window_layers", k.raw("max_window_layers", 28), low=0)
    window_layers = max(layers - full_layers, 0) if use_window and window is not None else 0
    if k.has("layer_types"):
        kinds = k.raw("layer_types")
        allowed = ("full_attention", "sliding_attention")
        if (
            not isinstance(kinds, list)
            or len(kinds) != layers
            or any(x not in allowed for x in kinds)
        ):
            raise InputError(
                "layer_types",
                f"must list {layers} values (num_hidden_layers), each one of " + ", ".join(allowed),
                got=kinds,
            )
        window_layers = kinds.count("sliding_attention")
        if window_layers and (not use_window or window is None):
            raise InputError(
                "layer_types",
                "lists sliding_attention layers but use_sliding_window is false "
                "or sliding_window is null",
            )
    return _decoder_parts(
        k,
        qkv_bias=True,
        o_bias=False,
        mlp_bias=False,
        window=window if use_window else None,
        window_layers=window_layers,
    )


LLAMA = Reader(
    "llama",
    keys={
        **_DECODER_KEYS,
        "attention_bias": "attention.qkv_bias, attention.o_bias",
        "mlp_bias": "mlp.bias",
    },
    harmless=_DECODER_HARMLESS,
    parts=_llama,
)

MISTRAL = Reader(
    "mistral",
    keys={**_DECODER_KEYS, "sliding_window": "attention.sliding_window (every layer)"},
    harmless=_DECODER_HARMLESS,
    parts=_mistral,
)

QWEN2 = Reader(
    "qwen2",
    keys={
        **_DECODER_KEYS,
        "use_sliding_window": "attention.sliding_window (on or off)",
        "sliding_window": "attention.sliding_window",
        "max_window_layers": "attention.window_layers (layers from this index slide)",
        "layer_types": "attention.window_layers (count of sliding_attention)",
    },
    # use_mrope is Qwen2-VL's multimodal RoPE flag; Qwen2ForCausalLM never reads it
    harmless=(*_DECODER_HARMLESS, "use_mrope"),
    parts=_qwen2,
)
