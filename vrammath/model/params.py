"""Exact parameter counts, symbolic and numeric, per component and per tensor.

A LLaMA-style decoder (gated MLP, RMSNorm, rotary positions: see :mod:`vrammath.model.spec`) holds

.. math::

    V h (1 \\text{ if tied else } 2) + L\\,[h a d + 2 h a_{kv} d + a d h + 3 h I + 2h
    + \\text{biases}] + h

and a GPT-2-style one (plain MLP, LayerNorm, learned positions) adds learned positions
``n_pos * h``, LayerNorm biases and MLP biases.
``d`` is the head dimension, which is *not* always ``h / a``.

Examples
========

>>> from vrammath.model.presets import load_model
>>> param_count(load_model("llama-7b"))
6738415616
>>> param_exprs(load_model("llama-7b"))["attention"]
2*L*d*h*(a + a_kv)
>>> param_count(load_model("qwen2-72b"))
72706203648

References
==========

.. [1] Touvron et al. 2023, "LLaMA: Open and Efficient Foundation Language Models", arXiv:2302.13971.
.. [2] Yang et al. 2024, "Qwen2 Technical Report", arXiv:2407.10671.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import cache

import sympy

from vrammath.model.spec import ModelSpec
from vrammath.notation.symbols import (
    E,
    I,
    I_e,
    I_s,
    L,
    L_e,
    V,
    a,
    a_kv,
    d,
    d_n,
    d_r,
    d_v,
    h,
    k_e,
    n_pos,
    r_kv,
    r_q,
    w_win,
)

COMPONENTS = ("embedding", "positions", "attention", "mlp", "norms", "head")
MOE_COMPONENTS = ("router", "experts", "shared_experts")
"""Components a mixture-of-experts model adds (``ModelSpec.experts``)."""


@dataclass(frozen=True)
class Tensor:
    """One parameter tensor kind: its name, shape (symbolic) and how many the model holds."""

    name: str
    shape: tuple[sympy.Expr, ...]
    count: sympy.Expr
    component: str

    @property
    def numel(self) -> sympy.Expr:
        """Elements of one such tensor."""
        return sympy.Mul(*self.shape)


def size_values(spec: ModelSpec) -> dict[sympy.Symbol, int]:
    """The numbers the model symbols stand for in ``spec``.

    >>> from vrammath.model.presets import load_model
    >>> size_values(load_model("llama-7b"))[d]
    128
    """
    values = {
        h: spec.hidden,
        I: spec.intermediate,
        L: spec.layers,
        a: spec.heads,
        a_kv: spec.kv_heads,
        d: spec.head_dim,
        V: spec.vocab,
        n_pos: spec.max_positions,
    }
    if spec.experts is not None:
        ex = spec.experts
        values |= {E: ex.count, I_e: ex.intermediate, L_e: len(ex.layers), k_e: ex.top_k}
        if ex.shared_intermediate:
            values[I_s] = ex.shared_intermediate
    if spec.latent is not None:
        lat = spec.latent
        values |= {r_kv: lat.kv_rank, d_n: lat.nope_dim, d_r: lat.rope_dim, d_v: lat.v_dim}
        if lat.q_rank is not None:
            values[r_q] = lat.q_rank
    if spec.sliding_window is not None and spec.attention.window_layers:
        values[w_win] = spec.sliding_window  # the activations of windowed layers depend on it
    return values


def tensors(spec: ModelSpec) -> list[Tensor]:
    """Every parameter tensor of the model, as (name, symbolic shape, multiplicity, component).

    Built part by part (embeddings, attention, MLP, norms, head). Names are transformers'; shapes
    follow PyTorch's ``nn.Linear`` convention (out, in), except GPT-2's ``Conv1D`` layers (in,
    out), which come with its fused QKV and plain MLP. Shape matters to Adafactor's factored
    states and to 8-bit optimizers, which keep small tensors in 32 bits.

    >>> from vrammath.model.presets import load_model
    >>> [t.name for t in tensors(load_model("gpt2")) if t.component == "attention"][:2]
    ['attn.c_attn.weight', 'attn.c_attn.bias']
    """
    one = sympy.Integer(1)
    out: list[Tensor] = [Tensor("embed_tokens", (V, h), one, "embedding")]
    if spec.embeddings.learned_positions:
        out.append(Tensor("embed_positions", (n_pos, h), one, "positions"))
    out += _attention_tensors(spec) + _mlp_tensors(spec) + _norm_tensors(spec)
    out += _expert_tensors(spec)
    if not spec.embeddings.tied:
        out.append(Tensor("lm_head.weight", (V, h), one, "head"))
    return out


def _layers(
    component: str, *layers: tuple[str, tuple[sympy.Expr, sympy.Expr], bool], conv1d: bool = False
) -> list[Tensor]:
    """Each layer's weight, of (out, in) (a ``conv1d``'s: (in, out)), then its bias of ``out``
    where the layer has one, in the order the layers come."""
    out: list[Tensor] = []
    for name, shape, bias in layers:
        out.append(Tensor(f"{name}.weight", shape, L, component))
        if bias:
            out.append(Tensor(f"{name}.bias", (shape[1] if conv1d else shape[0],), L, component))
    return out


def _attention_tensors(spec: ModelSpec) -> list[Tensor]:
    att = spec.attention
    out: list[Tensor] = []
    if att.fused_qkv and not spec.embeddings.learned_positions:
        # GPT-NeoX: one nn.Linear (out, in) = (3h, h) for q, k, v, then "dense"
        return _layers(
            "attention",
            ("attention.query_key_value", (3 * h, h), att.qkv_bias),
            ("attention.dense", (h, h), att.o_bias),
        )
    if att.fused_qkv:
        # GPT-2 keeps q, k, v in one Conv1D (in, out) = (h, 3h); its heads are MHA with a d = h
        return _layers(
            "attention",
            ("attn.c_attn", (h, 3 * h), att.qkv_bias),
            ("attn.c_proj", (h, h), att.o_bias),
            conv1d=True,
        )
    if spec.latent is not None:
        return _latent_tensors(spec)
    if att.fused_qkv_linear:  # Phi-3's qkv_proj: one nn.Linear of width (a + 2 a_kv) d
        out.append(Tensor("self_attn.qkv_proj.weight", ((a + 2 * a_kv) * d, h), L, "attention"))
    else:
        out += [
            Tensor("self_attn.q_proj.weight", (a * d, h), L, "attention"),
            Tensor("self_attn.k_proj.weight", (a_kv * d, h), L, "attention"),
            Tensor("self_attn.v_proj.weight", (a_kv * d, h), L, "attention"),
        ]
    out.append(Tensor("self_attn.o_proj.weight", (h, a * d), L, "attention"))
    out += _qk_norm_tensors(spec)
    if att.qkv_bias and att.fused_qkv_linear:
        out.append(Tensor("self_attn.qkv_proj.bias", ((a + 2 * a_kv) * d,), L, "attention"))
    elif att.qkv_bias:
        out += [
            Tensor("self_attn.q_proj.bias", (a * d,), L, "attention"),
            Tensor("self_attn.k_proj.bias", (a_kv * d,), L, "attention"),
            Tensor("self_attn.v_proj.bias", (a_kv * d,), L, "attention"),
        ]
    if att.o_bias:
        out.append(Tensor("self_attn.o_proj.bias", (h,), L, "attention"))
    return out


def _latent_tensors(spec: ModelSpec) -> list[Tensor]:
    """DeepSeek's multi-head latent attention (transformers' ``DeepseekV3Attention``)."""
    assert spec.latent is not None
    q_out = a * (d_n + d_r)
    if spec.latent.q_rank is None:
        out = [Tensor("self_attn.q_proj.weight", (q_out, h), L, "attention")]
    else:
        out = [
            Tensor("self_attn.q_a_proj.weight", (r_q, h), L, "attention"),
            Tensor("self_attn.q_a_layernorm.weight", (r_q,), L, "norms"),
            Tensor("self_attn.q_b_proj.weight", (q_out, r_q), L, "attention"),
        ]
    out += [
        Tensor("self_attn.kv_a_proj_with_mqa.weight", (r_kv + d_r, h), L, "attention"),
        Tensor("self_attn.kv_a_layernorm.weight", (r_kv,), L, "norms"),
        Tensor("self_attn.kv_b_proj.weight", (a * (d_n + d_v), r_kv), L, "attention"),
        Tensor("self_attn.o_proj.weight", (h, a * d_v), L, "attention"),
    ]
    return out


def _qk_norm_tensors(spec: ModelSpec) -> list[Tensor]:
    """Norm weights on queries and keys: per head (d: Qwen3, Gemma-3) or per projection (OLMo-2)."""
    if spec.attention.qk_norm == "head":
        return [
            Tensor("self_attn.q_norm.weight", (d,), L, "norms"),
            Tensor("self_attn.k_norm.weight", (d,), L, "norms"),
        ]
    if spec.attention.qk_norm == "projection":
        return [
            Tensor("self_attn.q_norm.weight", (a * d,), L, "norms"),
            Tensor("self_attn.k_norm.weight", (a_kv * d,), L, "norms"),
        ]
    return []


def _mlp_tensors(spec: ModelSpec) -> list[Tensor]:
    if spec.experts is not None:
        if len(spec.experts.layers) == spec.layers:
            return []  # no dense layer
        dense = L - L_e
        return [
            Tensor(f"mlp.{n}.weight", shape, dense, "mlp")
            for n, shape in (("gate_proj", (I, h)), ("up_proj", (I, h)), ("down_proj", (h, I)))
        ]
    bias = spec.mlp.bias
    if not spec.mlp.gated and spec.attention.fused_qkv and not spec.embeddings.learned_positions:
        # GPT-NeoX: nn.Linear dense_h_to_4h (I, h) and dense_4h_to_h (h, I)
        return _layers(
            "mlp", ("mlp.dense_h_to_4h", (I, h), bias), ("mlp.dense_4h_to_h", (h, I), bias)
        )
    if not spec.mlp.gated and not spec.attention.fused_qkv:
        # StarCoder2's plain MLP: nn.Linear c_fc (I, h) and c_proj (h, I)
        return _layers("mlp", ("mlp.c_fc", (I, h), bias), ("mlp.c_proj", (h, I), bias))
    if spec.mlp.fused_gate_up:  # Phi-3's gate_up_proj: one nn.Linear of width 2I
        out = [
            Tensor("mlp.gate_up_proj.weight", (2 * I, h), L, "mlp"),
            Tensor("mlp.down_proj.weight", (h, I), L, "mlp"),
        ]
        if spec.mlp.bias:
            out += [
                Tensor("mlp.gate_up_proj.bias", (2 * I,), L, "mlp"),
                Tensor("mlp.down_proj.bias", (h,), L, "mlp"),
            ]
        return out
    if not spec.mlp.gated:
        # the plain MLP we read is GPT-2's: Conv1D c_fc (h, I) and c_proj (I, h)
        return _layers("mlp", ("mlp.c_fc", (h, I), bias), ("mlp.c_proj", (I, h), bias), conv1d=True)
    out = [
        Tensor("mlp.gate_proj.weight", (I, h), L, "mlp"),
        Tensor("mlp.up_proj.weight", (I, h), L, "mlp"),
        Tensor("mlp.down_proj.weight", (h, I), L, "mlp"),
    ]
    if spec.mlp.bias:
        out += [
            Tensor("mlp.gate_proj.bias", (I,), L, "mlp"),
            Tensor("mlp.up_proj.bias", (I,), L, "mlp"),
            Tensor("mlp.down_proj.bias", (h,), L, "mlp"),
        ]
    return out


def _norm_tensors(spec: ModelSpec) -> list[Tensor]:
    one = sympy.Integer(1)
    if spec.norms.kind == "layernorm" and not spec.embeddings.learned_positions:
        # GPT-NeoX (fused QKV) and StarCoder2: LayerNorm (weight and bias) with LLaMA's names
        return [
            Tensor(f"{norm}.{kind}", (h,), count, "norms")
            for norm, count in (
                ("input_layernorm", L),
                ("post_attention_layernorm", L),
                ("final_layer_norm" if spec.attention.fused_qkv else "norm", one),
            )
            for kind in ("weight", "bias")
        ]
    if spec.norms.kind == "layernorm":  # weight and bias, GPT-2's names
        return [
            Tensor(f"{norm}.{kind}", (h,), count, "norms")
            for norm, count in (("ln_1", L), ("ln_2", L), ("ln_f", one))
            for kind in ("weight", "bias")
        ]
    if spec.norms.placement == "post":  # OLMo-2: after attention and after the MLP
        return [
            Tensor("post_attention_layernorm.weight", (h,), L, "norms"),
            Tensor("post_feedforward_layernorm.weight", (h,), L, "norms"),
            Tensor("norm.weight", (h,), one, "norms"),
        ]
    sandwich = (
        [
            Tensor("pre_feedforward_layernorm.weight", (h,), L, "norms"),
            Tensor("post_feedforward_layernorm.weight", (h,), L, "norms"),
        ]
        if spec.norms.placement == "sandwich"
        else []
    )
    return [
        Tensor("input_layernorm.weight", (h,), L, "norms"),
        Tensor("post_attention_layernorm.weight", (h,), L, "norms"),
        *sandwich,
        Tensor("norm.weight", (h,), one, "norms"),
    ]


def _expert_tensors(spec: ModelSpec) -> list[Tensor]:
    """The MoE layers' router, routed experts (3-D, as transformers 5 stores them) and shared
    experts; the router's ``e_score_correction_bias`` is a buffer, not a parameter."""
    ex = spec.experts
    if ex is None:
        return []
    out = [
        Tensor("mlp.gate.weight", (E, h), L_e, "router"),
        Tensor("mlp.experts.gate_up_proj", (E, 2 * I_e, h), L_e, "experts"),
        Tensor("mlp.experts.down_proj", (E, h, I_e), L_e, "experts"),
    ]
    if ex.shared_intermediate:
        # Qwen2-MoE names it shared_expert (with a gate), DeepSeek shared_experts
        name = "mlp.shared_expert" if ex.shared_gate else "mlp.shared_experts"
        out += [
            Tensor(f"{name}.gate_proj.weight", (I_s, h), L_e, "shared_experts"),
            Tensor(f"{name}.up_proj.weight", (I_s, h), L_e, "shared_experts"),
            Tensor(f"{name}.down_proj.weight", (h, I_s), L_e, "shared_experts"),
        ]
    if ex.shared_gate:
        out.append(Tensor("mlp.shared_expert_gate.weight", (1, h), L_e, "shared_experts"))
    return out


def param_exprs(spec: ModelSpec) -> dict[str, sympy.Expr]:
    """Parameter count per component (embedding, positions, attention, mlp, norms, head; and
    router, experts, shared_experts for a mixture-of-experts model)."""
    names = COMPONENTS + (MOE_COMPONENTS if spec.experts is not None else ())
    totals: dict[str, sympy.Expr] = {c: sympy.Integer(0) for c in names}
    for tensor in tensors(spec):
        totals[tensor.component] += tensor.count * tensor.numel
    return {name: sympy.factor_terms(sympy.expand(expr)) for name, expr in totals.items()}


def param_total_expr(spec: ModelSpec) -> sympy.Expr:
    """The whole model's parameter count as one expression in the model symbols."""
    return sympy.Add(*param_exprs(spec).values())


def param_counts(spec: ModelSpec) -> dict[str, int]:
    """Exact numeric parameter count per component."""
    return dict(_param_counts(spec))


@cache
def _param_counts(spec: ModelSpec) -> tuple[tuple[str, int], ...]:
    # a spec is frozen and hashable; its counts are asked for many times per estimate
    values = {k: sympy.Integer(v) for k, v in size_values(spec).items()}
    return tuple((name, int(expr.xreplace(values))) for name, expr in param_exprs(spec).items())


def param_count(spec: ModelSpec) -> int:
    """Exact numeric parameter count of the whole model."""
    return sum(param_counts(spec).values())


def _in_layer(t: Tensor, moe: bool) -> bool:
    """The tensor is one of a layer's own: every layer's, or a MoE (dense) layer's only."""
    return bool(t.count == L or t.count == (L_e if moe else L - L_e))


def layer_param_expr(spec: ModelSpec) -> sympy.Expr:
    """Parameters of one transformer layer, as an expression (what ZeRO-3 gathers at a time).

    For a mixture-of-experts model, the larger of a MoE layer (all its experts) and a dense one.
    """
    ex = spec.experts
    per_layer = sympy.Add(*(t.numel for t in tensors(spec) if _in_layer(t, ex is not None)))
    if ex is not None and len(ex.layers) < spec.layers:
        dense = sympy.Add(*(t.numel for t in tensors(spec) if _in_layer(t, False)))
        values = size_values(spec)
        if dense.subs(values) > per_layer.subs(values):
            per_layer = dense
    return sympy.factor_terms(sympy.expand(per_layer))


def layer_param_count(spec: ModelSpec) -> int:
    """Parameters of one transformer layer.

    >>> from vrammath.model.presets import load_model
    >>> layer_param_count(load_model("llama-7b"))
    202383360
    """
    return int(layer_param_expr(spec).subs(size_values(spec)))


def rank_share(tensor: Tensor, numel: int, tp: int = 1, ep: int = 1) -> Fraction:
    """Elements of a tensor of ``numel`` elements on one tensor/expert-parallel rank, Megatron's
    split: norms, learned positions and routers replicated, routed experts over ``tp * ep``
    (expert tensor parallelism equal to ``tp``), everything else over ``tp``. The one rule
    :func:`rank_param_count` and :func:`vrammath.terms.moe.layout.stage_params` share.

    >>> from vrammath.model.presets import load_model
    >>> spec = load_model("mixtral-8x7b")
    >>> expert = next(x for x in tensors(spec) if x.component == "experts")
    >>> rank_share(expert, 8 * 14336 * 4096, tp=2, ep=4)
    Fraction(58720256, 1)
    """
    if tensor.component in ("norms", "positions", "router"):
        return Fraction(numel)
    return Fraction(numel, tp * ep) if tensor.component == "experts" else Fraction(numel, tp)


def rank_param_count(spec: ModelSpec, tp: int = 1, pp: int = 1, ep: int = 1) -> int:
    """Parameters held by the fullest tensor/pipeline/expert-parallel rank, Megatron-style.

    Weight matrices, their biases and the vocabulary-parallel embedding and head are split over
    ``tp`` ranks; norms and learned positions are replicated. Stage 0 holds the embedding and
    ``ceil(L / pp)`` layers, the last stage the head and final norm (and, with tied embeddings and
    ``pp > 1``, its own copy of the embedding, as Megatron keeps one for the output layer).
    Routed experts are split over ``ep`` expert-parallel ranks and, within each, over ``tp``
    (Megatron's default expert tensor parallelism); a router is replicated. A stage's layers are
    its own mix of MoE and dense layers.

    >>> from vrammath.model.presets import load_model
    >>> rank_param_count(load_model("llama-7b")) == param_count(load_model("llama-7b"))
    True
    >>> rank_param_count(load_model("gpt-175b"), tp=8, pp=8)
    2822473728
    >>> rank_param_count(load_model("mixtral-8x7b"), ep=8)
    7242780672
    """
    values = size_values(spec)
    all_tensors = tensors(spec)

    def split(t: Tensor) -> Fraction:
        return rank_share(t, int(t.numel.subs(values)), tp, ep)

    moe_ids = set(spec.experts.layers) if spec.experts is not None else set()
    moe_layer = sum((split(t) for t in all_tensors if _in_layer(t, True)), Fraction(0))
    dense_layer = sum((split(t) for t in all_tensors if _in_layer(t, False)), Fraction(0))
    per_stage = -(-spec.layers // pp)

    def stage(i: int) -> Fraction:
        # every stage counts ceil(L / pp) layers; past the last, layers are like the last one
        ids = (min(j, spec.layers - 1) for j in range(i * per_stage, (i + 1) * per_stage))
        return sum((moe_layer if j in moe_ids else dense_layer for j in ids), Fraction(0))

    def ends(*components: str) -> Fraction:
        return sum(
            (split(t) for t in all_tensors if t.count == 1 and t.component in components),
            Fraction(0),
        )

    first = stage(0) + ends("embedding", "positions")
    if pp == 1:
        return math.ceil(first + ends("norms", "head"))
    last = stage(pp - 1) + ends("norms", "head")
    if spec.tied_embeddings:
        last += ends("embedding")
    middle = max((stage(i) for i in range(1, pp - 1)), default=Fraction(0))
    return math.ceil(max(first, last, middle))


def fp32_param_expr(spec: ModelSpec) -> sympy.Expr:
    """Parameters transformers keeps in fp32 whatever the model's dtype: DeepSeek-V3's routers
    (``_keep_in_fp32_modules_strict``), ``E h L_e``; 0 for every other model.

    >>> from vrammath.model.presets import load_model
    >>> fp32_param_expr(load_model("deepseek-v3")), fp32_param_expr(load_model("mixtral-8x7b"))
    (E*L_e*h, 0)
    """
    if spec.experts is None or not spec.experts.router_fp32:
        return sympy.Integer(0)
    return sympy.Add(*(t.count * t.numel for t in tensors(spec) if t.component == "router"))


def largest_tensor_numel(spec: ModelSpec, ep: int = 1) -> int:
    """Elements of the largest single parameter tensor (for-loop optimizer temporaries); with
    ``ep`` expert-parallel ranks, a routed-expert tensor holds its rank's ``E / ep`` experts."""
    values = size_values(spec)
    return max(
        int(t.numel.xreplace(values)) // (ep if t.component == "experts" else 1)
        for t in tensors(spec)
    )


__all__ = [
    "COMPONENTS",
    "MOE_COMPONENTS",
    "Tensor",
    "fp32_param_expr",
    "largest_tensor_numel",
    "layer_param_count",
    "layer_param_expr",
    "param_count",
    "param_counts",
    "param_exprs",
    "param_total_expr",
    "rank_param_count",
    "rank_share",
    "size_values",
    "tensors",
]
