"""Readers of the newer LLaMA-like decoders: Qwen3, OLMo-2, Phi-3 (and Phi-4), StarCoder2.

Explanation
===========

Each is a :class:`~vrammath.model.readers.keys.Reader` built on the LLaMA-style parts of
:mod:`vrammath.model.readers.llama`, with what sets it apart:

* ``qwen3`` -- an RMSNorm over each query and key head before RoPE (``qk_norm="head"``),
  ``head_dim`` 128 unless the config says otherwise (transformers' default, not h / a);
* ``olmo2`` -- an RMSNorm over the whole query and key projection (``qk_norm="projection"``)
  and norms *after* attention and the MLP (``placement="post"``);
* ``phi3`` -- one ``qkv_proj`` and one ``gate_up_proj`` linear (``fused_qkv_linear``,
  ``fused_gate_up``); Phi-4 is a ``phi3`` config;
* ``starcoder2`` -- LayerNorm with biases and a plain GeLU-tanh MLP with biases (``c_fc``,
  ``c_proj``), biases on every projection, and dropout on the embedding, the attention
  probabilities and both residual branches.

Dropout the formulas do not describe (Phi-3's) is refused, one line each.

Examples
========

>>> from vrammath.model.readers import from_hf_config
>>> spec = from_hf_config({"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 96,
...     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
...     "vocab_size": 100})
>>> spec.attention.qk_norm, spec.attention.head_dim
('head', 128)
>>> from_hf_config({"model_type": "phi3", "hidden_size": 64, "intermediate_size": 96,
...     "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
...     "resid_pdrop": 0.1})
Traceback (most recent call last):
...
vrammath.notation.errors.InputError: resid_pdrop: must be 0.0 (dropout is not modelled for phi3) (got 0.1)
"""

from __future__ import annotations

from dataclasses import replace

from vrammath.model.readers.keys import (
    _ATTENTION_BIAS,
    _GQA_KEYS,
    Keys,
    Parts,
    Reader,
    _attention,
    _embeddings,
)
from vrammath.model.readers.llama import _decoder_parts, _decoder_reader, _window
from vrammath.model.spec import MLP, Norms
from vrammath.notation.errors import InputError


def _no_dropout(k: Keys, key: str, model_type: str) -> None:
    if k.probability(key, 0.0) != 0:
        raise InputError(
            key, f"must be 0.0 (dropout is not modelled for {model_type})", got=k.raw(key)
        )


# ---------------------------------------------------------------------------------------------
# Qwen3
# ---------------------------------------------------------------------------------------------


def _qwen3(k: Keys) -> Parts:
    if k.flag("use_sliding_window", False):
        raise InputError(
            "use_sliding_window", "must be false (qwen3 sliding windows are not modelled)", got=True
        )
    if k.has("layer_types"):
        kinds = k.raw("layer_types")
        if not isinstance(kinds, list) or any(x != "full_attention" for x in kinds):
            raise InputError("layer_types", "must list only full_attention for qwen3", got=kinds)
    k.raw("max_window_layers", None)  # read only with use_sliding_window, which is refused
    k.raw("sliding_window", None)
    bias = k.flag("attention_bias", False)
    layers, embeddings, attention, mlp, norms = _decoder_parts(
        k, qkv_bias=bias, o_bias=bias, mlp_bias=False, window=None, window_layers=0
    )
    # transformers' Qwen3Config defaults head_dim to 128, not hidden / heads
    head_dim = k.size("head_dim", 128)
    return layers, embeddings, replace(attention, head_dim=head_dim, qk_norm="head"), mlp, norms


# ---------------------------------------------------------------------------------------------
# OLMo-2
# ---------------------------------------------------------------------------------------------


def _olmo2(k: Keys) -> Parts:
    bias = k.flag("attention_bias", False)
    layers, embeddings, attention, mlp, _ = _decoder_parts(
        k, qkv_bias=bias, o_bias=bias, mlp_bias=False, window=None, window_layers=0
    )
    norms = Norms(kind="rmsnorm", placement="post", weight_fp32=True)
    attention = replace(attention, qk_norm="projection", rope_fp32=True)
    return layers, embeddings, attention, mlp, norms


# ---------------------------------------------------------------------------------------------
# Phi-3, Phi-4
# ---------------------------------------------------------------------------------------------


def _phi3(k: Keys) -> Parts:
    for key in ("resid_pdrop", "embd_pdrop"):
        _no_dropout(k, key, "phi3")
    k.off("attention_bias", False, "must be false (Phi3ForCausalLM has no biases)")
    rope = k.raw("rope_parameters", {})
    factor = rope.get("partial_rotary_factor", 1.0) if isinstance(rope, dict) else 1.0
    factor = k.raw("partial_rotary_factor", factor)
    if factor != 1.0:
        raise InputError(
            "partial_rotary_factor", "must be 1.0 (partial rotary is not modelled)", got=factor
        )
    window = _window(k)
    layers, embeddings, attention, mlp, norms = _decoder_parts(
        k,
        qkv_bias=False,
        o_bias=False,
        mlp_bias=False,
        window=window,
        window_layers=k.size("num_hidden_layers"),
    )
    attention = replace(attention, fused_qkv_linear=True)
    return layers, embeddings, attention, replace(mlp, fused_gate_up=True), norms


# ---------------------------------------------------------------------------------------------
# StarCoder2
# ---------------------------------------------------------------------------------------------


def _starcoder2(k: Keys) -> Parts:
    hidden = k.size("hidden_size")
    heads = k.size("num_attention_heads")
    k.choice("hidden_act", "gelu_pytorch_tanh", ("gelu_pytorch_tanh",))
    bias = k.flag("use_bias", True)
    # keys of StarCoder2's original code; transformers' class builds only these values
    k.off("mlp_type", "default", "must be default (the plain GeLU MLP)")
    k.off("norm_type", "layer_norm", "must be layer_norm")
    embeddings = replace(
        _embeddings(k, hidden, tied=True, max_positions=4096),
        dropout=k.probability("embedding_dropout", 0.0),
    )
    window = _window(k)
    residual = k.probability("residual_dropout", 0.0)
    layers = k.size("num_hidden_layers")
    attention = replace(
        _attention(
            k, hidden, heads, qkv_bias=bias, o_bias=bias, window=window, window_layers=layers
        ),
        output_dropout=residual,
    )
    mlp = MLP(
        intermediate=k.size("intermediate_size"),
        gated=False,
        activation="gelu_pytorch_tanh",
        bias=bias,
        dropout=residual,
    )
    return layers, embeddings, attention, mlp, Norms(kind="layernorm")


def decoder_readers() -> tuple[Reader, ...]:
    """The readers of this module (qwen3, olmo2, phi3, starcoder2), for
    :data:`vrammath.model.readers.READERS`.

    >>> [r.model_type for r in decoder_readers()]
    ['qwen3', 'olmo2', 'phi3', 'starcoder2']
    """
    qwen3 = _decoder_reader(
        "qwen3",
        _qwen3,
        {
            **_ATTENTION_BIAS,
            "use_sliding_window": "(false only: no sliding window)",
            "sliding_window": "(unused while use_sliding_window is false)",
            "max_window_layers": "(unused while use_sliding_window is false)",
            "layer_types": "(full_attention only)",
        },
    )
    olmo2 = _decoder_reader("olmo2", _olmo2, _ATTENTION_BIAS)
    phi3 = _decoder_reader(
        "phi3",
        _phi3,
        {
            "resid_pdrop": "(0 only: dropout is not modelled)",
            "embd_pdrop": "(0 only: dropout is not modelled)",
            "sliding_window": "attention.sliding_window (every layer)",
            "partial_rotary_factor": "(1.0 only)",
            "attention_bias": "(false only: transformers' Phi-3 never reads it)",
            "rope_parameters": "(partial_rotary_factor 1.0 only)",
        },
        # the long-context RoPE factors scale angles; the original context length only picks them;
        # auto_map names the remote code transformers' own Phi3 class replaces
        harmless=("auto_map", "original_max_position_embeddings"),
    )
    starcoder2 = Reader(
        "starcoder2",
        keys={
            **_GQA_KEYS,
            "embedding_dropout": "embeddings.dropout",
            "attention_dropout": "attention.dropout",
            "residual_dropout": "attention.output_dropout, mlp.dropout",
            "sliding_window": "attention.sliding_window (every layer)",
            "use_bias": "attention.qkv_bias, attention.o_bias, mlp.bias",
            "hidden_act": "mlp.activation (gelu_pytorch_tanh only)",
            "mlp_type": "(default only)",
            "norm_type": "(layer_norm only)",
        },
        harmless=("norm_epsilon", "rope_parameters", "rope_scaling", "rope_theta"),
        parts=_starcoder2,
    )
    return (qwen3, olmo2, phi3, starcoder2)


__all__ = ["decoder_readers"]
