"""Readers of GPT-2 and GPT-NeoX (parallel residual, partial rotary, fused QKV, biased LayerNorm).

Examples
========

>>> GPT2.keys["n_inner"], GPT_NEOX.keys["use_parallel_residual"]
('mlp.intermediate', 'norms.parallel_residual')
"""

from __future__ import annotations

from collections.abc import Mapping

from vrammath.model.readers.keys import (
    _ATTENTION_BIAS,
    _SIZE_KEYS,
    Keys,
    Parts,
    Reader,
    _embeddings,
)
from vrammath.model.spec import MLP, Attention, Embeddings, Norms
from vrammath.notation.errors import InputError
from vrammath.notation.vocab import GELU_VARIANTS


def _heads(k: Keys, hidden_key: str, heads_key: str) -> tuple[int, int]:
    """The hidden size and the (multi-head) heads, which must divide it: a head is h / a wide."""
    hidden = k.size(hidden_key)
    heads = k.size(heads_key)
    if hidden % heads:
        raise InputError(heads_key, f"must divide {hidden_key}={hidden}", got=heads)
    return hidden, heads


def _gpt2(k: Keys) -> Parts:
    hidden, heads = _heads(k, "n_embd", "n_head")
    activation = k.choice("activation_function", "gelu_new", GELU_VARIANTS)
    k.off("reorder_and_upcast_attn", False, "must be false (the upcast attention is not modelled)")
    k.off(
        "scale_attn_by_inverse_layer_idx",
        False,
        "must be false (per-layer attention scaling is not modelled)",
    )
    k.off("scale_attn_weights", True, "must be true (unscaled attention is not modelled)")
    # each dropout is read on its own (0 keeps no mask); 0.1 is GPT2Config's default
    resid = k.probability("resid_pdrop", 0.1)
    embeddings = Embeddings(
        vocab=k.size("vocab_size"),
        hidden=hidden,
        tied=k.flag("tie_word_embeddings", True),
        learned_positions=True,
        max_positions=k.size("n_positions", 1024),
        dropout=k.probability("embd_pdrop", 0.1),
    )
    attention = Attention(
        heads=heads,
        kv_heads=heads,
        head_dim=hidden // heads,
        qkv_bias=True,
        o_bias=True,
        fused_qkv=True,
        dropout=k.probability("attn_pdrop", 0.1),
        output_dropout=resid,
    )
    mlp = MLP(
        intermediate=k.size("n_inner", 4 * hidden),
        gated=False,
        activation=activation,
        bias=True,
        dropout=resid,
    )
    return k.size("n_layer"), embeddings, attention, mlp, Norms(kind="layernorm")


GPT2 = Reader(
    "gpt2",
    keys={
        "n_embd": "embeddings.hidden",
        "vocab_size": "embeddings.vocab",
        "tie_word_embeddings": "embeddings.tied",
        "n_positions": "embeddings.max_positions",
        "embd_pdrop": "embeddings.dropout",
        "n_layer": "layers",
        "n_head": "attention.heads (= kv_heads)",
        "attn_pdrop": "attention.dropout",
        "resid_pdrop": "attention.output_dropout, mlp.dropout",
        "reorder_and_upcast_attn": "(false only)",
        "scale_attn_by_inverse_layer_idx": "(false only)",
        "scale_attn_weights": "(true only)",
        "n_inner": "mlp.intermediate",
        "activation_function": "mlp.activation",
    },
    harmless=(
        "layer_norm_epsilon",
        "n_ctx",
        "summary_activation",
        "summary_first_dropout",
        "summary_proj_to_labels",
        "summary_type",
        "summary_use_proj",
    ),
    parts=_gpt2,
)
"""``n_ctx`` is a legacy alias of ``n_positions`` that GPT-2's model does not read; the
``summary_*`` keys configure the double-heads model's classifier, not the causal LM."""


NEOX_ACTIVATIONS: tuple[str, ...] = ("gelu", "gelu_pytorch_tanh", "gelu_new", "gelu_fast")


def _rotary_fraction(k: Keys) -> float:
    """``rotary_pct`` (older configs) or ``rope_parameters.partial_rotary_factor``; 0.25 as
    transformers' GPTNeoXConfig defaults it."""
    value: object = k.raw("rotary_pct", 0.25)
    params = k.raw("rope_parameters", None)
    if isinstance(params, Mapping) and params.get("partial_rotary_factor") is not None:
        value = params["partial_rotary_factor"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise InputError("rotary_pct", "must be a number in (0, 1]", got=value)
    return float(value)


def _zero(k: Keys, key: str) -> None:
    if k.probability(key, 0.0) != 0:
        raise InputError(key, "must be 0.0 (GPT-NeoX's dropout is not modelled)", got=k.raw(key))


def _gpt_neox(k: Keys) -> Parts:
    hidden, heads = _heads(k, "hidden_size", "num_attention_heads")
    activation = k.choice("hidden_act", "gelu", NEOX_ACTIVATIONS)
    _zero(k, "attention_dropout")
    _zero(k, "hidden_dropout")
    head_dim = hidden // heads
    rotary = int(head_dim * _rotary_fraction(k))  # transformers truncates the same way
    if rotary == 0:
        raise InputError("rotary_pct", f"rotates no dimension of head_dim={head_dim}")
    bias = k.flag("attention_bias", True)
    embeddings = _embeddings(k, hidden, tied=False, max_positions=2048)
    attention = Attention(
        heads=heads,
        kv_heads=heads,
        head_dim=head_dim,
        qkv_bias=bias,
        o_bias=bias,
        fused_qkv=True,
        rotary_dim=None if rotary == head_dim else rotary,
    )
    mlp = MLP(
        intermediate=k.size("intermediate_size"), gated=False, activation=activation, bias=True
    )
    norms = Norms(kind="layernorm", parallel_residual=k.flag("use_parallel_residual", True))
    return k.size("num_hidden_layers"), embeddings, attention, mlp, norms


GPT_NEOX = Reader(
    "gpt_neox",
    keys={
        **_SIZE_KEYS,
        **_ATTENTION_BIAS,
        "num_attention_heads": "attention.heads (= kv_heads)",
        "attention_dropout": "attention.dropout (0 only)",
        "hidden_dropout": "(0 only)",
        "rotary_pct": "attention.rotary_dim",
        "rope_parameters": "attention.rotary_dim (partial_rotary_factor)",
        "hidden_act": "mlp.activation",
        "use_parallel_residual": "norms.parallel_residual",
    },
    # rotary_emb_base is RoPE's base; classifier_dropout belongs to the classification heads;
    # attention_probs_dropout_prob / hidden_dropout_prob (GPT-NeoX-20B's file) are BERT-style
    # names GPTNeoXConfig never reads (its dropouts are attention_dropout and hidden_dropout)
    harmless=(
        "attention_probs_dropout_prob",
        "classifier_dropout",
        "hidden_dropout_prob",
        "is_decoder",
        "layer_norm_eps",
        "rope_scaling",
        "rope_theta",
        "rotary_emb_base",
        "bias_dropout_fusion",
    ),
    parts=_gpt_neox,
)
