"""Activations of a mixture-of-experts MLP, Korthikanti-style, with and without a capacity factor.

Explanation
===========

Token-dropping MoE (GShard [2]_, Switch Transformer [1]_, DeepSpeed-MoE [3]_, Megatron-Core's
``moe_expert_capacity_factor`` [4]_) gives every expert a buffer of

.. math::

    C = c_f \\frac{b s k}{E}

rows (Switch's Eq. 4: expert capacity = capacity factor x tokens per batch / experts, with k
rows per token for top-k routing). ``c_f = 1`` is exactly the balanced share; tokens beyond an
expert's capacity are dropped (they skip the MLP through the residual). Every buffer has ``C``
rows whatever the routing when it is padded to capacity (GShard's and Switch's dispatch tensors
of shape ``[E, C, h]``, DeepSpeed-MoE's ``drop_tokens=True``, Megatron-Core with
``moe_pad_expert_input_to_capacity``), so one rank's experts hold ``E C = c_f b s k`` rows.

*Dropless* implementations size the buffers by the actual load. Then what one rank holds
depends on the routing, and the formula takes an **imbalance factor** ``f_imb``: the busiest
expert's load (with padding to the largest load, DeepSpeed-MoE's ``drop_tokens=False``) or the
busiest expert-parallel rank's load (grouped GEMM over ``ep > 1`` ranks) over the mean
``b s k / E``. ``f_imb = 1`` is the balanced routing the capacity formula itself assumes (Switch
sets ``c_f = 1`` for exactly balanced tokens and reports ``c_f = 1.0``-``1.25`` in training to
absorb imbalance), so it is the default; a larger value is the measured or feared skew (1.25:
the busiest expert gets 25 % more rows than the average). With a capacity and no padding the
busiest expert keeps ``min(f_imb, c_f)`` of its share. A grouped GEMM on one rank (``ep = 1``)
holds ``b s k`` rows whatever the routing (``f_imb`` has no effect there: pass 1).

Under expert parallelism each rank receives the rows its ``E / ep`` experts are sent by the
``ep`` ranks of its group, each of which routes its own ``b s`` tokens: with balance
``(E / ep) ep (b s k / E) = b s k`` rows, so **expert parallelism divides the expert weights,
not the expert activations**. Rows per rank:

.. math::

    R = \\rho\\, b s k, \\qquad \\rho = c_f \\;(\\text{padded}),\\;
    \\min(f_{imb}, c_f) \\;(\\text{dropping}),\\; f_{imb} \\;(\\text{dropless}).

What one MoE MLP keeps for backward, in Korthikanti et al.'s convention [5]_ (16-bit
activations of ``B`` bytes, 1-byte dropout masks, norm statistics and integer index tensors
ignored), with a SwiGLU expert (gate and up ``2 I_e``, down ``I_e``):

* ``input``: the MLP's input ``B b s h`` (the router's, the shared experts' and the dispatch's);
* ``router``: the routing probabilities ``B_r b s E`` (``B_r`` = 4: fp32, Megatron-Core's
  ``moe_router_dtype="fp32"``, whose default is the activations' dtype);
* ``dispatch``: the permuted rows, the experts' first GEMM input ``B_x R h``;
* ``experts``: the SwiGLU input ``2 B_x R I_e`` and the down-projection input ``B_x R I_e``
  (0 when SwiGLU's output is recomputed, as DeepSeek-V3 does);
* ``combine``: the experts' outputs ``B R h`` and their weights ``B_r R`` (the weighted sum's
  backward needs both); only the weights when they are applied inside the experts' activation
  (``weights_in_activation``: Megatron-Core's grouped experts multiply the SwiGLU output by
  the routing weight, ``activation_func_with_probs`` in ``transformer/moe/experts.py``, so the
  combine is a plain sum);
* ``shared``: a shared expert's ``3 B_x b s I_s``;
* ``output``: the dropout mask ``M b s h``.

``B_x`` (``linear_input_bytes``) is the precision of the cached GEMM inputs: ``B`` as published,
1 for DeepSeek-V3's FP8 cache. Tensor parallelism (Megatron's expert tensor parallelism equal to
``t``) divides what lies between the column- and the row-parallel GEMMs (``experts``,
``shared``); sequence parallelism divides the rest, exactly as in :mod:`vrammath.terms.korthikanti.dense`.

Examples
========

>>> from vrammath.notation.symbols import c_f, f_imb
>>> expert_rows(capacity_factor=c_f)
b*c_f*k_e*s
>>> expert_rows(capacity_factor=2, pad=False, imbalance=f_imb)
b*k_e*s*Min(2, f_imb)
>>> sum(moe_mlp_terms(shared=False, dropout_mask_bytes=0).values())
4*E*b*s + 6*I_e*b*k_e*s + 4*b*h*k_e*s + 2*b*h*s + 4*b*k_e*s

References
==========

.. [1] W. Fedus, B. Zoph, N. Shazeer, "Switch Transformer", arXiv:2101.03961 (2021), Section
   2.2, Eq. 4 (expert capacity) and Table 1 (capacity factors 1.0-2.0).
.. [2] D. Lepikhin et al., "GShard", arXiv:2006.16668 (2020), Section 2.2 (expert capacity,
   ``[E, C, M]`` dispatch tensors).
.. [3] S. Rajbhandari et al., "DeepSpeed-MoE", arXiv:2201.05596 (2022); ``deepspeed/moe/
   sharded_moe.py``: ``_capacity`` and ``drop_tokens`` (``False``: capacity = the largest load).
.. [4] Megatron-Core ``transformer/moe/moe_utils.py``: ``get_capacity``, and the token
   dispatchers with ``moe_expert_capacity_factor``, ``moe_pad_expert_input_to_capacity``.
.. [5] V. Korthikanti et al., arXiv:2205.05198 (2022), Section 4.1.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TypeAlias

import sympy

from vrammath.notation.errors import InputError
from vrammath.notation.symbols import E, I, I_e, I_s, b, h, k_e, s
from vrammath.terms.activations.parts import Number, Parallel, _number, _tp_divisors

#: A capacity factor or an imbalance, as a number (floats read as their shortest fraction) or
#: as a sympy expression (a symbol such as ``c_f``).
Ratio: TypeAlias = int | float | sympy.Expr


def ratio(field: str, value: object, low: float, high: float | None = None) -> sympy.Expr:
    """A ratio as an exact sympy number (floats as their shortest fraction) or a symbol, refused
    with an :class:`InputError` naming ``field`` outside ``[low, high]``.

    >>> ratio("imbalance", 1.25, 1)
    5/4
    >>> ratio("capacity_factor", 0, 0)
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: capacity_factor: must be a number above 0 (got 0)
    """
    bound = f"a number above {low:g}" if low == 0 else f"a number from {low:g}"
    if high is None:
        allowed = bound
    else:
        allowed = bound + (f" and at most {high:g}" if low == 0 else f" to {high:g}")
    if isinstance(value, sympy.Expr) and not value.is_number:
        return value
    if isinstance(value, sympy.Expr):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(field, "must be " + allowed, got=value)
    if value < low or (low == 0 and value == 0) or (high is not None and value > high):
        raise InputError(field, "must be " + allowed, got=value)
    frac = Fraction(str(value)) if isinstance(value, float) else Fraction(value)
    return sympy.Rational(frac.numerator, frac.denominator)


def expert_rows(
    capacity_factor: Ratio | None = None, *, imbalance: Ratio = 1, pad: bool = True
) -> sympy.Expr:
    """Routed rows one rank's experts hold per micro-batch: ``rho b s k`` (module Explanation).

    ``capacity_factor`` None is dropless (``rho = f_imb``); a capacity factor with ``pad``
    (the buffers always hold ``C`` rows) is ``rho = c_f``; without ``pad`` the busiest expert
    keeps ``min(f_imb, c_f)`` of its share. ``imbalance`` is at least 1.

    >>> expert_rows()
    b*k_e*s
    >>> expert_rows(imbalance=1.25)
    5*b*k_e*s/4
    >>> expert_rows(imbalance=0.5)
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: imbalance: must be a number from 1 (got 0.5)
    """
    f = ratio("imbalance", imbalance, 1)
    base = b * s * k_e
    if capacity_factor is None:
        return f * base
    cf = ratio("capacity_factor", capacity_factor, 0)
    return cf * base if pad else sympy.Min(f, cf) * base


def expert_capacity(capacity_factor: Ratio) -> sympy.Expr:
    """Rows of one expert's buffer: ``C = c_f b s k / E`` (Switch's Eq. 4, top-k rows).

    At ``c_f = E / k`` the buffer holds ``b s`` rows, the most one expert can be sent (each token
    goes to an expert at most once): from there on no token is ever dropped.

    >>> from vrammath.notation.symbols import E, c_f, k_e
    >>> expert_capacity(c_f)
    b*c_f*k_e*s/E
    >>> expert_capacity(E / k_e)
    b*s
    """
    return ratio("capacity_factor", capacity_factor, 0) * b * s * k_e / E


def swiglu_terms(
    rows: sympy.Expr,
    intermediate: sympy.Expr,
    *,
    activation_bytes: Number = 2,
    linear_input_bytes: Number | None = None,
    recompute_swiglu: bool = False,
) -> dict[str, sympy.Expr]:
    """What a SwiGLU MLP of ``rows`` tokens keeps, split ``input`` (the gate/up GEMM's input,
    outside the tensor-parallel region) and ``inner`` (the SwiGLU input ``2 I`` and the down
    GEMM's input ``I``, inside it).

    >>> from vrammath.notation.symbols import I, b, s
    >>> swiglu_terms(b * s, I)
    {'input': 2*b*h*s, 'inner': 6*I*b*s}
    """
    B = _number("activation_bytes", activation_bytes)
    X = B if linear_input_bytes is None else _number("linear_input_bytes", linear_input_bytes)
    down_input = sympy.Integer(0) if recompute_swiglu else X * rows * intermediate
    return {"input": X * rows * h, "inner": 2 * X * rows * intermediate + down_input}


def moe_mlp_terms(
    parallel: Parallel = "none",
    *,
    capacity_factor: Ratio | None = None,
    imbalance: Ratio = 1,
    pad: bool = True,
    shared: bool = True,
    activation_bytes: Number = 2,
    router_bytes: Number = 4,
    dropout_mask_bytes: Number = 1,
    linear_input_bytes: Number | None = None,
    recompute_swiglu: bool = False,
    recompute_norm: bool = False,
    weights_in_activation: bool = False,
) -> dict[str, sympy.Expr]:
    """Bytes one MoE MLP keeps for backward on one rank, by part (module Explanation).

    ``recompute_norm`` drops ``input`` (the norm's output, recomputed from the kept norm input:
    DeepSeek-V3's Section 3.2.3). The shared expert's MLP has intermediate size ``I_s``.

    Examples
    ========

    >>> terms = moe_mlp_terms("tp_sp", capacity_factor=1, shared=False)
    >>> terms["dispatch"], terms["experts"]
    (2*b*h*k_e*s/t, 6*I_e*b*k_e*s/t)

    Parameters
    ==========

    parallel : "none", "tp" or "tp_sp"
        As in :func:`vrammath.terms.korthikanti.dense.korthikanti_layer_terms`; expert parallelism divides
        nothing here (see the module's Explanation).
    capacity_factor, imbalance, pad
        As in :func:`expert_rows`.
    shared : bool
        Include a shared-expert MLP (intermediate size ``I_s``).
    activation_bytes, router_bytes, dropout_mask_bytes, linear_input_bytes
        Bytes per element of 16-bit activations, router probabilities (default fp32), dropout
        masks (0: no dropout) and cached GEMM inputs (default ``activation_bytes``).
    recompute_swiglu, recompute_norm
        DeepSeek-V3's recomputations of the experts' SwiGLU output and of the norm.
    weights_in_activation : bool
        The routing weights multiply the SwiGLU output (the combine keeps no expert output).

    See Also
    ========

    expert_rows, vrammath.terms.korthikanti.latent.mla_attention_terms

    References
    ==========

    .. [1] W. Fedus et al., arXiv:2101.03961 (2021); V. Korthikanti et al., arXiv:2205.05198
       (2022), Section 4.1; DeepSeek-AI, arXiv:2412.19437 (2024), Sections 3.2.3 and 3.3.3.
    """
    inner, outer = _tp_divisors(parallel)
    B = _number("activation_bytes", activation_bytes)
    Br = _number("router_bytes", router_bytes)
    M = _number("dropout_mask_bytes", dropout_mask_bytes)
    rows = expert_rows(capacity_factor, imbalance=imbalance, pad=pad)
    n = b * s
    kw = {"activation_bytes": B, "linear_input_bytes": linear_input_bytes}
    routed = swiglu_terms(rows, I_e, recompute_swiglu=recompute_swiglu, **kw)
    out = {
        "input": sympy.Integer(0) if recompute_norm else B * n * h * outer,
        "router": Br * n * E * outer,
        "dispatch": routed["input"] * outer,
        "experts": routed["inner"] * inner,
        "combine": ((0 if weights_in_activation else B * rows * h) + Br * rows) * outer,
        "shared": swiglu_terms(n, I_s, **kw)["inner"] * inner if shared else sympy.Integer(0),
        "output": M * n * h * outer,
    }
    return {k: sympy.expand(v) for k, v in out.items()}


def dense_mlp_terms(
    parallel: Parallel = "none",
    *,
    activation_bytes: Number = 2,
    dropout_mask_bytes: Number = 1,
    linear_input_bytes: Number | None = None,
    recompute_norm: bool = False,
) -> dict[str, sympy.Expr]:
    """A dense SwiGLU MLP (intermediate ``I``) in the same convention: ``input``, ``inner`` and
    the ``output`` dropout mask -- a mixture-of-experts model's dense layers.

    >>> sum(dense_mlp_terms().values())
    6*I*b*s + 3*b*h*s
    """
    inner, outer = _tp_divisors(parallel)
    B = _number("activation_bytes", activation_bytes)
    M = _number("dropout_mask_bytes", dropout_mask_bytes)
    mlp = swiglu_terms(b * s, I, activation_bytes=B, linear_input_bytes=linear_input_bytes)
    out = {
        "input": sympy.Integer(0) if recompute_norm else B * b * s * h * outer,
        "inner": mlp["inner"] * inner,
        "output": M * b * s * h * outer,
    }
    return {k: sympy.expand(v) for k, v in out.items()}


#: The largest capacity factor or imbalance accepted. Past it the buffers outgrow any real run
#: (and the byte counts any float), so the field is named instead of an overflow downstream.
MAX_RATIO = 1024


def check_capacity(capacity_factor: object, imbalance: object) -> None:
    """Check a setup's ``capacity_factor`` (None or above 0) and ``imbalance`` (from 1), one
    line naming the field.

    >>> check_capacity(None, 0.9)
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: imbalance: must be a number from 1 to 1024 (got 0.9)
    """
    if capacity_factor is not None:
        ratio("capacity_factor", capacity_factor, 0, MAX_RATIO)
    ratio("imbalance", imbalance, 1, MAX_RATIO)


__all__ = [
    "MAX_RATIO",
    "Ratio",
    "check_capacity",
    "dense_mlp_terms",
    "expert_capacity",
    "expert_rows",
    "moe_mlp_terms",
    "ratio",
    "swiglu_terms",
]
