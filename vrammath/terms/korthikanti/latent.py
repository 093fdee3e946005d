"""Multi-head latent attention's activations in Korthikanti et al.'s convention.

Explanation
===========

DeepSeek-V2/V3's attention [1]_ [2]_ projects the layer's input ``x`` (width ``h``) down to a
query latent of ``r_q`` and a key/value latent of ``r_kv`` plus one shared RoPE key of ``d_r``;
each latent passes an RMSNorm and is projected up to ``a`` heads: queries of ``d_n + d_r``, keys
of ``d_n`` (the shared RoPE key appended), values of ``d_v``. The attention output ``a d_v`` goes
into the output projection.

Counted as Korthikanti et al. [3]_ count a GPT layer's attention (16-bit activations of ``B``
bytes, 1-byte dropout masks, norm statistics ignored), per token:

* outside the tensor-parallel region: the down projections' input ``B h``, the two latents'
  norm inputs and outputs ``2 B (r_q + r_kv)`` (Megatron-Core replicates the down projections
  over tensor-parallel ranks), the output dropout mask ``M h``;
* inside it (divided by ``t``): Q and K ``2 B a (d_n + d_r)``, V ``B a d_v``, the output
  projection's input ``B_o a d_v``, and, per sequence, the score-sized softmax output, its
  dropout mask and output ``(2 B + M) a s`` (dropped by selective recomputation, or never
  formed by a flash kernel).

Without ``q_lora_rank`` (DeepSeek-V2-Lite) the query latent terms vanish. With DeepSeek-V3's own
recomputation of "all RMSNorm operations and MLA up-projections" (its Section 3.2.3,
``recompute_up_proj``) the norm outputs, Q, K and V are rebuilt in backward from what is kept:
the input, the latents and the RoPE key, ``B (h + r_q + r_kv + d_r)``, plus the output
projection's input. DeepSeek-V3 caches that input in its E5M6 format (12 bits:
``output_input_bytes = 3/2``) and the other GEMM inputs in FP8 (its Section 3.3.3:
``linear_input_bytes = 1``).

Examples
========

>>> from sympy import factor
>>> terms = mla_attention_terms(recompute="selective", dropout_mask_bytes=0)
>>> factor(sum(terms.values()))
2*b*s*(2*a*d_n + 2*a*d_r + 2*a*d_v + h + 2*r_kv + 2*r_q)

References
==========

.. [1] DeepSeek-AI, "DeepSeek-V2", arXiv:2405.04434 (2024), Section 2.1.2 (MLA's shapes).
.. [2] DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv:2412.19437 (2024), Sections 2.1.1,
   3.2.3 (recomputation of RMSNorm and MLA up-projections) and 3.3.3 (FP8/E5M6 caches).
.. [3] V. Korthikanti et al., arXiv:2205.05198 (2022), Section 4.1.
"""

from __future__ import annotations

import sympy

from vrammath.notation.symbols import a, b, d_n, d_r, d_v, h, r_kv, r_q, s
from vrammath.terms.activations.parts import (
    RECOMPUTE,
    Number,
    Parallel,
    Recompute,
    _check,
    _number,
    _tp_divisors,
)


def mla_attention_terms(
    parallel: Parallel = "none",
    recompute: Recompute = "none",
    *,
    q_lora: bool = True,
    recompute_up_proj: bool = False,
    activation_bytes: Number = 2,
    dropout_mask_bytes: Number = 1,
    linear_input_bytes: Number | None = None,
    output_input_bytes: Number | None = None,
) -> dict[str, sympy.Expr]:
    """Bytes one MLA block keeps for backward: ``outer`` (outside the tensor-parallel region),
    ``inner`` (heads, divided by ``t``), ``score`` (the ``a s^2 b`` tensors) and ``input`` (the
    layer input, under full recomputation only).

    Examples
    ========

    >>> terms = mla_attention_terms("tp", "selective", dropout_mask_bytes=0)
    >>> terms["inner"]
    4*a*b*d_n*s/t + 4*a*b*d_r*s/t + 4*a*b*d_v*s/t
    >>> mla_attention_terms(recompute_up_proj=True, dropout_mask_bytes=0)["outer"]
    2*b*d_r*s + 2*b*h*s + 2*b*r_kv*s + 2*b*r_q*s

    Parameters
    ==========

    parallel, recompute
        As in :func:`vrammath.terms.korthikanti.dense.korthikanti_layer_terms`.
    q_lora : bool
        The queries go through a latent (``q_lora_rank`` set).
    recompute_up_proj : bool
        DeepSeek-V3's recomputation of the RMSNorms and MLA up-projections.
    activation_bytes, dropout_mask_bytes, linear_input_bytes, output_input_bytes
        Bytes per element of 16-bit activations, dropout masks, cached GEMM inputs (default
        ``activation_bytes``) and the output projection's cached input (default
        ``linear_input_bytes``).

    References
    ==========

    .. [1] DeepSeek-AI, arXiv:2405.04434 (2024), Section 2.1.2; arXiv:2412.19437 (2024),
       Sections 3.2.3, 3.3.3. V. Korthikanti et al., arXiv:2205.05198 (2022), Section 4.1.
    """
    inner_div, outer_div = _tp_divisors(parallel)
    _check("recompute", recompute, RECOMPUTE)
    B = _number("activation_bytes", activation_bytes)
    M = _number("dropout_mask_bytes", dropout_mask_bytes)
    X = B if linear_input_bytes is None else _number("linear_input_bytes", linear_input_bytes)
    Bo = X if output_input_bytes is None else _number("output_input_bytes", output_input_bytes)
    n = b * s
    zero = sympy.Integer(0)
    if recompute == "full":
        return {"outer": zero, "inner": zero, "score": zero, "input": B * n * h}
    q_rank = r_q if q_lora else zero
    if recompute_up_proj:  # kept: the input, the latents and the RoPE key
        outer = X * n * (h + q_rank + r_kv + d_r)
        heads = zero
    else:  # the input, each latent's norm input and output; Q, K, V
        outer = X * n * h + B * n * 2 * (q_rank + r_kv)
        heads = B * n * a * (2 * (d_n + d_r) + d_v)
    inner = heads + Bo * n * a * d_v
    score = zero if recompute == "selective" else (2 * B + M) * a * s**2 * b
    out = {
        "outer": (outer + M * n * h) * outer_div,
        "inner": inner * inner_div,
        "score": score * inner_div,
        "input": zero,
    }
    return {k: sympy.expand(v) for k, v in out.items()}


__all__ = ["mla_attention_terms"]
