"""Korthikanti-style activations of mixture-of-experts and latent-attention layers, per pipeline
rank of a training layout, under a named activation policy.

Explanation
===========

A layer keeps its attention (:func:`vrammath.terms.korthikanti.latent.mla_attention_terms` for latent
attention, Korthikanti et al.'s GPT attention otherwise), its MLP
(:func:`vrammath.terms.korthikanti.moe.moe_mlp_terms` or :func:`vrammath.terms.korthikanti.moe.dense_mlp_terms`)
and the two norms' inputs ``2 B s b h``. With tensor parallelism sequence parallelism is taken
on (Megatron-Core requires it for MoE with ``t > 1``).

A pipeline rank keeps ``f`` micro-batches of one stage's layers: ``f = p`` for 1F1B's first stage
(Korthikanti et al.'s ``L`` layers' worth) and ``p + 1`` under DualPipe (DeepSeek-V3's Table 2).
Layers differ (dense and MoE), so a stage's share is the model's per-micro-batch activations of
all ``n`` layers (the MTP layers included) over ``p``:

.. math::

    A_{rank} = \\frac{f}{p} \\sum_{l=1}^{n} A_l + [\\text{head on the rank}]\\,(1 + n_{mtp})
    \\left(2 B s b h + 2 B s b h + 4 s b V\\right) / t

the last term being Korthikanti et al.'s final norm, output-layer input and fp32 logits (for the
main head and each MTP module's), held for one micro-batch on the rank that holds the head.

An :class:`ActivationPolicy` names the assumptions: the published 16-bit convention with a flash
kernel (no ``a s^2 b`` tensors, Korthikanti's selective recomputation), or DeepSeek-V3's own
(Sections 3.2.3 and 3.3.3: RMSNorms, MLA up-projections and the experts' SwiGLU output
recomputed; GEMM inputs cached in FP8, the attention output projection's in E5M6), with the
routing weights applied inside the experts' activation as Megatron-Core's grouped experts do
(the report does not say where its combine takes them; keeping the experts' outputs instead adds
``2 B s b k h`` per MoE layer: the policy ``deepseek-v3-outputs-kept``).

This module composes nothing itself. :func:`vrammath.compose.estimate.estimate` is the one composition:
for a setup with ``Setup.korthikanti_moe`` the ``activations`` row of
:data:`vrammath.compose.table.TERMS` is :func:`layout_activation_exprs`' ``layers`` and its
``logits_loss`` row the ``head``; the state rows hold ``P`` of the busiest pipeline rank
(:func:`vrammath.compose.moe_stage.busiest_rank`, :func:`vrammath.compose.moe_stage.rank_values`) at the
recipe's widths, a sharded row over ``2 N_d`` ranks under DualPipe
(:func:`vrammath.compose.moe_stage.stage_copies`), and the gradients stay resident beside the
activations (:func:`vrammath.compose.peak.korthikanti_phase_peaks`). The layout answers
(:func:`vrammath.answers.moe_layouts.layout_memory`,
:func:`vrammath.answers.moe_layouts.deepseek_v3_training_memory`) build that
:class:`~vrammath.compose.setup.Setup` and read the estimate.

Examples
========

>>> from vrammath.model.presets import load_model
>>> from vrammath.terms.moe.layout import Layout
>>> on_rank = layout_activation_exprs(load_model("mixtral-8x7b"), Layout(64, pp=4, ep=8))
>>> sorted(on_rank), sorted(str(x) for x in on_rank["layers"].free_symbols)
(['head', 'layers'], ['E', 'I_e', 'b', 'h', 'k_e', 's'])

References
==========

.. [1] DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv:2412.19437 (2024): Section 3.2
   (layout, DualPipe and Table 2, memory savings), Section 3.3 (FP8, precision of each state),
   Section 4.2 (sequence length 4K), Section 2.1.2 (no token dropping).
.. [2] V. Korthikanti et al., arXiv:2205.05198 (2022), Sections 4.1-4.3.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import sympy

from vrammath.model.params import size_values
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError, positive_int
from vrammath.notation.symbols import b, h, k_e, s, t
from vrammath.terms.activations.parts import Parallel, Recompute
from vrammath.terms.korthikanti.dense import korthikanti_extra_terms, korthikanti_layer_terms
from vrammath.terms.korthikanti.latent import mla_attention_terms
from vrammath.terms.korthikanti.moe import Ratio, dense_mlp_terms, moe_mlp_terms
from vrammath.terms.moe.layout import (
    Layout,
    check_layout,
)


@dataclass(frozen=True)
class ActivationPolicy:
    """What a layer keeps: bytes per element of activations, dropout masks, router
    probabilities and cached GEMM inputs (None: ``activation_bytes``), the output projection's
    cached input (None: the GEMM inputs'), and what is recomputed."""

    name: str
    activation_bytes: int = 2
    dropout_mask_bytes: int = 0
    router_bytes: int = 4
    linear_input_bytes: int | None = None
    output_input_bytes: sympy.Rational | None = None
    recompute: Recompute = "selective"
    recompute_norm: bool = False
    recompute_up_proj: bool = False
    recompute_swiglu: bool = False
    weights_in_activation: bool = False


#: Korthikanti et al.'s 16-bit convention with a flash attention kernel (no score tensors) and
#: no dropout (DeepSeek-V3, Mixtral and Qwen-MoE train without it); fp32 router probabilities.
BF16_FLASH = ActivationPolicy("bf16-flash")
#: DeepSeek-V3's report, Sections 3.2.3 and 3.3.3.
DEEPSEEK_V3_POLICY = ActivationPolicy(
    "deepseek-v3",
    linear_input_bytes=1,
    output_input_bytes=sympy.Rational(3, 2),
    recompute_norm=True,
    recompute_up_proj=True,
    recompute_swiglu=True,
    weights_in_activation=True,
)
#: DeepSeek-V3's policy with the experts' outputs kept for the combine (the routing weights
#: applied after the experts: ``2 B s b k h`` more per MoE layer).
DEEPSEEK_V3_OUTPUTS_KEPT = replace(
    DEEPSEEK_V3_POLICY, name="deepseek-v3-outputs-kept", weights_in_activation=False
)
#: The named policies, what ``Setup.activation_policy`` selects.
POLICIES: dict[str, ActivationPolicy] = {
    x.name: x for x in (BF16_FLASH, DEEPSEEK_V3_POLICY, DEEPSEEK_V3_OUTPUTS_KEPT)
}


def policy_name(policy: ActivationPolicy | str) -> str:
    """The name under which ``policy`` is registered in :data:`POLICIES` (a policy equal to a
    named one but for its name counts as that one).

    >>> policy_name(replace(DEEPSEEK_V3_POLICY, name="mine"))
    'deepseek-v3'
    >>> policy_name(replace(BF16_FLASH, activation_bytes=4))
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: policy: must be one of the named policies bf16-flash, deepseek-v3, deepseek-v3-outputs-kept (got 'bf16-flash')
    """
    allowed = "must be one of the named policies " + ", ".join(POLICIES)
    if isinstance(policy, str):
        if policy not in POLICIES:
            raise InputError("policy", allowed, got=policy)
        return policy
    for name, known in POLICIES.items():
        if replace(known, name=policy.name) == policy:
            return name
    raise InputError("policy", allowed, got=policy.name)


def moe_layer_exprs(
    spec: ModelSpec,
    parallel: str = "none",
    policy: ActivationPolicy = BF16_FLASH,
    *,
    capacity_factor: Ratio | None = None,
    imbalance: Ratio = 1,
    pad: bool = True,
) -> dict[str, sympy.Expr]:
    """Bytes one ``dense`` and one ``moe`` layer of ``spec`` keep per micro-batch on one rank.

    >>> from vrammath.model.presets import load_model
    >>> layers = moe_layer_exprs(load_model("deepseek-v3"), policy=DEEPSEEK_V3_POLICY)
    >>> layers["moe"]
    4*E*b*s + 2*I_e*b*k_e*s + 3*I_s*b*s + 3*a*b*d_v*s/2 + b*d_r*s + b*h*k_e*s + 5*b*h*s + 4*b*k_e*s + b*r_kv*s + b*r_q*s
    """
    pol = policy
    par: Parallel = "tp_sp" if parallel != "none" else "none"
    B, M, X = pol.activation_bytes, pol.dropout_mask_bytes, pol.linear_input_bytes
    if spec.latent is not None:
        attn = mla_attention_terms(
            par,
            pol.recompute,
            q_lora=spec.latent.q_rank is not None,
            recompute_up_proj=pol.recompute_up_proj,
            activation_bytes=B,
            dropout_mask_bytes=M,
            linear_input_bytes=X,
            output_input_bytes=pol.output_input_bytes,
        )
        attention = sum(attn.values(), sympy.Integer(0))
    else:
        gpt = korthikanti_layer_terms(par, pol.recompute, activation_bytes=B, dropout_mask_bytes=M)
        attention = gpt["attention"] + gpt["input"]
    zero = sympy.Integer(0)
    if pol.recompute == "full":  # only the layer input, the attention's "input"
        return {"dense": sympy.expand(attention), "moe": sympy.expand(attention)}
    norms = 2 * B * s * b * h / (t if par == "tp_sp" else 1)
    dense = dense_mlp_terms(
        par,
        activation_bytes=B,
        dropout_mask_bytes=M,
        linear_input_bytes=X,
        recompute_norm=pol.recompute_norm,
    )
    ex = spec.experts
    moe = moe_mlp_terms(
        par,
        capacity_factor=capacity_factor,
        imbalance=imbalance,
        pad=pad,
        shared=ex is not None and ex.shared_intermediate > 0,
        activation_bytes=B,
        router_bytes=pol.router_bytes,
        dropout_mask_bytes=M,
        linear_input_bytes=X,
        recompute_swiglu=pol.recompute_swiglu,
        recompute_norm=pol.recompute_norm,
        weights_in_activation=pol.weights_in_activation,
    )
    return {
        "dense": sympy.expand(attention + norms + sum(dense.values(), zero)),
        "moe": sympy.expand(attention + norms + sum(moe.values(), zero)),
    }


def layer_counts(spec: ModelSpec) -> dict[str, int]:
    """Dense and MoE transformer layers, the multi-token-prediction layers (MoE) included.

    >>> from vrammath.model.presets import load_model
    >>> layer_counts(load_model("deepseek-v3"))
    {'dense': 3, 'moe': 59}
    """
    moe = len(spec.experts.layers) if spec.experts is not None else 0
    return {"dense": spec.layers - moe, "moe": moe + spec.mtp_layers}


def _numbers(
    spec: ModelSpec, layout: Layout, micro_batch: int, seq_len: int
) -> dict[sympy.Symbol, int]:
    top_k = {k_e: spec.experts.top_k} if spec.experts is not None else {}
    return {**size_values(spec), **top_k, b: micro_batch, s: seq_len, t: layout.tp}


def layout_activation_exprs(
    spec: ModelSpec,
    layout: Layout,
    policy: ActivationPolicy = BF16_FLASH,
    *,
    capacity_factor: Ratio | None = None,
    imbalance: Ratio = 1,
    pad: bool = True,
    head_on_rank: bool = True,
) -> dict[str, sympy.Expr]:
    """Activation bytes on one rank as expressions (the module's Explanation): ``layers``
    (``f / p`` times the per-micro-batch sum over the layers) and, when ``head_on_rank``,
    ``head`` (the final norm, output-layer input and fp32 logits of one micro-batch, main and
    MTP heads). What :func:`vrammath.compose.estimate.estimate` builds for a mixture-of-experts or
    latent-attention setup under Korthikanti-style activations.

    >>> from vrammath.model.presets import load_model
    >>> exprs = layout_activation_exprs(load_model("mixtral-8x7b"), Layout(16, pp=2, ep=8))
    >>> exprs["head"]
    4*V*b*s/t + 4*b*h*s/t
    """
    per_layer = moe_layer_exprs(
        spec,
        "tp_sp" if layout.tp > 1 else "none",
        policy,
        capacity_factor=capacity_factor,
        imbalance=imbalance,
        pad=pad,
    )
    counts = layer_counts(spec)
    all_layers = sum((counts[k] * per_layer[k] for k in counts), sympy.Integer(0))
    in_flight = layout.pp + 1 if layout.schedule == "dualpipe" else layout.pp
    out = {"layers": sympy.Rational(in_flight, layout.pp) * all_layers}
    if head_on_rank:
        extra = korthikanti_extra_terms(
            "tp_sp",
            last_stage_on_first=True,
            activation_bytes=policy.activation_bytes,
            dropout_mask_bytes=0,
        )
        out["head"] = (1 + spec.mtp_layers) * sum(extra.values(), sympy.Integer(0))
    return out


def layout_activation_bytes(
    spec: ModelSpec,
    layout: Layout,
    micro_batch: int = 1,
    seq_len: int = 4096,
    policy: ActivationPolicy = BF16_FLASH,
    *,
    capacity_factor: Ratio | None = None,
    imbalance: Ratio = 1,
    pad: bool = True,
    head_on_rank: bool = True,
) -> dict[str, int]:
    """:func:`layout_activation_exprs` evaluated (each part rounded up).

    >>> from vrammath.model.presets import load_model
    >>> acts = layout_activation_bytes(load_model("mixtral-8x7b"), Layout(8, ep=8), 1, 4096)
    >>> {k: round(v / 2**30, 2) for k, v in acts.items()}  # GiB
    {'layers': 33.0, 'head': 0.55}
    """
    check_layout(spec, layout)
    positive_int("micro_batch", micro_batch)
    positive_int("seq_len", seq_len)
    values = _numbers(spec, layout, micro_batch, seq_len)
    exprs = layout_activation_exprs(
        spec,
        layout,
        policy,
        capacity_factor=capacity_factor,
        imbalance=imbalance,
        pad=pad,
        head_on_rank=head_on_rank,
    )
    return {k: int(sympy.ceiling(e.xreplace(values))) for k, e in exprs.items()}


__all__ = [
    "BF16_FLASH",
    "DEEPSEEK_V3_OUTPUTS_KEPT",
    "DEEPSEEK_V3_POLICY",
    "POLICIES",
    "ActivationPolicy",
    "layer_counts",
    "layout_activation_bytes",
    "layout_activation_exprs",
    "moe_layer_exprs",
    "policy_name",
]
