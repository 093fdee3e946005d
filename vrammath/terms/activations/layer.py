"""Activation bytes of one decoder layer as transformers' implementations keep them, exactly.

``hf_layer_terms`` gives the bytes one LLaMA-style decoder layer (also Qwen2/3, Mistral, Gemma,
OLMo-2, Phi-3, StarCoder2) keeps for backward, tensor by tensor, as PyTorch autograd saves them,
for eager or SDPA attention and fp32, pure 16-bit and autocast runs; GPT-2 and GPT-NeoX come from
:mod:`vrammath.terms.activations.gpt`. The whole model's totals are in :mod:`vrammath.terms.activations.model`.

Examples
========

>>> from vrammath.model.presets import load_model
>>> sorted(hf_layer_terms(load_model("llama-7b")))
['inputs', 'mlp', 'norms', 'output', 'qkv', 'scores', 'weight_casts']
"""

from __future__ import annotations

import sympy

from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError, one_of
from vrammath.notation.signatures import after
from vrammath.notation.symbols import I, a, a_kv, b, d, h, s, w_win
from vrammath.terms.activations.gpt import GELU_KEPT, gpt2_layer_terms, neox_layer_terms
from vrammath.terms.activations.parts import (
    ATTENTIONS,
    DEVICES,
    PURE_PRECISIONS,
    SDPA_GQA_MAX_HEAD_DIM,
    HfLayerOptions,
    _check,
    _dropout_mask_bytes,
    _eager_softmax_kept,
    _math_kernel_dropout_kept,
    _norm_kept,
    _precision,
    _total,
    _unit_offset_norm_kept,
)


@after(HfLayerOptions)
def hf_layer_terms(layer: HfLayerOptions) -> dict[str, sympy.Expr]:
    """Bytes one decoder layer of transformers' implementation keeps for backward, per tensor group.

    Explanation
    ===========

    Derived from what autograd saves in transformers' ``LlamaDecoderLayer`` (also Qwen2, Mistral),
    counted per tensor and checked against PyTorch's ``MemTracker``. With c the compute bytes (2
    for bf16/fp16 and autocast, 4 for fp32):

    * ``norms`` -- each RMSNorm upcasts its input to fp32 and keeps it (4sbh, for ``pow`` and the
      multiply by the inverse RMS), the normalised tensor that the weight multiplies (in the
      parameters' dtype: 2sbh for pure 16-bit, 4sbh for fp32 and autocast) and the inverse RMS
      (4bs): twice per layer.
    * ``inputs`` -- the tensors the projections keep as their input. The norm's output is shared
      by q/k/v (and by gate/up); under autocast every linear casts its fp32 input to 16 bits
      itself and keeps its own copy (3 for attention, 2 for the MLP).
    * ``qkv`` -- Q (a d) and K, V after RoPE: a_kv d each for SDPA with ``enable_gqa``
      (head_dim <= 256), a d each for eager attention (``repeat_kv`` copies) and SDPA beyond
      head_dim 256. Under autocast RoPE's multiply by the fp32 cos/sin promotes Q and K to fp32;
      the attention casts them back to 16 bits and keeps the 16-bit copies.
    * ``scores`` -- eager: the softmax output in fp32 (4as^2b, ``softmax(dtype=float32)``) plus
      its cast back to the query's dtype (2as^2b) unless that is fp32 (under autocast the query
      is fp32, and the matmul with V casts the probabilities to 16 bits: 2as^2b again). SDPA
      (flash kernel) keeps only the log-sum-exp, 4asb.
    * ``output`` -- the attention output (c b s a d), kept by SDPA and shared with ``o_proj``'s
      input, or the contiguous copy ``o_proj`` keeps in eager mode.
    * ``mlp`` -- SwiGLU keeps four intermediate-size tensors: gate output (for SiLU), SiLU output
      and up output (for the product), the product (for ``down_proj``): 4c sbI.
    * ``weight_casts`` -- autocast only: the 16-bit copies of the layer's matrices, which autocast
      caches and the linears keep for backward (2 bytes per weight).

    Dropout on the probabilities (``attention_dropout`` > 0) keeps, in eager attention, the
    dropout's mask and the dropped-out probabilities the matmul with V reads; SDPA applies it
    inside the kernel on CUDA (the log-sum-exp only) and runs the math kernel on a CPU
    (``activation_parts._math_kernel_dropout_kept``). StarCoder2's residual
    dropouts keep a mask each (c bytes per element on a CPU, one on CUDA).

    ``sliding=True`` gives a layer of a sliding window of w tokens (:func:`window_reached`). Eager
    attention keeps the same tensors (the window only changes the mask's values). SDPA does not
    once s >= w: transformers then passes an explicit mask, which turns off SDPA's GQA path, so
    K and V are repeated to a heads (as in eager; a single KV head stays a stride-0 view, but
    for K under autocast, whose cast to 16 bits copies it) and the
    kernel keeps the boolean mask converted to the query's dtype, ``window_mask`` = c b s^2
    (measured on a CPU).

    Examples
    ========

    >>> from vrammath.model.presets import load_model
    >>> from vrammath.notation.symbols import b, s
    >>> spec = load_model("llama-7b")
    >>> from vrammath.model.params import size_values
    >>> per_layer = lambda att, prec: hf_layer_bytes(spec, att, prec).subs(
    ...     {**size_values(spec), b: 1, s: 512})
    >>> [round(float(per_layer(att, prec)) / 2**20, 2) for prec in ("bf16", "fp32")
    ...     for att in ("eager", "sdpa")]
    [139.0, 91.07, 198.0, 166.07]

    Parameters
    ==========

    spec : ModelSpec
        A LLaMA-style model (LLaMA, Mistral, Qwen2; Qwen3 and OLMo-2 with q/k norms, Phi-3 with
        fused projections: :func:`qk_norm_bytes`; StarCoder2 with LayerNorm and a plain GeLU
        MLP); GPT-2 (fused ``Conv1D`` QKV) is passed on to :func:`~vrammath.terms.activations.gpt.gpt2_layer_terms`.
    attention : "eager" or "sdpa"
        transformers' attention implementation.
    precision : "fp32", "bf16", "fp16", "autocast-bf16" or "autocast-fp16"
        Pure precision (the model built in that dtype) or fp32 weights under ``torch.autocast``.

    See Also
    ========

    hf_layer_bytes, vrammath.terms.activations.model.hf_activation_terms, vrammath.terms.activations.gpt.gpt2_layer_terms,
    vrammath.terms.korthikanti.dense.korthikanti_layer_terms

    References
    ==========

    .. [1] transformers ``models/llama/modeling_llama.py`` (v5), PyTorch
       ``tools/autograd/derivatives.yaml`` (what each op saves).
    """
    spec, attention, precision, device = layer.spec, layer.attention, layer.precision, layer.device
    if spec.attention.fused_qkv and not spec.embeddings.learned_positions:
        return neox_layer_terms(spec, attention, precision, device=device)
    if spec.conv1d:  # GPT-2's block (Conv1D c_attn, dropout everywhere)
        return gpt2_layer_terms(spec, attention, precision, gelu=layer.gelu, device=device)
    _check("attention", attention, ATTENTIONS)
    _check("device", device, DEVICES)
    c, autocast = _precision(precision)
    softcap = spec.attention.softcap is not None
    if softcap and attention == "sdpa":
        raise InputError(
            "attention",
            "sdpa: transformers' SDPA refuses attention softcapping (attn_logit_softcapping); "
            "allowed: eager",
            got=attention,
        )
    offset = spec.norms.unit_offset
    if offset and autocast:
        raise one_of("precision", precision, PURE_PRECISIONS)
    sb = s * b
    n_norms = 4 if spec.norms.placement == "sandwich" else 2
    norms = n_norms * (_unit_offset_norm_kept() if offset else _norm_kept(spec, precision, device))
    if spec.attention.qk_norm == "head" and offset:
        # Gemma-3: the same fp32 norm over head_dim, per query and per KV head
        norms += (a + a_kv) * (8 * sb * d + 4 * b * s) + 2 * 4 * d
    mlp_linears = 2 if spec.mlp.gated else 1  # the linears reading the MLP's input
    inputs = 3 * 2 * sb * h + mlp_linears * 2 * sb * h if autocast else 2 * c * sb * h
    kv_heads = a_kv if attention == "sdpa" and spec.head_dim <= SDPA_GQA_MAX_HEAD_DIM else a
    masked = layer.sliding and attention == "sdpa"
    k_heads = v_heads = kv_heads
    if masked and kv_heads == a_kv:
        repeated = a_kv + window_reached() * (a - a_kv)
        # repeat_kv of a single KV head is a stride-0 view that SDPA keeps as it is, unless
        # autocast's cast of the fp32 post-RoPE key materialises it
        k_heads = repeated if spec.kv_heads > 1 or autocast else a_kv
        v_heads = repeated if spec.kv_heads > 1 else a_kv
    qkv = c * sb * d * (a + k_heads + v_heads)
    M = _dropout_mask_bytes(c, device)
    if _math_dropout(spec, attention, device):
        qkv, scores = _math_kernel_dropout_kept()
    elif attention == "sdpa":
        scores = 4 * a * s * b
    elif spec.attention.dropout > 0:
        # the fp32 softmax output, dropout's mask of the probabilities (in the query's dtype:
        # fp32 under autocast, where RoPE promotes it, unless RoPE casts back as OLMo-2's does)
        # and the dropped-out ones, in c (autocast: the matmul with V keeps its 16-bit cast)
        q_bytes = 4 if autocast and not spec.attention.rope_fp32 else c
        scores = (4 + _dropout_mask_bytes(q_bytes, device) + c) * a * s**2 * b
    else:
        scores = _eager_softmax_kept(c)
    if softcap:  # cap * tanh(scores / cap): tanh keeps its output
        scores += c * a * s**2 * b
    output = c * sb * a * d + (M * sb * h if spec.attention.output_dropout > 0 else 0)
    mlp = 4 * c * sb * I if spec.mlp.gated else _plain_mlp_kept(spec, c)
    mlp += M * sb * h if spec.mlp.dropout > 0 else 0
    n_mlp = 3 if spec.mlp.gated else 2
    casts = 2 * (2 * h * a * d + 2 * h * a_kv * d + n_mlp * h * I) if autocast else sympy.Integer(0)
    terms = {
        "norms": sympy.expand(norms),
        "inputs": sympy.expand(inputs),
        "qkv": sympy.expand(qkv),
        "scores": sympy.expand(scores),
        "output": sympy.expand(output),
        "mlp": sympy.expand(mlp),
        "weight_casts": sympy.expand(casts),
    }
    if masked and not _math_dropout(spec, attention, device):  # the math kernel adds it in place
        terms["window_mask"] = window_reached() * c * b * s**2
    return _decoder_part_terms(spec, attention, precision, device, terms)


# ---------------------------------------------------------------------------------------------
# Parts of the newer decoders (Qwen3, OLMo-2, Phi-3): q/k norms, fused projections
# ---------------------------------------------------------------------------------------------


def qk_norm_bytes(spec: ModelSpec, precision: str = "bf16") -> sympy.Expr:
    """Bytes the RMSNorms on queries and keys keep for backward, per layer.

    Explanation
    ===========

    Each norm keeps its input upcast to fp32, the normalised tensor the weight multiplies and the
    inverse RMS (4 bytes per row). Qwen3 (``qk_norm="head"``) normalises each head: width
    (a + a_kv) d, one row per head and token, and its weight multiplies the normalised tensor cast
    back to the linear's output dtype (2 bytes for 16-bit and autocast, 4 for fp32). OLMo-2
    (``"projection"``) normalises the whole projection, one row per token for each of the two,
    and multiplies the fp32 tensor (4 bytes).

    >>> from vrammath.model.readers import from_hf_config
    >>> cfg = {"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 96,
    ...     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    ...     "vocab_size": 100}
    >>> qk_norm_bytes(from_hf_config(cfg), "bf16")
    6*a*b*d*s + 4*a*b*s + 6*a_kv*b*d*s + 4*a_kv*b*s
    >>> qk_norm_bytes(from_hf_config({**cfg, "model_type": "olmo2"}), "bf16")
    8*a*b*d*s + 8*a_kv*b*d*s + 8*b*s
    """
    c, _ = _precision(precision)
    sb = s * b
    width = (a + a_kv) * d
    if spec.attention.qk_norm == "head":
        normalised = 4 if c == 4 else 2
        return sympy.expand((4 + normalised) * sb * width + 4 * sb * (a + a_kv))
    if spec.attention.qk_norm == "projection":
        return sympy.expand(8 * sb * width + 2 * 4 * sb)
    return sympy.Integer(0)


def _plain_mlp_kept(spec: ModelSpec, c: int) -> sympy.Expr:
    """A plain GeLU MLP (StarCoder2): the activation's kept tensors (:data:`~vrammath.terms.activations.gpt.GELU_KEPT`) and its
    output, ``c_proj``'s input (a dropout mask after ``c_proj`` is added by the caller)."""
    _check("mlp.activation", spec.mlp.activation, tuple(GELU_KEPT))
    return (GELU_KEPT[spec.mlp.activation] + 1) * c * s * b * I


def _math_dropout(spec: ModelSpec, attention: str, device: str) -> bool:
    """Whether SDPA runs PyTorch's math kernel: dropout on the probabilities, on a CPU."""
    return attention == "sdpa" and device == "cpu" and spec.attention.dropout > 0


def _decoder_part_terms(
    spec: ModelSpec, attention: str, precision: str, device: str, terms: dict[str, sympy.Expr]
) -> dict[str, sympy.Expr]:
    """The LLaMA layer's terms with the newer decoders' parts: q/k norms and fused projections.

    Phi-3's fused ``qkv_proj`` gives Q, K and V as views of one (b, s, (a + 2 a_kv) d) tensor.
    RoPE makes new Q and K, but SDPA keeps V as given, a view that holds the whole fused tensor
    alive (unless K and V are repeated first, beyond head_dim 256); and Q, written out by RoPE
    in (b, a, s, d) order, makes SDPA's output come out in that order too, so ``o_proj`` keeps a
    contiguous copy beside the output SDPA keeps (measured on a CPU). Eager attention copies V in
    ``matmul`` and keeps nothing more. The fused ``gate_up_proj`` keeps what gate and up keep.
    Under autocast each linear keeps its own 16-bit copy of its input: one per fused linear.
    """
    out = dict(terms)
    c, autocast = _precision(precision)
    fewer_casts = (2 if spec.attention.fused_qkv_linear else 0) + (
        1 if spec.mlp.fused_gate_up else 0
    )
    if autocast and fewer_casts:  # each linear casts its fp32 input itself: one per fused linear
        out["inputs"] = sympy.expand(out["inputs"] - fewer_casts * 2 * s * b * h)
    if spec.attention.qk_norm != "none" and not spec.norms.unit_offset:  # Gemma-3's: in "norms"
        out["qk_norms"] = qk_norm_bytes(spec, precision)
    views_kept = (
        attention == "sdpa"
        and spec.head_dim <= SDPA_GQA_MAX_HEAD_DIM
        and not _math_dropout(spec, attention, device)
    )
    if spec.attention.fused_qkv_linear and views_kept:
        extra = c * s * b * (a + a_kv) * d + c * s * b * a * d
        out["qkv"] = sympy.expand(out["qkv"] + extra)
    return out


def window_reached() -> sympy.Expr:
    """1 once the sequence reaches the window (s >= w), else 0.

    transformers skips the mask (SDPA's ``is_causal``) only while the key length is below the
    window (``masking_utils._ignore_causal_mask_sdpa``); from s = w on it builds an explicit one.

    >>> from vrammath.notation.symbols import s, w_win
    >>> [window_reached().subs({s: n, w_win: 4096}) for n in (4095, 4096)]
    [0, 1]
    """
    return sympy.Piecewise((1, s >= w_win), (0, True))


@after(hf_layer_terms)
def hf_layer_bytes(terms: dict[str, sympy.Expr]) -> sympy.Expr:
    """Bytes one decoder layer keeps for backward: the sum of :func:`hf_layer_terms`, which
    takes the same arguments.

    >>> from vrammath.model.presets import load_model
    >>> hf_layer_bytes(load_model("llama-7b"), "sdpa", "bf16")
    8*I*b*s + 4*a*b*d*s + 4*a*b*s + 4*a_kv*b*d*s + 16*b*h*s + 8*b*s
    """
    return _total(terms)


__all__ = ["hf_layer_bytes", "hf_layer_terms", "qk_norm_bytes", "window_reached"]
