"""Readers of the LLaMA-style decoders: llama, mistral, qwen2 (RMSNorm, RoPE, a gated SiLU MLP).

Examples
========

>>> sorted(QWEN2.keys.keys() - LLAMA.keys.keys())
['layer_types', 'max_window_layers', 'sliding_window', 'use_sliding_window']
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from vrammath.model.readers.keys import (
    _ATTENTION_BIAS,
    _GQA_KEYS,
    Extra,
    Keys,
    Parts,
    Reader,
    _attention,
    _embeddings,
    bounded_int,
)
from vrammath.model.spec import MLP, Norms
from vrammath.notation.errors import InputError

_DECODER_KEYS: Mapping[str, str] = {
    **_GQA_KEYS,
    "attention_dropout": "attention.dropout",
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


def _decoder_reader(
    model_type: str,
    parts: Callable[[Keys], Parts],
    keys: Mapping[str, str],
    harmless: tuple[str, ...] = (),
    extra: Callable[[Keys], Extra] | None = None,
) -> Reader:
    """A reader of a LLaMA-style config: :data:`_DECODER_KEYS` and ``keys`` (which win), the
    decoder's harmless keys and ``harmless``, less those the reader models."""
    table = {**_DECODER_KEYS, **keys}
    known = (*_DECODER_HARMLESS, *harmless)
    return Reader(model_type, table, tuple(x for x in known if x not in table), parts, extra)


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
    k.choice("hidden_act", "silu", ("silu",))
    embeddings = _embeddings(k, hidden, tied=False, max_positions=2048)
    attention = _attention(
        k,
        hidden,
        heads,
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        window=window,
        window_layers=window_layers,
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


def _window(k: Keys) -> int | None:
    """A sliding window, recorded on every layer (``sliding_window`` null or absent: none)."""
    return k.size("sliding_window") if k.has("sliding_window") else None


def _layer_pattern(k: Keys, layers: int, default: list[bool]) -> list[bool]:
    """Which layers slide: the config's ``layer_types`` or the architecture's default."""
    if not k.has("layer_types"):
        return default
    kinds = k.raw("layer_types")
    allowed = ("full_attention", "sliding_attention")
    if not isinstance(kinds, list) or len(kinds) != layers or any(x not in allowed for x in kinds):
        raise InputError(
            "layer_types",
            f"must list {layers} values (num_hidden_layers), each one of " + ", ".join(allowed),
            got=kinds,
        )
    return [x == "sliding_attention" for x in kinds]


def _mistral(k: Keys) -> Parts:
    window = _window(k)
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
        window_layers = sum(_layer_pattern(k, layers, []))
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


LLAMA = _decoder_reader("llama", _llama, {**_ATTENTION_BIAS, "mlp_bias": "mlp.bias"})

MISTRAL = _decoder_reader(
    "mistral", _mistral, {"sliding_window": "attention.sliding_window (every layer)"}
)

QWEN2 = _decoder_reader(
    "qwen2",
    _qwen2,
    {
        "use_sliding_window": "attention.sliding_window (on or off)",
        "sliding_window": "attention.sliding_window",
        "max_window_layers": "attention.window_layers (layers from this index slide)",
        "layer_types": "attention.window_layers (count of sliding_attention)",
    },
    # use_mrope is Qwen2-VL's multimodal RoPE flag; Qwen2ForCausalLM never reads it
    harmless=("use_mrope",),
)
