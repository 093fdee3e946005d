"""Per-GPU memory of a mixture-of-experts training layout: Korthikanti-style activations composed
with the layout's model states, and DeepSeek-V3 on 2,048 H800s.

Explanation
===========

A layer keeps its attention (:func:`vrammath.latent_korthikanti.mla_attention_terms` for latent
attention, Korthikanti et al.'s GPT attention otherwise), its MLP
(:func:`vrammath.moe_capacity.moe_mlp_terms` or :func:`vrammath.moe_capacity.dense_mlp_terms`)
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
``2 B s b k h`` per MoE layer).

Examples
========

>>> answer = deepseek_v3_training_memory()
>>> answer.rank.stages, round(answer.total / 2**30, 1)  # GiB on the busiest H800
((0, 15), 75.1)

References
==========

.. [1] DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv:2412.19437 (2024): Section 3.2
   (layout, DualPipe and Table 2, memory savings), Section 3.3 (FP8, precision of each state),
   Section 4.2 (sequence length 4K), Section 2.1.2 (no token dropping).
.. [2] V. Korthikanti et al., arXiv:2205.05198 (2022), Sections 4.1-4.3.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from vrammath.activation_parts import Parallel, Recompute
from vrammath.errors import positive_int
from vrammath.korthikanti import korthikanti_extra_terms, korthikanti_layer_terms
from vrammath.latent_korthikanti import mla_attention_terms
from vrammath.model import ModelSpec
from vrammath.moe_capacity import Ratio, dense_mlp_terms, moe_mlp_terms
from vrammath.moe_layout import (
    DEEPSEEK_V3_RECIPE,
    Layout,
    RankParams,
    check_layout,
    layout_state_bytes,
)
from vrammath.params import size_values
from vrammath.presets import load_model
from vrammath.states import Recipe, recipe
from vrammath.symbols import b, h, k_e, s, t


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

    >>> from vrammath.presets import load_model
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

    >>> from vrammath.presets import load_model
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
    """Activation bytes on one rank (the module's Explanation): ``layers`` (``f / p`` times the
    per-micro-batch sum over the layers) and ``head`` (the final norm, output-layer input and
    fp32 logits of one micro-batch, main and MTP heads, when ``head_on_rank``).

    >>> from vrammath.presets import load_model
    >>> acts = layout_activation_bytes(load_model("mixtral-8x7b"), Layout(8, ep=8), 1, 4096)
    >>> {k: round(v / 2**30, 2) for k, v in acts.items()}  # GiB
    {'layers': 33.0, 'head': 0.55}
    """
    check_layout(spec, layout)
    positive_int("micro_batch", micro_batch)
    positive_int("seq_len", seq_len)
    values = _numbers(spec, layout, micro_batch, seq_len)
    per_layer = moe_layer_exprs(
        spec,
        "tp_sp" if layout.tp > 1 else "none",
        policy,
        capacity_factor=capacity_factor,
        imbalance=imbalance,
        pad=pad,
    )
    counts = layer_counts(spec)
    all_layers = sum(counts[k] * per_layer[k] for k in counts)
    in_flight = layout.pp + 1 if layout.schedule == "dualpipe" else layout.pp
    layers = sympy.Rational(in_flight, layout.pp) * all_layers
    out = {"layers": int(sympy.ceiling(layers.xreplace(values)))}
    if head_on_rank:
        extra = korthikanti_extra_terms(
            "tp_sp",
            last_stage_on_first=True,
            activation_bytes=policy.activation_bytes,
            dropout_mask_bytes=0,
        )
        head_expr = (1 + spec.mtp_layers) * sum(extra.values(), sympy.Integer(0))
        out["head"] = int(sympy.ceiling(head_expr.xreplace(values)))
    return out


@dataclass(frozen=True)
class LayoutMemory:
    """Per-GPU memory of the busiest rank of a layout: its parameters, model states and
    activations (bytes), with the assumptions that produced them."""

    spec: ModelSpec
    layout: Layout
    recipe: Recipe
    policy: ActivationPolicy
    micro_batch: int
    seq_len: int
    rank: RankParams
    states: dict[str, int]
    activations: dict[str, int]

    @property
    def total(self) -> int:
        """Model states plus activations, bytes."""
        return sum(self.states.values()) + sum(self.activations.values())


def layout_memory(
    spec: ModelSpec,
    layout: Layout,
    recipe_name: Recipe | str = "bf16-mixed",
    optimizer: str = "adamw",
    *,
    micro_batch: int = 1,
    seq_len: int = 4096,
    policy: ActivationPolicy = BF16_FLASH,
    capacity_factor: Ratio | None = None,
    imbalance: Ratio = 1,
    pad: bool = True,
) -> LayoutMemory:
    """The busiest rank's model states (:func:`vrammath.moe_layout.layout_state_bytes`) and
    activations (:func:`layout_activation_bytes`, with the head when that rank holds the last
    stage).

    >>> from vrammath.presets import load_model
    >>> mem = layout_memory(load_model("mixtral-8x7b"), Layout(64, pp=4, ep=8))
    >>> mem.rank.stages, round(mem.total / 2**30, 1)
    ((3,), 48.7)
    """
    rank, states = layout_state_bytes(spec, layout, recipe_name, optimizer)
    acts = layout_activation_bytes(
        spec,
        layout,
        micro_batch,
        seq_len,
        policy,
        capacity_factor=capacity_factor,
        imbalance=imbalance,
        pad=pad,
        head_on_rank=layout.pp - 1 in rank.stages,
    )
    rec = recipe_name if isinstance(recipe_name, Recipe) else recipe(recipe_name)
    return LayoutMemory(spec, layout, rec, policy, micro_batch, seq_len, rank, states, acts)


#: The published training layout of DeepSeek-V3 (report Section 3.2), 2,048 H800s with 16-way
#: pipeline parallelism under DualPipe, 64-way expert parallelism over 8 nodes, ZeRO-1 data
#: parallelism and no tensor parallelism.
DEEPSEEK_V3_LAYOUT = Layout(2048, pp=16, tp=1, ep=64, zero=1, schedule="dualpipe")


def deepseek_v3_training_memory(
    micro_batch: int = 1,
    seq_len: int = 4096,
    policy: ActivationPolicy = DEEPSEEK_V3_POLICY,
    *,
    capacity_factor: Ratio | None = None,
    imbalance: Ratio = 1,
) -> LayoutMemory:
    """Per-GPU memory of DeepSeek-V3's pre-training on 2,048 H800s, from the formulas.

    The published layout (:data:`DEEPSEEK_V3_LAYOUT`), precision
    (:data:`~vrammath.moe_layout.DEEPSEEK_V3_RECIPE`: bf16 weights, fp32 gradients and master
    weights, bf16 AdamW moments),
    sequences of 4,096 tokens (Section 4.2), dropless routing (Section 2.1.2) with balanced
    load (``imbalance`` 1). The micro-batch is not published: one sequence is assumed.

    >>> answer = deepseek_v3_training_memory()
    >>> {k: round(v / 2**30, 2) for k, v in answer.states.items()}
    {'weights': 9.95, 'gradients': 19.91, 'master': 0.72, 'optimizer': 0.72}

    References
    ==========

    .. [1] DeepSeek-AI, arXiv:2412.19437 (2024), Sections 2.1.2, 3.2, 3.3 and 4.2.
    """
    return layout_memory(
        load_model("deepseek-v3"),
        DEEPSEEK_V3_LAYOUT,
        DEEPSEEK_V3_RECIPE,
        "adamw",
        micro_batch=micro_batch,
        seq_len=seq_len,
        policy=policy,
        capacity_factor=capacity_factor,
        imbalance=imbalance,
        pad=True,
    )


__all__ = [
    "BF16_FLASH",
    "DEEPSEEK_V3_LAYOUT",
    "DEEPSEEK_V3_POLICY",
    "ActivationPolicy",
    "LayoutMemory",
    "deepseek_v3_training_memory",
    "layer_counts",
    "layout_activation_bytes",
    "layout_memory",
    "moe_layer_exprs",
]
