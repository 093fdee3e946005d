"""Readers of Gemma, Gemma-2 and Gemma-3's text decoder (sandwich norms, softcapping,
alternating sliding/global layers).

Examples
========

>>> GEMMA3_TEXT.harmless[-1]
'rope_local_base_freq'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from vrammath.model.readers.keys import (
    _ATTENTION_BIAS,
    _GQA_KEYS,
    Keys,
    Parts,
    Reader,
    _embeddings,
    _kv_heads,
)
from vrammath.model.readers.llama import _DECODER_HARMLESS, _layer_pattern
from vrammath.model.spec import MLP, Attention, Norms
from vrammath.notation.errors import InputError, one_of

GEMMA_ACTIVATIONS: tuple[str, ...] = ("gelu_pytorch_tanh", "gelu")
"""The gated MLP's activations the Gemma readers accept (single PyTorch ops keeping their input)."""


def _softcap(k: Keys, key: str, default: float | None) -> float | None:
    k.has(key)  # the table lists it
    value = k.cfg.get(key, default)  # an explicit null turns the cap off
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise InputError(key, "must be a positive number or null", got=value)
    return float(value)


def _causal_without_dropout(k: Keys) -> None:
    """Refuse what no Gemma reader models: dropout on the attention probabilities, and attention
    that is not causal."""
    if k.probability("attention_dropout", 0.0) != 0:
        raise InputError(
            "attention_dropout",
            "must be 0.0 (dropout on attention probabilities is not modelled)",
            got=k.raw("attention_dropout"),
        )
    bidirectional = k.raw("use_bidirectional_attention", False)
    if bidirectional is not False:
        raise InputError(
            "use_bidirectional_attention",
            "must be false or null (causal decoders only)",
            got=bidirectional,
        )


def _gemma_attention(k: Keys, heads: int, bias: bool) -> Attention:
    """Every layer's attention, without Gemma-2's windows, softcap or q/k norms."""
    return Attention(
        heads=heads,
        kv_heads=_kv_heads(k, "num_key_value_heads", heads),
        head_dim=k.size("head_dim", 256),
        qkv_bias=bias,
        o_bias=bias,
    )


def _gemma(k: Keys) -> Parts:
    """Gemma (v1): Gemma-2's parts without sandwich norms, softcaps or sliding windows."""
    hidden = k.size("hidden_size")
    heads = k.size("num_attention_heads")
    k.choice("hidden_act", "gelu_pytorch_tanh", GEMMA_ACTIVATIONS)
    _causal_without_dropout(k)
    bias = k.flag("attention_bias", False)
    embeddings = _embeddings(k, hidden, tied=True, max_positions=8192, scaled=True)
    attention = _gemma_attention(k, heads, bias)
    # GemmaConfig replaces the legacy "gelu" of the official releases by the tanh approximation
    mlp = MLP(
        intermediate=k.size("intermediate_size"),
        gated=True,
        activation="gelu_pytorch_tanh",
        bias=False,
    )
    norms = Norms(kind="rmsnorm", unit_offset=True)
    return k.size("num_hidden_layers"), embeddings, attention, mlp, norms


_GEMMA_KEYS: Mapping[str, str] = {
    **_GQA_KEYS,
    **_ATTENTION_BIAS,
    "attention_dropout": "attention.dropout (0 only)",
    "use_bidirectional_attention": "(false or null only)",
}

GEMMA = Reader(
    "gemma",
    keys={**_GEMMA_KEYS, "hidden_act": "mlp.activation (gelu means gelu_pytorch_tanh)"},
    # hidden_activation is in some Gemma files; GemmaConfig 5.x reads hidden_act only
    harmless=(*_DECODER_HARMLESS, "hidden_activation"),
    parts=_gemma,
)


def _gemma3_text(k: Keys) -> Parts:
    """Gemma-3's text decoder: Gemma-2's parts with q/k norms, no softcaps by default, and one
    global layer in ``sliding_window_pattern`` (6)."""
    layers = k.size("num_hidden_layers")
    pattern = k.size("sliding_window_pattern", 6)
    default = [bool((i + 1) % pattern) for i in range(layers)]
    # Gemma3TextConfig's default vocabulary (the 27B file relies on it)
    return _gemma2_like(
        k, default, qk_norm=True, caps=(None, None), max_positions=131072, vocab=262208
    )


def _gemma2(k: Keys) -> Parts:
    layers = k.size("num_hidden_layers")
    default = [bool((i + 1) % 2) for i in range(layers)]
    return _gemma2_like(k, default, qk_norm=False, caps=(30.0, 50.0), max_positions=8192, vocab=...)


def _gemma2_like(
    k: Keys,
    default_slides: list[bool],
    *,
    qk_norm: bool,
    caps: tuple[float | None, float | None],
    max_positions: int,
    vocab: object,
) -> Parts:
    hidden = k.size("hidden_size")
    heads = k.size("num_attention_heads")
    layers = k.size("num_hidden_layers")
    activation = k.raw("hidden_activation", None) or k.raw("hidden_act", "gelu_pytorch_tanh")
    if activation not in GEMMA_ACTIVATIONS:
        raise one_of("hidden_activation", activation, GEMMA_ACTIVATIONS)
    _causal_without_dropout(k)
    slides = _layer_pattern(k, layers, default_slides)
    window = k.size("sliding_window", 4096) if any(slides) else None
    bias = k.flag("attention_bias", False)
    embeddings = replace(
        _embeddings(k, hidden, tied=True, max_positions=max_positions, vocab=vocab, scaled=True),
        logit_softcap=_softcap(k, "final_logit_softcapping", caps[0]),
    )
    attention = replace(
        _gemma_attention(k, heads, bias),
        sliding_window=window,
        window_layers=sum(slides),
        last_layer_slides=slides[-1],
        softcap=_softcap(k, "attn_logit_softcapping", caps[1]),
        qk_norm="head" if qk_norm else "none",
    )
    mlp = MLP(
        intermediate=k.size("intermediate_size"), gated=True, activation=str(activation), bias=False
    )
    norms = Norms(kind="rmsnorm", placement="sandwich", unit_offset=True)
    return layers, embeddings, attention, mlp, norms


GEMMA2 = Reader(
    "gemma2",
    keys={
        **_GEMMA_KEYS,
        "final_logit_softcapping": "embeddings.logit_softcap",
        "attn_logit_softcapping": "attention.softcap",
        "sliding_window": "attention.sliding_window",
        "layer_types": "attention.window_layers, attention.last_layer_slides",
        "hidden_activation": "mlp.activation",
        "hidden_act": "mlp.activation (when hidden_activation is absent)",
    },
    # query_pre_attn_scalar sets the scores' scale, a number; cache_implementation is serving's;
    # sliding_window_size is a legacy copy of sliding_window that transformers 5 never reads
    harmless=(
        *_DECODER_HARMLESS,
        "cache_implementation",
        "query_pre_attn_scalar",
        "sliding_window_size",
    ),
    parts=_gemma2,
)

GEMMA3_TEXT = Reader(
    "gemma3_text",
    keys={
        **GEMMA2.keys,
        "sliding_window_pattern": "attention.window_layers (one global layer in this many)",
        "layer_types": "attention.window_layers, attention.last_layer_slides (overrides the pattern)",
    },
    # rope_local_base_freq is the sliding layers' RoPE base: a second (s, d) table, counted
    harmless=(*GEMMA2.harmless, "rope_local_base_freq"),
    parts=_gemma3_text,
)
