"""Activation memory as Korthikanti et al. (2022) published it.

``korthikanti_*`` reproduce Korthikanti et al. (2022) exactly as published: a GPT block with a
4h GeLU MLP, 16-bit activations, 1-byte dropout masks, layer-norm statistics ignored. The
assumptions are named parameters with the published defaults, so a reader can see (and change)
each of them. What transformers' implementations keep is in :mod:`vrammath.terms.activations.model`.

Examples
========

>>> from vrammath.notation.symbols import s, b, h, a
>>> korthikanti_layer_bytes()
5*a*b*s**2 + 34*b*h*s
>>> korthikanti_layer_bytes("tp", "selective")
10*b*h*s + 24*b*h*s/t
"""

from __future__ import annotations

import sympy

from vrammath.notation.signatures import after
from vrammath.notation.symbols import L, V, a, b, h, m, p, s, t
from vrammath.terms.activations.parts import (
    PARALLEL,
    RECOMPUTE,
    SCHEDULES,
    Number,
    Parallel,
    Recompute,
    Schedule,
    _check,
    _number,
    _total,
    _tp_divisors,
)


def korthikanti_layer_terms(
    parallel: Parallel = "none",
    recompute: Recompute = "none",
    *,
    activation_bytes: Number = 2,
    dropout_mask_bytes: Number = 1,
    ffn_multiple: Number = 4,
) -> dict[str, sympy.Expr]:
    """Bytes of activations one transformer layer keeps, per block (attention, MLP, norms).

    Explanation
    ===========

    The paper's Section 4.1 counts, for a GPT layer with activations of ``activation_bytes``
    bytes per element and dropout masks of ``dropout_mask_bytes`` bytes per element:

    * attention: the QKV input (sbh), Q and K (2sbh), the softmax output (a s^2 b), its dropout
      mask and output (a s^2 b each), V (sbh), the output projection input (sbh) and the
      attention-output dropout mask -- 11sbh + 5as^2b with the defaults;
    * MLP: the first linear's input (sbh), the GeLU input and output (f sbh each, f = 4) and the
      dropout mask -- 19sbh;
    * norms: the inputs of the two layer norms -- 4sbh.

    Tensor parallelism (``"tp"``) divides by t what lives inside the column/row-parallel regions
    (Q, K, V, the score-sized tensors, the projection input, the GeLU tensors); sequence
    parallelism (``"tp_sp"``) divides the rest too. Selective recomputation drops the score-sized
    terms (softmax, its dropout mask and output). Full recomputation keeps only the layer input,
    2sbh (reported under ``"norms"``'s neighbour ``"input"``; the blocks are zero).

    Examples
    ========

    >>> terms = korthikanti_layer_terms()
    >>> terms["attention"], terms["mlp"], terms["norms"]
    (5*a*b*s**2 + 11*b*h*s, 19*b*h*s, 4*b*h*s)
    >>> korthikanti_layer_terms(recompute="full")["input"]
    2*b*h*s

    Parameters
    ==========

    parallel : "none", "tp" or "tp_sp"
        No model parallelism, tensor parallelism, or tensor + sequence parallelism.
    recompute : "none", "selective" or "full"
        Activation recomputation policy.
    activation_bytes : int or Expr
        Bytes per element of activations (the paper assumes 16-bit: 2).
    dropout_mask_bytes : int or Expr
        Bytes per element of a dropout mask (the paper assumes 1).
    ffn_multiple : int or Expr
        MLP intermediate size over h (the paper's GPT: 4).

    See Also
    ========

    korthikanti_layer_bytes, korthikanti_first_stage_bytes

    References
    ==========

    .. [1] V. Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
       Models", arXiv:2205.05198 (2022), Sections 4.1-4.3, 5.
    """
    inner, outer = _tp_divisors(parallel)
    _check("recompute", recompute, RECOMPUTE)
    B = _number("activation_bytes", activation_bytes)
    M = _number("dropout_mask_bytes", dropout_mask_bytes)
    f = _number("ffn_multiple", ffn_multiple)
    sbh = s * b * h
    score = a * s**2 * b
    if recompute == "full":
        zero = sympy.Integer(0)
        return {"attention": zero, "mlp": zero, "norms": zero, "input": B * sbh}
    attn_outer = (B + M) * sbh  # QKV input + output dropout mask
    attn_inner = 4 * B * sbh  # Q, K, V, output projection input
    attn_score = (2 * B + M) * score  # softmax output, its dropout mask, dropout output
    if recompute == "selective":
        attn_score = sympy.Integer(0)
    mlp_outer = (B + M) * sbh  # first linear input + dropout mask
    mlp_inner = 2 * B * f * sbh  # GeLU input and output
    norms = 2 * B * sbh
    return {
        "attention": attn_outer * outer + (attn_inner + attn_score) * inner,
        "mlp": mlp_outer * outer + mlp_inner * inner,
        "norms": norms * outer,
        "input": sympy.Integer(0),
    }


@after(korthikanti_layer_terms)
def korthikanti_layer_bytes(terms: dict[str, sympy.Expr]) -> sympy.Expr:
    """Bytes of activations one transformer layer keeps for backward (Korthikanti et al. 2022):
    the sum of :func:`korthikanti_layer_terms`, which takes the same arguments.

    Explanation
    ===========

    The published per-layer totals, with the paper's assumptions as named parameters:

    * no parallelism: sbh(34 + 5as/h)
    * tensor parallel: sbh(10 + 24/t + 5as/(ht))
    * tensor + sequence parallel: sbh/t (34 + 5as/h)
    * selective recomputation: sbh(10 + 24/t) with TP, 34sbh/t with TP + SP
    * full recomputation: 2sbh (only the layer input is kept)

    Examples
    ========

    >>> from sympy import factor
    >>> from vrammath.notation.symbols import s, b, h, a, t
    >>> factor(korthikanti_layer_bytes("tp_sp"))
    b*s*(5*a*s + 34*h)/t
    >>> korthikanti_layer_bytes(recompute="full")
    2*b*h*s
    >>> korthikanti_layer_bytes().subs({s: 512, b: 1, h: 4096, a: 32}) / 2**20
    108

    Parameters
    ==========

    parallel, recompute, activation_bytes, dropout_mask_bytes, ffn_multiple
        As in :func:`korthikanti_layer_terms`.

    See Also
    ========

    korthikanti_layer_terms, korthikanti_first_stage_bytes

    References
    ==========

    .. [1] V. Korthikanti et al., arXiv:2205.05198 (2022), Table 2.
    """
    return _total(terms)


def korthikanti_interleave_factor(schedule: Schedule = "1f1b") -> sympy.Expr:
    """Factor on the first stage's activations: 1, or 1 + (p-1)/(pm) for the interleaved schedule.

    >>> korthikanti_interleave_factor("interleaved")
    1 + (p - 1)/(m*p)
    """
    _check("schedule", schedule, SCHEDULES)
    if schedule == "1f1b":
        return sympy.Integer(1)
    return 1 + (p - 1) / (p * m)


def korthikanti_extra_terms(
    parallel: Parallel = "tp_sp",
    *,
    last_stage_on_first: bool = False,
    activation_bytes: Number = 2,
    dropout_mask_bytes: Number = 1,
) -> dict[str, sympy.Expr]:
    """The non-layer activations of the paper's Section 4.3.

    Explanation
    ===========

    The embedding dropout mask, sbhp/t (p micro-batches in flight on the first stage). When the
    first stage is also the last (p = 1, ``last_stage_on_first=True``): the final layer norm's
    input 2sbh/t, the output layer's input 2sbh/t and the fp32 logits 4sbv/t. The paper divides
    all of them by t (sequence parallelism for the norm and dropout, vocabulary-parallel logits);
    with ``parallel="none"`` t is 1.

    >>> korthikanti_extra_terms(last_stage_on_first=True)["logits"]
    4*V*b*s/t

    References
    ==========

    .. [1] V. Korthikanti et al., arXiv:2205.05198 (2022), Section 4.3.
    """
    _check("parallel", parallel, PARALLEL)
    B = _number("activation_bytes", activation_bytes)
    M = _number("dropout_mask_bytes", dropout_mask_bytes)
    div = sympy.Integer(1) if parallel == "none" else t
    pp = sympy.Integer(1) if last_stage_on_first else p
    terms = {"embedding_dropout": M * s * b * h * pp / div}
    if last_stage_on_first:
        terms["final_norm"] = B * s * b * h / div
        terms["output_input"] = B * s * b * h / div
        terms["logits"] = 4 * s * b * V / div
    return terms


def korthikanti_first_stage_bytes(
    parallel: Parallel = "tp_sp",
    recompute: Recompute = "none",
    *,
    schedule: Schedule = "1f1b",
    last_stage_on_first: bool = False,
    extras: bool = True,
    activation_bytes: Number = 2,
    dropout_mask_bytes: Number = 1,
    ffn_multiple: Number = 4,
) -> sympy.Expr:
    """Activation bytes of the first pipeline stage, the one that holds the most (Section 4.3).

    Explanation
    ===========

    With the 1F1B schedule the first stage keeps p micro-batches of L/p layers in flight: L
    layers' worth whatever p is. The interleaved schedule multiplies that by 1 + (p-1)/(pm).
    ``extras`` adds :func:`korthikanti_extra_terms` (set ``last_stage_on_first`` for p = 1).

    Examples
    ========

    >>> from sympy import factor
    >>> from vrammath.notation.symbols import L, s, b, h, a, t, V
    >>> factor(korthikanti_first_stage_bytes(extras=False))
    L*b*s*(5*a*s + 34*h)/t
    >>> e = korthikanti_first_stage_bytes(last_stage_on_first=True)
    >>> factor(e - L * korthikanti_layer_bytes("tp_sp") - 4*s*b*h/t*(1 + V/h))
    b*h*s/t

    The remaining sbh/t is the embedding dropout mask at p = 1.

    Parameters
    ==========

    parallel, recompute, activation_bytes, dropout_mask_bytes, ffn_multiple
        As in :func:`korthikanti_layer_terms`.
    schedule : "1f1b" or "interleaved"
        Pipeline schedule; "interleaved" uses m model chunks per stage.
    last_stage_on_first : bool
        True when p = 1, so the output layer and the logits are on this stage.
    extras : bool
        Include the embedding dropout and (for p = 1) the output-side terms.

    References
    ==========

    .. [1] V. Korthikanti et al., arXiv:2205.05198 (2022), Section 4.3, Equation 5.
    """
    # the assumptions the layers and the extras share
    widths = {"activation_bytes": activation_bytes, "dropout_mask_bytes": dropout_mask_bytes}
    layer = korthikanti_layer_bytes(parallel, recompute, ffn_multiple=ffn_multiple, **widths)
    total = L * layer * korthikanti_interleave_factor(schedule)
    if extras:
        extra = korthikanti_extra_terms(parallel, last_stage_on_first=last_stage_on_first, **widths)
        total = total + sum(extra.values(), sympy.Integer(0))
    return total


__all__ = [
    "korthikanti_extra_terms",
    "korthikanti_first_stage_bytes",
    "korthikanti_interleave_factor",
    "korthikanti_layer_bytes",
    "korthikanti_layer_terms",
]
