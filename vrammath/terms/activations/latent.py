"""Activation bytes of multi-head latent attention (DeepSeek-V3) as transformers 5.24 keeps them.

Explanation
===========

transformers' ``DeepseekV3Attention`` takes the layer's normalised input ``x`` (b, s, h) and,
with ``N = b s`` tokens, ``a`` heads and ``d_{qk} = d_n + d_r``:

.. math::

    c_q &= \\mathrm{RMSNorm}(x W_{qa}) \\in \\mathbb{R}^{N \\times r_q}, \\qquad
    Q = c_q W_{qb} \\in \\mathbb{R}^{N \\times a d_{qk}}
    \\quad (\\text{or } Q = x W_q \\text{ when } r_q \\text{ is null}) \\\\
    [c_{kv}, k_r] &= x W_{kva}, \\qquad
    [K_n, V] = \\mathrm{RMSNorm}(c_{kv}) W_{kvb} \\in \\mathbb{R}^{N \\times a (d_n + d_v)} \\\\
    Q' &= [Q_n, \\mathrm{RoPE}(Q_r)], \\qquad K = [K_n, \\mathrm{RoPE}(k_r)]
    \\ (\\text{one RoPE key, expanded to all heads}) \\\\
    O &= \\mathrm{softmax}(Q' K^T / \\sqrt{d_{qk}}) V \\in \\mathbb{R}^{N \\times a d_v},
    \\qquad y = O W_o .

What autograd keeps for backward, in bf16 (``c = 2``), per layer:

* ``q_latent`` -- the RMSNorm on ``c_q`` keeps its fp32 input ``4 N r_q``, the inverse RMS
  ``4 N`` and the bf16 normalised tensor its weight multiplies ``2 N r_q``; ``q_b_proj`` keeps its
  input ``2 N r_q``: ``8 N r_q + 4 N`` (0 with a full ``q_proj``, whose input is ``x``);
* ``kv_latent`` -- the same for ``c_{kv}``: ``8 N r_{kv} + 4 N``. ``x`` itself, shared by
  ``q_a_proj`` and ``kv_a_proj_with_mqa``, is the layer's ``inputs``;
* RoPE keeps nothing per layer: its multiplications need only cos and sin (which do not need a
  gradient), one (s, d_r) table each for the whole model (:func:`mla_rope_bytes`). The
  interleaved RoPE (``rope_interleave``, the default) and the half-rotation keep the same;
* ``qkv``, ``scores``, ``output`` -- what the attention kernel keeps (below), and ``o_proj``'s
  input ``2 N a d_v``.

The kernels. ``v_head_dim`` differs from ``qk_head_dim`` in DeepSeek-V3 (128 vs 192), and
transformers' SDPA path passes V as it is (no padding; ``pack_gqa``/``repeat_kv`` do nothing, as
K/V have all ``a`` heads). PyTorch's flash kernels need equal head dimensions:

* SDPA with ``d_v = d_{qk}`` (flash; on CUDA up to 256) -- Q', K, V as given, V a view holding all
  of ``kv_b_proj``'s output (``2 N a (2 d_{qk} + d_n + d_v)``), the fp32 log-sum-exp ``4 a N``, and
  its output ``2 N a d_v``, laid out as Q' (heads first, as ``torch.cat`` made it), so ``o_proj``
  keeps a contiguous copy of it too: ``output`` = ``4 N a d_v``;
* eager -- ``matmul`` keeps Q' and K (views, ``2 N a d_{qk}`` each) and a contiguous copy of V
  (``2 N a d_v``: V is a strided view of ``kv_b_proj``'s output; at b = 1 the batched ``reshape``
  is a view instead, which keeps all of that output, ``2 N a (d_n + d_v)``), the fp32 softmax
  ``4 a N s`` and its bf16 cast ``2 a N s``; ``o_proj`` keeps the contiguous output copy
  ``2 N a d_v``;
* SDPA on a CPU with ``d_v \\ne d_{qk}`` -- PyTorch runs its math kernel, which upcasts bf16
  to fp32: it keeps fp32 Q', K, V (``4 N a (2 d_{qk} + d_v)``) and the fp32 probabilities
  ``4 a N s``; the bf16 output is not kept, ``o_proj`` keeps its copy;
* SDPA on CUDA with ``d_v \\ne d_{qk}`` -- PyTorch's next backend after flash is the
  memory-efficient kernel, which keeps Q', K, V as given -- V a view holding all of ``kv_b_proj``'s
  output (``2 N a (d_n + d_v)``) -- its output (allocated sequence-first, so the transpose back
  is already contiguous and ``o_proj`` shares it) and an fp32 log-sum-exp padded to 32 rows,
  ``4 b a \\lceil s/32 \\rceil 32``.

Eager and the CPU kernels are measured (``tests/measure/test_latent_attention.py``); the CUDA
kernels are derived from PyTorch's source (``sdp_utils.cpp``, ``derivatives.yaml``, the flash
output allocated like Q', the memory-efficient one's ``{B, M, heads, Kv}`` output and
``kAlignLSE = 32``) and not measured: no GPU was at hand. On SM90/SM100 GPUs with a recent cuDNN,
PyTorch may prefer its cuDNN kernel, which this does not describe.

Examples
========

>>> from vrammath.model.presets import load_model
>>> sorted(mla_attention_terms(load_model("deepseek-v3")))
['kv_latent', 'output', 'q_latent', 'qkv', 'scores']
>>> mla_attention_terms(load_model("deepseek-v3"), "sdpa", device="cpu")["qkv"]
8*a*b*d_n*s + 8*a*b*d_r*s + 4*a*b*d_v*s

References
==========

.. [1] transformers 5.24 ``models/deepseek_v3/modeling_deepseek_v3.py`` (``DeepseekV3Attention``,
   ``DeepseekV3RMSNorm``, ``apply_rotary_pos_emb_interleave``) and
   ``integrations/sdpa_attention.py``.
.. [2] PyTorch 2.13 ``aten/src/ATen/native/transformers/sdp_utils_cpp.cpp`` (the CPU flash
   kernel's equal head dimensions), ``attention.cpp`` (the math kernel's fp32 upcast on a CPU).
.. [3] DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", arXiv:2412.19437, section 2.1.1.
"""

from __future__ import annotations

import sympy

from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError
from vrammath.notation.signatures import after
from vrammath.notation.symbols import a, b, d_n, d_r, d_v, r_kv, r_q, s
from vrammath.terms.activations.layer import hf_layer_terms
from vrammath.terms.activations.parts import (
    ATTENTIONS,
    DEVICES,
    SDPA_GQA_MAX_HEAD_DIM,
    LayerOptions,
    Precision,
    _check,
)

#: Rows the memory-efficient kernel pads its log-sum-exp to (PyTorch's ``kAlignLSE``).
LSE_ALIGN = 32


def _latent(spec: ModelSpec, precision: str) -> None:
    """Refuse a model without latent attention, and any precision but bf16."""
    if spec.latent is None:
        raise InputError("model", "has no latent attention", got=spec.name)
    if precision != "bf16":
        raise InputError(
            "precision",
            "latent-attention (DeepSeek-V3) activations are derived and measured in bf16 only "
            "(its MoE layers' grouped matmul takes bf16 inputs)",
            got=precision,
        )


@after(LayerOptions)
def mla_attention_terms(layer: LayerOptions) -> dict[str, sympy.Expr]:
    """Bytes one latent-attention block keeps for backward, by tensor group (bf16).

    The groups are the module's Explanation: ``q_latent``, ``kv_latent`` (the low-rank paths and
    their norms), ``qkv`` (what the kernel keeps of Q', K, V), ``scores`` (probabilities or
    log-sum-exp) and ``output`` (``o_proj``'s input). The block's input ``x`` is not here.

    Examples
    ========

    >>> from vrammath.model.presets import load_model
    >>> terms = mla_attention_terms(load_model("deepseek-v3"), "eager")
    >>> terms["q_latent"], terms["scores"]
    (8*b*r_q*s + 4*b*s, 6*a*b*s**2)
    >>> mla_attention_terms(load_model("deepseek-v3"), "sdpa")["scores"]
    128*a*b*ceiling(s/32)

    Parameters
    ==========

    spec : ModelSpec
        A model with :class:`~vrammath.model.spec.LatentAttention` (``deepseek_v3``).
    attention : "eager" or "sdpa"
        transformers' attention implementation.
    precision : "bf16"
        The only one derived (see :func:`vrammath.terms.activations.model.hf_activation_terms`).
    device : "cuda" or "cpu"
        Where SDPA runs: the kernels differ (module Explanation).

    See Also
    ========

    mla_layer_terms, vrammath.terms.activations.layer.hf_layer_terms, vrammath.serve.kv_cache.kv_cache_bytes
    """
    spec, attention, precision, device = layer.spec, layer.attention, layer.precision, layer.device
    _check("attention", attention, ATTENTIONS)
    _check("device", device, DEVICES)
    _latent(spec, precision)
    lat = spec.latent
    assert lat is not None
    n = s * b
    d_qk = d_n + d_r
    q_latent = 8 * n * r_q + 4 * n if lat.q_rank is not None else sympy.Integer(0)
    flash = lat.v_dim == lat.nope_dim + lat.rope_dim
    if device == "cuda":
        flash = flash and lat.nope_dim + lat.rope_dim <= SDPA_GQA_MAX_HEAD_DIM
    output = 2 * n * a * d_v
    if attention == "eager":
        # at b = 1 the copy of V is a view of kv_b_proj's whole output (dropping the batch dim)
        qkv = 2 * n * a * (2 * d_qk + d_v + sympy.KroneckerDelta(b, 1) * d_n)
        scores = (4 + 2) * a * n * s
    elif flash:  # V a view of kv_b_proj's output; the output copied for o_proj
        qkv = 2 * n * a * (2 * d_qk + d_n + d_v)
        scores = 4 * a * n
        output = 2 * output
    elif device == "cpu":  # the math kernel, in fp32
        qkv = 4 * n * a * (2 * d_qk + d_v)
        scores = 4 * a * n * s
    else:  # the memory-efficient kernel: V a view of kv_b_proj's whole output
        qkv = 2 * n * a * (2 * d_qk + d_n + d_v)
        scores = 4 * b * a * LSE_ALIGN * sympy.ceiling(s / LSE_ALIGN)
    terms = {
        "q_latent": q_latent,
        "kv_latent": 8 * n * r_kv + 4 * n,
        "qkv": qkv,
        "scores": scores,
        "output": output,
    }
    return {k: sympy.expand(v) for k, v in terms.items()}


@after(LayerOptions)
def mla_layer_terms(layer: LayerOptions) -> dict[str, sympy.Expr]:
    """Bytes one DeepSeek-V3 decoder layer with a dense MLP keeps: LLaMA's layer with its
    attention groups replaced by :func:`mla_attention_terms`.

    The two RMSNorms, the block inputs (``x`` shared by the two down-projections, the MLP's input)
    and the SwiGLU MLP are :func:`~vrammath.terms.activations.layer.hf_layer_terms`' (``norms``, ``inputs``,
    ``mlp``); a MoE layer replaces ``mlp`` by :func:`vrammath.terms.moe.params.moe_mlp_kept_exprs`.

    >>> from vrammath.model.presets import load_model
    >>> sorted(mla_layer_terms(load_model("deepseek-v3")))
    ['inputs', 'kv_latent', 'mlp', 'norms', 'output', 'q_latent', 'qkv', 'scores']
    """
    spec, attention, precision, device = layer.spec, layer.attention, layer.precision, layer.device
    attn = mla_attention_terms(spec, attention, precision, device=device)
    dense = hf_layer_terms(spec, attention, precision, device=device)
    kept = {k: dense[k] for k in ("norms", "inputs", "mlp")}
    return {**kept, **attn}


def mla_rope_bytes(spec: ModelSpec, precision: Precision = "bf16") -> sympy.Expr:
    """RoPE's cos and sin, shared by every layer: one (s, d_r) bf16 table each, ``4 s d_r``.

    transformers' ``DeepseekV3Config`` sets ``head_dim = qk_rope_head_dim``, so the rotary
    embedding's tables are ``d_r`` wide, not ``d_n + d_r``.

    >>> from vrammath.model.presets import load_model
    >>> mla_rope_bytes(load_model("deepseek-v3"))
    4*d_r*s
    """
    _latent(spec, precision)
    return 2 * 2 * s * d_r


__all__ = ["LSE_ALIGN", "mla_attention_terms", "mla_layer_terms", "mla_rope_bytes"]
