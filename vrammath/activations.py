"""Activation memory: the Korthikanti family as published, and the real implementations exactly.

Two families of formulas sit side by side.

* ``korthikanti_*`` reproduce Korthikanti et al. (2022) exactly as published: a GPT block with a
  4h GeLU MLP, 16-bit activations, 1-byte dropout masks, layer-norm statistics ignored. The
  assumptions are named parameters with the published defaults, so a reader can see (and change)
  each of them.
* ``hf_*`` give the bytes that Hugging Face transformers' implementations keep for backward, tensor
  by tensor, as PyTorch autograd saves them (LLaMA-style decoders with eager or SDPA attention,
  GQA, explicit head_dim, gated MLP, RMSNorm; GPT-2 with LayerNorm, a GeLU MLP and dropout), for
  fp32, pure 16-bit and autocast runs, plus the logits and the loss. They are checked against
  PyTorch's own memory count by ``vrammath.measure`` (see ``validation/matrix.json``).

Examples
========

>>> from vrammath.symbols import s, b, h, a
>>> korthikanti_layer_bytes()
5*a*b*s**2 + 34*b*h*s
>>> korthikanti_layer_bytes("tp", "selective")
10*b*h*s + 24*b*h*s/t
"""

from __future__ import annotations

from typing import Literal, TypeAlias

import sympy

from vrammath.errors import InputError, one_of
from vrammath.model import ModelSpec
from vrammath.symbols import I, L, V, a, a_kv, b, d, h, m, p, s, t, w_win

Parallel = Literal["none", "tp", "tp_sp"]
Recompute = Literal["none", "selective", "full"]
Schedule = Literal["1f1b", "interleaved"]
Attention = Literal["eager", "sdpa"]
Precision = Literal["fp32", "bf16", "fp16", "autocast-bf16", "autocast-fp16"]
HfRecompute = Literal["none", "full"]

PARALLEL: tuple[str, ...] = ("none", "tp", "tp_sp")
RECOMPUTE: tuple[str, ...] = ("none", "selective", "full")
SCHEDULES: tuple[str, ...] = ("1f1b", "interleaved")
ATTENTIONS: tuple[str, ...] = ("eager", "sdpa")
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16", "autocast-bf16", "autocast-fp16")
HF_RECOMPUTE: tuple[str, ...] = ("none", "full")

Number: TypeAlias = int | sympy.Expr


def _check(field: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise one_of(field, value, allowed)


def _number(field: str, value: object) -> sympy.Expr:
    """An int or a sympy expression as an expression; anything else (a string) is refused."""
    if isinstance(value, int) and not isinstance(value, bool):
        return sympy.Integer(value)
    if isinstance(value, sympy.Expr):
        return value
    raise InputError(field, "must be an int or a sympy expression", got=value)


# =============================================================================================
# Korthikanti et al. (2022), as published
# =============================================================================================


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
    _check("parallel", parallel, PARALLEL)
    _check("recompute", recompute, RECOMPUTE)
    B = _number("activation_bytes", activation_bytes)
    M = _number("dropout_mask_bytes", dropout_mask_bytes)
    f = _number("ffn_multiple", ffn_multiple)
    sbh = s * b * h
    score = a * s**2 * b
    # what tensor parallelism splits (inside the parallel regions) vs what it replicates
    split_tp = parallel in ("tp", "tp_sp")
    inner = 1 / t if split_tp else sympy.Integer(1)
    outer = 1 / t if parallel == "tp_sp" else sympy.Integer(1)
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


def korthikanti_layer_bytes(
    parallel: Parallel = "none",
    recompute: Recompute = "none",
    *,
    activation_bytes: Number = 2,
    dropout_mask_bytes: Number = 1,
    ffn_multiple: Number = 4,
) -> sympy.Expr:
    """Bytes of activations one transformer layer keeps for backward (Korthikanti et al. 2022).

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
    >>> from vrammath.symbols import s, b, h, a, t
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
    terms = korthikanti_layer_terms(
        parallel,
        recompute,
        activation_bytes=activation_bytes,
        dropout_mask_bytes=dropout_mask_bytes,
        ffn_multiple=ffn_multiple,
    )
    return sympy.expand(sum(terms.values(), sympy.Integer(0)))


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
    >>> from vrammath.symbols import L, s, b, h, a, t, V
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
    layer = korthikanti_layer_bytes(
        parallel,
        recompute,
        activation_bytes=activation_bytes,
        dropout_mask_bytes=dropout_mask_bytes,
        ffn_multiple=ffn_multiple,
    )
    total = L * layer * korthikanti_interleave_factor(schedule)
    if extras:
        extra = korthikanti_extra_terms(
            parallel,
            last_stage_on_first=last_stage_on_first,
            activation_bytes=activation_bytes,
            dropout_mask_bytes=dropout_mask_bytes,
        )
        total = total + sum(extra.values(), sympy.Integer(0))
    return total


# =============================================================================================
# Hugging Face transformers, exactly
# =============================================================================================

#: head_dim above which transformers' SDPA path repeats K/V instead of passing enable_gqa.
SDPA_GQA_MAX_HEAD_DIM = 256


def _precision(precision: str) -> tuple[int, bool]:
    """(compute bytes, autocast?) of a precision name."""
    _check("precision", precision, PRECISIONS)
    if precision == "fp32":
        return 4, False
    return 2, precision.startswith("autocast")


def _residual_bytes(precision: str) -> int:
    """Bytes per element of the residual stream: the parameters' dtype (fp32 under autocast)."""
    compute, autocast = _precision(precision)
    return 4 if autocast else compute


DEVICES: tuple[str, ...] = ("cuda", "cpu")


def _dropout_mask_bytes(c: int, device: str) -> int:
    """Bytes per element of a dropout mask: CUDA's fused ``native_dropout`` keeps a bool mask;
    on a CPU dropout multiplies by a noise tensor of the input's dtype (c bytes)."""
    return c if device == "cpu" else 1


def _norm_kept(spec: ModelSpec, precision: str, device: str) -> sympy.Expr:
    """Bytes one norm of ``spec.norms.kind`` keeps for backward.

    RMSNorm (transformers' LLaMA) upcasts its input to fp32 and keeps it (4sbh), the normalised
    tensor the weight multiplies, in the parameters' dtype (2sbh for pure 16-bit, 4sbh for fp32
    and autocast), and the inverse RMS (4bs). LayerNorm keeps its input (c sbh) and its mean and
    inverse std (S bs each): fp32 on CUDA (S = 4), the input's dtype on a CPU (S = c).
    """
    c, autocast = _precision(precision)
    sb = s * b
    if spec.norms.kind == "rmsnorm":
        normalised = 4 if c == 4 or autocast or spec.norms.weight_fp32 else 2
        return 4 * sb * h + normalised * sb * h + 4 * b * s
    kept = 4 if autocast else c  # under autocast LayerNorm runs on the fp32 residual stream
    stats = kept if device == "cpu" else 4
    return kept * sb * h + 2 * stats * b * s


def _unit_offset_norm_kept() -> sympy.Expr:
    """Bytes one Gemma RMSNorm keeps: it computes in fp32 whatever the dtype.

    Its fp32 input (a copy for 16-bit models, the input itself in fp32), the inverse RMS (4bs),
    the fp32 normalised tensor that multiplies ``1 + weight`` and that fp32 vector (4h): the
    cast back to the model's dtype keeps nothing.
    """
    return 8 * s * b * h + 4 * b * s + 4 * h


def hf_layer_terms(
    spec: ModelSpec,
    attention: Attention = "sdpa",
    precision: Precision = "bf16",
    *,
    gelu: str | None = None,
    device: Literal["cuda", "cpu"] = "cuda",
    sliding: bool = False,
) -> dict[str, sympy.Expr]:
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

    Dropout is off in these models (attention_dropout 0.0) and keeps nothing.

    ``sliding=True`` gives a layer of a sliding window of w tokens (:func:`window_reached`). Eager
    attention keeps the same tensors (the window only changes the mask's values). SDPA does not
    once s >= w: transformers then passes an explicit mask, which turns off SDPA's GQA path, so
    K and V are repeated to a heads (as in eager; a single KV head stays a stride-0 view, but
    for K under autocast, whose cast to 16 bits copies it) and the
    kernel keeps the boolean mask converted to the query's dtype, ``window_mask`` = c b s^2
    (measured on a CPU).

    Examples
    ========

    >>> from vrammath.presets import load_model
    >>> from vrammath.symbols import b, s
    >>> spec = load_model("llama-7b")
    >>> from vrammath.params import size_values
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
        MLP); GPT-2 (fused ``Conv1D`` QKV) is passed on to :func:`gpt2_layer_terms`.
    attention : "eager" or "sdpa"
        transformers' attention implementation.
    precision : "fp32", "bf16", "fp16", "autocast-bf16" or "autocast-fp16"
        Pure precision (the model built in that dtype) or fp32 weights under ``torch.autocast``.

    See Also
    ========

    hf_layer_bytes, hf_activation_terms, gpt2_layer_terms, korthikanti_layer_terms

    References
    ==========

    .. [1] transformers ``models/llama/modeling_llama.py`` (v5), PyTorch
       ``tools/autograd/derivatives.yaml`` (what each op saves).
    """
    if spec.attention.fused_qkv and not spec.embeddings.learned_positions:
        return neox_layer_terms(spec, attention, precision, device=device)
    if spec.attention.fused_qkv:  # GPT-2's block (Conv1D c_attn, dropout everywhere)
        return gpt2_layer_terms(spec, attention, precision, gelu=gelu, device=device)
    _check("attention", attention, ATTENTIONS)
    _check("device", device, DEVICES)
    c, autocast = _precision(precision)
    _check_dropout(spec, attention, precision, device)
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
        raise one_of("precision", precision, ("fp32", "bf16", "fp16"))
    sb = s * b
    n_norms = 4 if spec.norms.placement == "sandwich" else 2
    norms = n_norms * (_unit_offset_norm_kept() if offset else _norm_kept(spec, precision, device))
    if spec.attention.qk_norm == "head" and offset:
        # Gemma-3: the same fp32 norm over head_dim, per query and per KV head
        norms += (a + a_kv) * (8 * sb * d + 4 * b * s) + 2 * 4 * d
    mlp_linears = 2 if spec.mlp.gated else 1  # the linears reading the MLP's input
    inputs = 3 * 2 * sb * h + mlp_linears * 2 * sb * h if autocast else 2 * c * sb * h
    kv_heads = a_kv if attention == "sdpa" and spec.head_dim <= SDPA_GQA_MAX_HEAD_DIM else a
    masked = sliding and attention == "sdpa"
    k_heads = v_heads = kv_heads
    if masked and kv_heads == a_kv:
        repeated = a_kv + window_reached() * (a - a_kv)
        # repeat_kv of a single KV head is a stride-0 view that SDPA keeps as it is, unless
        # autocast's cast of the fp32 post-RoPE key materialises it
        k_heads = repeated if spec.kv_heads > 1 or autocast else a_kv
        v_heads = repeated if spec.kv_heads > 1 else a_kv
    qkv = c * sb * d * (a + k_heads + v_heads)
    M = _dropout_mask_bytes(c, device)
    if attention == "sdpa":
        scores = 4 * a * s * b
    elif spec.attention.dropout > 0:  # softmax output, dropout's mask, dropped-out probabilities
        scores = (4 + M + c) * a * s**2 * b
    else:
        scores = (4 + (0 if c == 4 else 2)) * a * s**2 * b
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
    if masked:
        terms["window_mask"] = window_reached() * c * b * s**2
    return _decoder_part_terms(spec, attention, precision, terms)


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

    >>> from vrammath.readers import read_config
    >>> cfg = {"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 96,
    ...     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    ...     "vocab_size": 100}
    >>> qk_norm_bytes(read_config(cfg), "bf16")
    6*a*b*d*s + 4*a*b*s + 6*a_kv*b*d*s + 4*a_kv*b*s
    >>> qk_norm_bytes(read_config({**cfg, "model_type": "olmo2"}), "bf16")
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
    """A plain GeLU MLP (StarCoder2): the activation's kept tensors (:data:`GELU_KEPT`) and its
    output, ``c_proj``'s input (a dropout mask after ``c_proj`` is added by the caller)."""
    _check("mlp.activation", spec.mlp.activation, tuple(GELU_KEPT))
    return (GELU_KEPT[spec.mlp.activation] + 1) * c * s * b * I


def _check_dropout(spec: ModelSpec, attention: str, precision: str, device: str) -> None:
    """Dropout outside GPT-2 (StarCoder2) is derived for pure precisions, and SDPA on CUDA only."""
    p = (spec.embeddings.dropout, spec.attention.dropout, spec.attention.output_dropout)
    if not any(x > 0 for x in (*p, spec.mlp.dropout)):
        return
    if precision.startswith("autocast"):
        raise InputError("precision", "autocast with dropout is not derived", got=precision)
    if device == "cpu" and attention == "sdpa" and spec.attention.dropout > 0:
        raise InputError(
            "attention",
            "sdpa with dropout runs PyTorch's fp32 math kernel on a CPU; only eager is derived there",
            got=attention,
        )


def _decoder_part_terms(
    spec: ModelSpec, attention: str, precision: str, terms: dict[str, sympy.Expr]
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
    views_kept = attention == "sdpa" and spec.head_dim <= SDPA_GQA_MAX_HEAD_DIM
    if spec.attention.fused_qkv_linear and views_kept:
        extra = c * s * b * (a + a_kv) * d + c * s * b * a * d
        out["qkv"] = sympy.expand(out["qkv"] + extra)
    return out


def hf_checkpointed_forward_bytes(
    spec: ModelSpec,
    attention: Attention = "eager",
    precision: Precision = "bf16",
    *,
    device: Literal["cuda", "cpu"] = "cuda",
) -> sympy.Expr | None:
    """Bytes a checkpointed decoder layer holds at its forward peak, above what was alive when
    it started (non-reentrant checkpointing, eager attention, LLaMA-style layers).

    Explanation
    ===========

    Under ``torch.utils.checkpoint(use_reentrant=False)`` the forward of a layer keeps nothing
    for backward: every saved tensor is dropped as it is packed. What is alive at the layer's
    peak is what its Python frames still reference, op by op (measured with ``MemTracker`` on
    transformers' ``LlamaDecoderLayer``). The peak is at the softmax of eager attention, with

    * the first norm's output (the layer keeps it as ``hidden_states``), in the residual dtype;
    * Q and K after RoPE (4 bytes under autocast: RoPE's fp32 cos/sin promote them; else c),
      V (c), and, when a_kv < a, ``repeat_kv``'s copies of K and V (a d each) -- the originals
      stay referenced by the caller;
    * under autocast, the 16-bit copies of q/k/v_proj's weights (autocast's cache);
    * eight bytes per score element (a s^2 b): the masked scores and the fp32 softmax output
      (fp32 + fp32 under autocast, where the fp32 mask promotes the sum; 16-bit masked scores,
      the fp32 softmax and its 16-bit cast in pure 16-bit; fp32 + fp32 in fp32).

    A GPT-2 block (``GPT2Block``, dropout on) peaks at the attention dropout: the first
    LayerNorm's output and the fused QKV (c sbh + 3c sbh), the softmax output, the dropout's
    noise (CPU: c bytes per element; CUDA's fused kernel: a 1-byte mask) and its output -- while
    ``GPT2Model.forward`` still holds the token and position embeddings it summed (c sbh +
    c sh).

    Returns ``None`` where it is not derived (SDPA).

    >>> from vrammath.presets import load_model
    >>> hf_checkpointed_forward_bytes(load_model("llama-7b"), "eager", "bf16")
    2*a*b*d*s + 8*a*b*s**2 + 4*a_kv*b*d*s + 2*b*h*s
    >>> hf_checkpointed_forward_bytes(load_model("gpt2"), "eager", "fp32", device="cpu")
    12*a*b*s**2 + 20*b*h*s + 4*h*s
    """
    if attention != "eager":
        return None
    c, autocast = _precision(precision)
    sb = s * b
    if spec.norms.kind == "layernorm":
        noise = _dropout_mask_bytes(c, device)
        embeddings = c * sb * h + (c * s * h if spec.embeddings.learned_positions else 0)
        return sympy.expand(embeddings + 4 * c * sb * h + (2 * c + noise) * a * s**2 * b)
    if not spec.mlp.gated:
        return None
    cq = 4 if autocast else c  # Q and K after RoPE
    norm_out = _residual_bytes(precision) * sb * h
    qkv = cq * sb * d * (a + a_kv) + c * sb * a_kv * d
    repeated = (cq + c) * sb * a * d if spec.attention.kv_heads < spec.attention.heads else 0
    casts = 2 * (h * a * d + 2 * h * a_kv * d) if autocast else 0
    return sympy.expand(norm_out + qkv + repeated + casts + 8 * a * s**2 * b)


def hf_last_layer_forward_bytes(
    spec: ModelSpec,
    attention: Attention = "eager",
    precision: Precision = "bf16",
    *,
    device: Literal["cuda", "cpu"] = "cuda",
) -> dict[str, sympy.Expr] | None:
    """The last decoder layer at its softmax without recomputation: what it has not kept yet
    (``later``) and what is alive only then (``live``), for eager attention, LLaMA-style layers,
    pure precision.

    Explanation
    ===========

    Measured op by op (``MemTracker``, live tensors listed at the op). At the last layer's
    softmax the layer has not yet made its MLP's tensors, its second norm's, the MLP's input,
    ``o_proj``'s input or the scores it keeps (``later``: subtracted from forward's end). Alive
    then and freed by forward's end (``live``):

    * the additive (b, 1, s, s) mask and the (1, s) int64 position ids;
    * in pure 16-bit, the layer's input (the ``residual``) and the token embeddings
      (``inputs_embeds``, held by the model's frame): the RMSNorms keep fp32 copies, not these;
    * K after RoPE and V before ``repeat_kv`` (the caller's references), when a_kv < a;
    * the scores: the masked scores and the fp32 softmax output with its 16-bit cast (8 bytes
      per element), or on a CPU the fp32 copy of 16-bit scores ``softmax(dtype=float32)``
      makes before the kernel (10 bytes per element at the softmax).

    Returns ``None`` where it is not derived (SDPA, autocast, GPT-2 blocks).

    >>> from vrammath.presets import load_model
    >>> sorted(hf_last_layer_forward_bytes(load_model("llama-7b"), "eager", "bf16"))
    ['later', 'live']
    """
    if attention != "eager" or spec.norms.kind != "rmsnorm" or not spec.mlp.gated:
        return None
    c, autocast = _precision(precision)
    if autocast:
        return None
    sb = s * b
    terms = hf_layer_terms(spec, attention, precision, device=device)
    later = terms["mlp"] + terms["norms"] / 2 + terms["output"] + terms["scores"] + c * sb * h
    repeated = spec.attention.kv_heads < spec.attention.heads
    originals = 2 * c * sb * a_kv * d if repeated else 0
    own = 2 * c * sb * h if c == 2 else 0  # the residual and inputs_embeds
    scores = (10 if device == "cpu" and c == 2 else 8) * a * s**2 * b
    live = c * b * s**2 + 8 * s + own + originals + scores
    return {"later": sympy.expand(later), "live": sympy.expand(live)}


def hf_top_layer_backward_bytes(
    spec: ModelSpec, attention: Attention = "eager", precision: Precision = "bf16"
) -> dict[str, sympy.Expr] | None:
    """The top decoder layer at its softmax backward without recomputation: what its backward
    has freed by then (``freed``) and the gradients in flight (``in_flight``), for eager
    attention, LLaMA-style layers, pure precision.

    Explanation
    ===========

    Measured op by op (``MemTracker``, live tensors listed at the op). By the softmax backward
    the layer's MLP, second norm and ``o_proj`` are back-propagated, freeing what they kept and
    the MLP's input; ``bmm(probs, V)``'s backward has freed the repeated V and, in 16-bit, the
    16-bit probabilities (in fp32 they are the kept softmax output itself). In flight: the
    layer's incoming gradient (sbh), the attention output's gradient (sb a d), both in c bytes,
    and eight bytes per score element (the probabilities' gradient in fp32 and the softmax
    backward's fp32 output). The weight gradients made by then are the phase model's
    (:func:`vrammath.peak.hf_phase_peaks`).

    >>> from vrammath.presets import load_model
    >>> sorted(hf_top_layer_backward_bytes(load_model("llama-7b"), "eager", "bf16"))
    ['freed', 'in_flight']
    """
    if attention != "eager" or spec.norms.kind != "rmsnorm" or not spec.mlp.gated:
        return None
    c, autocast = _precision(precision)
    if autocast:
        return None
    sb = s * b
    terms = hf_layer_terms(spec, attention, precision)
    probs = 2 * a * s**2 * b if c == 2 else 0
    freed = terms["mlp"] + terms["norms"] / 2 + terms["output"] + c * sb * h + probs
    freed += c * sb * a * d  # the repeated V
    in_flight = c * sb * h + c * sb * a * d + 8 * a * s**2 * b
    return {"freed": sympy.expand(freed), "in_flight": sympy.expand(in_flight)}


def hf_checkpointed_backward_bytes(
    spec: ModelSpec,
    attention: Attention = "eager",
    precision: Precision = "bf16",
    *,
    device: Literal["cuda", "cpu"] = "cuda",
) -> dict[str, sympy.Expr] | None:
    """Activation bytes a checkpointed decoder layer holds at its backward peak (``layer``),
    above what was alive before its recomputation (its input, ``checkpoint``, included), for non-reentrant checkpointing, eager
    attention and LLaMA-style layers. The weight gradients made by then are counted by the
    phase model (:func:`vrammath.peak.hf_phase_peaks`).

    Explanation
    ===========

    The layer is recomputed with saving, then back-propagated from the top: the MLP, the second
    norm and ``o_proj`` are done (their saved tensors freed) and ``bmm(probs, V)``'s backward has
    freed the 16-bit probabilities and V when the softmax backward runs -- the peak (measured op
    by op with ``MemTracker``, the live tensors listed at that op). Alive from the recomputation:

    * the first norm's saved tensors (:func:`_norm_kept`), less its fp32 input where the residual
      stream is fp32 (fp32 and autocast: the upcast is a no-op and the input is the checkpoint);
    * the q/k/v linears' inputs: one shared c sbh tensor, or under autocast three 16-bit casts;
    * Q and the repeated K that ``Q K^T`` saves (c sb a d each, 16-bit under autocast);
    * the fp32 softmax output (4 a s^2 b); under autocast the q/k/v weight casts;

    and the gradients in flight: the layer's incoming gradient (residual dtype, sbh), the
    attention output's gradient (c sb a d) and eight bytes per score element -- the
    probabilities' gradient cast to fp32 and the softmax backward's fp32 output.

    A GPT-2 block peaks earlier, at ``bmm(probs, V)``'s backward: its first LayerNorm's
    statistics and output, the fused QKV, the softmax output, the dropout's noise and output are
    alive, with the incoming gradient, the attention output's gradient and its contiguous copy
    (c sbh each) and the gradient of the dropped-out probabilities (c a s^2 b).

    Returns ``None`` where it is not derived (SDPA).

    >>> from vrammath.presets import load_model
    >>> hf_checkpointed_backward_bytes(load_model("llama-7b"), "eager", "fp32")
    {'layer': 12*a*b*d*s + 12*a*b*s**2 + 12*b*h*s + 4*b*s, 'checkpoint': 4*b*h*s}
    """
    if attention != "eager":
        return None
    c, autocast = _precision(precision)
    res = _residual_bytes(precision)
    sb = s * b
    if spec.norms.kind == "layernorm":
        noise = _dropout_mask_bytes(c, device)
        stats = _norm_kept(spec, precision, device) - c * sb * h  # its input is the checkpoint
        recomputed = stats + c * sb * h + 3 * c * sb * h + (2 * c + noise) * a * s**2 * b
        grads = res * sb * h + 2 * c * sb * h + c * a * s**2 * b
        return {"layer": sympy.expand(recomputed + grads), "checkpoint": res * sb * h}
    if not spec.mlp.gated:
        return None
    norm = _norm_kept(spec, precision, "cuda") - (4 * sb * h if res == 4 else 0)
    inputs = 3 * 2 * sb * h if autocast else c * sb * h
    qk = 2 * c * sb * a * d
    casts = 2 * (h * a * d + 2 * h * a_kv * d) if autocast else 0
    in_flight = res * sb * h + c * sb * a * d + 8 * a * s**2 * b
    return {
        "layer": sympy.expand(norm + inputs + qk + 4 * a * s**2 * b + casts + in_flight),
        "checkpoint": res * sb * h,
    }


# ---------------------------------------------------------------------------------------------
# Sliding-window layers (Mistral, Qwen2 with use_sliding_window, Gemma-2/3)
# ---------------------------------------------------------------------------------------------


def window_reached() -> sympy.Expr:
    """1 once the sequence reaches the window (s >= w), else 0.

    transformers skips the mask (SDPA's ``is_causal``) only while the key length is below the
    window (``masking_utils._ignore_causal_mask_sdpa``); from s = w on it builds an explicit one.

    >>> from vrammath.symbols import s, w_win
    >>> [window_reached().subs({s: n, w_win: 4096}) for n in (4095, 4096)]
    [0, 1]
    """
    return sympy.Piecewise((1, s >= w_win), (0, True))


def _window_layer_count(spec: ModelSpec) -> sympy.Expr:
    """Layers with a sliding window: L when all of them slide, else the spec's number."""
    n = spec.attention.window_layers if spec.sliding_window is not None else 0
    return L if n == spec.layers else sympy.Integer(n)


def _stacked_layers(
    spec: ModelSpec,
    attention: Attention,
    precision: Precision,
    gelu: str | None,
    device: Literal["cuda", "cpu"],
) -> sympy.Expr:
    """All L layers without recomputation: global layers plus sliding-window layers."""
    full = hf_layer_bytes(spec, attention, precision, gelu=gelu, device=device)
    n = _window_layer_count(spec)
    if n == 0:
        return L * full
    sliding = hf_layer_bytes(spec, attention, precision, gelu=gelu, device=device, sliding=True)
    return (L - n) * full + n * sliding


def _checkpoint_masks(spec: ModelSpec, attention: Attention, res: int) -> sympy.Expr:
    """The masks the layer checkpoints hold under full recomputation.

    Eager: one additive (b, 1, s, s) mask in the parameters' dtype per kind of layer (causal,
    sliding). SDPA: only sliding layers at s >= w have one, a boolean (1, 1, s, s) broadcast
    over the batch.
    """
    n = _window_layer_count(spec)
    if attention == "eager":
        kinds = 1 + (1 if n not in (0, L) else 0)
        return kinds * res * b * s**2
    return window_reached() * s**2 if n != 0 else sympy.Integer(0)


GELU_KEPT: dict[str, int] = {"gelu": 1, "gelu_pytorch_tanh": 1, "gelu_new": 4, "gelu_fast": 7}
"""I-sized tensors each GeLU variant of transformers keeps for backward (besides its output).

``gelu`` and ``gelu_pytorch_tanh`` are single PyTorch ops that keep their input; ``gelu_new`` (GPT-2's
config) is written in Python, ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, and autograd keeps
x, the tanh output, 0.5x and 1 + tanh (measured); ``gelu_fast``,
``0.5 x (1 + tanh(0.79788456 x (1 + 0.044715 x x)))``, keeps x, 0.044715x, 0.79788456x, the
inner sum, the tanh output, 0.5x and 1 + tanh (measured with GPT-NeoX).
"""


def gpt2_layer_terms(
    spec: ModelSpec,
    attention: Attention = "eager",
    precision: Precision = "bf16",
    *,
    gelu: str | None = None,
    device: Literal["cuda", "cpu"] = "cuda",
) -> dict[str, sympy.Expr]:
    """Bytes one ``GPT2Block`` of transformers keeps for backward, per tensor group.

    Explanation
    ===========

    transformers' GPT-2 block: LayerNorm, a fused ``c_attn`` producing Q, K, V, attention with
    dropout on the probabilities, ``c_proj`` and a residual dropout, LayerNorm, a GeLU MLP
    (``c_fc``, ``c_proj``) and dropout. With c the compute bytes, M the bytes of a dropout mask
    and S those of a LayerNorm statistic:

    * ``norms`` -- each LayerNorm keeps its input (c sbh), its mean and inverse std (S bs each).
    * ``inputs`` -- the inputs of ``c_attn`` and ``c_fc`` (the norms' outputs, c sbh each).
    * ``qkv`` -- Q, K, V: 3c sbh (contiguous copies ``matmul`` makes of the head views).
    * ``scores`` -- eager: the softmax output, the dropout mask and the dropped-out probabilities,
      (2c + M) as^2b; SDPA (flash, CUDA): the log-sum-exp, 4asb.
    * ``output`` -- the merged heads (``c_proj``'s input, c sbh) and the residual dropout mask.
    * ``mlp`` -- the GeLU's kept tensors (:data:`GELU_KEPT`), its output (``c_proj``'s input) and
      the dropout mask: (k + 1) c sbI + M sbh.

    On CUDA dropout is the fused ``native_dropout`` and keeps a bool mask (M = 1), and LayerNorm's
    statistics are fp32 (S = 4). On a CPU dropout multiplies by a noise tensor of the input's dtype
    (M = c) and LayerNorm keeps its statistics in the input's dtype (S = c); ``device="cpu"`` gives
    what the CPU measurement sees. With ``gelu_pytorch_tanh`` (k = 1), c = 2 and M = 1 this is
    Korthikanti et al.'s 34sbh + 5as^2b plus the LayerNorm statistics (16bs).

    Examples
    ========

    >>> from vrammath.presets import load_model
    >>> from vrammath.symbols import I, h
    >>> layer = sum(gpt2_layer_terms(load_model("gpt2"), gelu="gelu_pytorch_tanh").values())
    >>> layer.subs(I, 4 * h) - korthikanti_layer_bytes()
    16*b*s

    Parameters
    ==========

    spec : ModelSpec
        A GPT-2 model (LayerNorm, plain GeLU MLP, dropout on).
    attention : "eager" or "sdpa"
    precision : "fp32", "bf16" or "fp16" (autocast is not derived for GPT-2)
    gelu : one of :data:`GELU_KEPT`, optional
        Overrides the spec's ``mlp.activation`` (the config's ``activation_function``).
    device : "cuda" or "cpu"
        Whose dropout and LayerNorm kernels (see above).

    See Also
    ========

    hf_layer_terms, korthikanti_layer_terms
    """
    _check("attention", attention, ATTENTIONS)
    _check("precision", precision, ("fp32", "bf16", "fp16"))
    gelu = spec.mlp.activation if gelu is None else gelu
    _check("gelu", gelu, tuple(GELU_KEPT))
    _check("device", device, DEVICES)
    dropouts = (spec.attention.dropout, spec.attention.output_dropout, spec.mlp.dropout)
    if not all(p > 0 for p in dropouts):
        raise InputError(
            "dropout",
            "GPT-2's formula is derived with attention, residual and MLP dropout on",
            got=dropouts,
        )
    if device == "cpu" and attention == "sdpa":
        raise InputError(
            "attention",
            "sdpa with dropout runs PyTorch's fp32 math kernel on a CPU; only eager is derived there",
            got=attention,
        )
    c, _ = _precision(precision)
    M = _dropout_mask_bytes(c, device)
    sb = s * b
    scores = (2 * c + M) * a * s**2 * b if attention == "eager" else 4 * a * s * b
    return {
        "norms": 2 * _norm_kept(spec, precision, device),
        "inputs": 2 * c * sb * h,
        "qkv": 3 * c * sb * h,
        "scores": sympy.expand(scores),
        "output": c * sb * h + M * sb * h,
        "mlp": (GELU_KEPT[gelu] + 1) * c * sb * I + M * sb * h,
        "weight_casts": sympy.Integer(0),
    }


def neox_layer_terms(
    spec: ModelSpec,
    attention: Attention = "sdpa",
    precision: Precision = "bf16",
    *,
    device: Literal["cuda", "cpu"] = "cuda",
) -> dict[str, sympy.Expr]:
    """Bytes one ``GPTNeoXLayer`` of transformers keeps for backward, per tensor group.

    Explanation
    ===========

    GPT-NeoX (Pythia, GPT-NeoX-20B): LayerNorm with bias, one ``query_key_value`` projection,
    RoPE on the first ``rotary_dim`` dimensions of each head, ``dense``, and a plain GeLU MLP
    (``dense_h_to_4h``, ``dense_4h_to_h``); with ``use_parallel_residual`` both norms read the
    same layer input. Dropout is 0 (the reader refuses more). With c the compute bytes and S the
    bytes of a LayerNorm statistic (:func:`gpt2_layer_terms`):

    * ``norms`` -- each LayerNorm keeps its input (c sbh) and two statistics (S bs each); with the
      parallel residual both inputs are the same tensor, kept once.
    * ``inputs`` -- the inputs of ``query_key_value`` and ``dense_h_to_4h``: 2c sbh.
    * ``qkv`` -- Q and K after RoPE (the ``cat`` of rotated and passed dimensions, c sbh each)
      and V; V is a view of the fused projection's output, so SDPA keeps that whole (b, s, 3h)
      output (3c sbh) and one more c sbh (measured on a CPU), while eager attention's
      ``matmul`` keeps a contiguous copy of V (c sbh).
    * ``scores`` -- as LLaMA's: eager keeps the fp32 softmax output and its 16-bit cast; SDPA
      the log-sum-exp, 4asb.
    * ``output`` -- ``dense``'s input, c sbh.
    * ``mlp`` -- the GeLU's kept tensors (:data:`GELU_KEPT`) and its output: (k + 1) c sbI.

    Examples
    ========

    >>> from vrammath.model import from_hf_config
    >>> spec = from_hf_config({"model_type": "gpt_neox", "hidden_size": 64,
    ...     "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
    ...     "vocab_size": 100})
    >>> neox_layer_terms(spec, "sdpa", "bf16")["qkv"]
    12*b*h*s

    References
    ==========

    .. [1] transformers ``models/gpt_neox/modeling_gpt_neox.py`` (v5).
    """
    _check("attention", attention, ATTENTIONS)
    _check("precision", precision, ("fp32", "bf16", "fp16"))
    _check("device", device, DEVICES)
    c, _ = _precision(precision)
    sb = s * b
    norm = _norm_kept(spec, precision, device)
    stats = norm - c * sb * h
    norms = norm + stats if spec.norms.parallel_residual else 2 * norm
    kept_v = 4 * c * sb * h if attention == "sdpa" else c * sb * h
    scores = (4 + (0 if c == 4 else 2)) * a * s**2 * b if attention == "eager" else 4 * a * s * b
    return {
        "norms": sympy.expand(norms),
        "inputs": 2 * c * sb * h,
        "qkv": sympy.expand(2 * c * sb * h + kept_v),
        "scores": sympy.expand(scores),
        "output": c * sb * h,
        "mlp": (GELU_KEPT[spec.mlp.activation] + 1) * c * sb * I,
        "weight_casts": sympy.Integer(0),
    }


def hf_layer_bytes(
    spec: ModelSpec,
    attention: Attention = "sdpa",
    precision: Precision = "bf16",
    *,
    gelu: str | None = None,
    device: Literal["cuda", "cpu"] = "cuda",
    sliding: bool = False,
) -> sympy.Expr:
    """Bytes one decoder layer keeps for backward: the sum of :func:`hf_layer_terms`.

    >>> from vrammath.presets import load_model
    >>> hf_layer_bytes(load_model("llama-7b"), "sdpa", "bf16")
    8*I*b*s + 4*a*b*d*s + 4*a*b*s + 4*a_kv*b*d*s + 16*b*h*s + 8*b*s
    """
    terms = hf_layer_terms(spec, attention, precision, gelu=gelu, device=device, sliding=sliding)
    return sympy.expand(sum(terms.values(), sympy.Integer(0)))


def hf_logits_loss_terms(spec: ModelSpec, precision: Precision = "bf16") -> dict[str, sympy.Expr]:
    """Bytes the output side keeps at the end of forward, and the loss's transients.

    Explanation
    ===========

    transformers' causal-LM loss upcasts the logits (``logits.float()``) and runs
    ``cross_entropy`` = ``log_softmax`` + ``nll_loss``. ``log_softmax`` keeps its fp32 output
    (4sbV) for backward; ``nll_loss`` keeps the shifted labels (int64, 8bs) and two scalars. The
    logits themselves are not kept once the model's output is dropped, but they and the fp32
    copy are alive while the loss is computed:

    * ``kept`` -- 4sbV + 8bs + 8 (the log-softmax output, the labels, the loss and total weight);
      at b = 1 the shifted labels stay a view of the padded labels, which are 8 bytes longer
      (the Kronecker delta).
    * ``forward_transient`` -- extra at the loss's peak: the logits (c sbV) and, for 16-bit
      logits, their fp32 copy (4sbV); under autocast also the final norm's fp32 output (4sbh),
      which the model output holds as ``last_hidden_state`` while the loss runs (in pure
      precision it is the head's kept input itself).
    * ``backward_transient`` -- extra at the start of backward: the gradient of the log-softmax
      output and of its input (4sbV each), then the 16-bit cast of the latter.

    >>> from vrammath.presets import load_model
    >>> hf_logits_loss_terms(load_model("qwen2-72b"), "bf16")["kept"]
    4*V*b*s + 8*b*s + 8*KroneckerDelta(1, b) + 8
    """
    c, autocast = _precision(precision)
    sb = s * b
    last_hidden = 4 * sb * h if autocast else 0
    # Gemma-2's cap * tanh(logits / cap): tanh keeps its output in the logits' dtype
    capped = c * sb * V if spec.embeddings.logit_softcap is not None else 0
    return {
        "kept": 4 * sb * V + 8 * sb + 8 + 8 * sympy.KroneckerDelta(b, 1) + capped,
        "forward_transient": c * sb * V + (4 * sb * V if c == 2 else 0) + last_hidden,
        "backward_transient": 8 * sb * V,
    }


def hf_logits_loss_bytes(spec: ModelSpec, precision: Precision = "bf16") -> sympy.Expr:
    """Bytes the logits and the loss keep at the end of forward: 4sbV + 8bs + 8 (+8 at b = 1).

    >>> from vrammath.presets import load_model
    >>> from vrammath.symbols import b, s, V
    >>> float(hf_logits_loss_bytes(load_model("qwen2-72b")).subs({b: 1, s: 4096, V: 152064})) / 2**30
    2.320343032479286
    """
    return sympy.expand(hf_logits_loss_terms(spec, precision)["kept"])


def hf_activation_terms(
    spec: ModelSpec,
    attention: Attention = "sdpa",
    precision: Precision = "bf16",
    recompute: HfRecompute = "none",
    *,
    gelu: str | None = None,
    device: Literal["cuda", "cpu"] = "cuda",
) -> dict[str, sympy.Expr]:
    """Every tensor group the whole model keeps for backward at the end of forward.

    Explanation
    ===========

    ``layers`` is L times :func:`hf_layer_bytes` without recomputation; with full recomputation
    (transformers' ``gradient_checkpointing_enable()``, non-reentrant checkpoints per decoder
    layer) each layer keeps only its input, L s b h in the residual stream's dtype, and the
    checkpoints share the tensors every layer receives: the eager (b, 1, s, s) additive mask in
    the parameters' dtype and LLaMA's (1, s) int64 position ids.

    One corner is not in the formula: eager attention with a single KV head (MQA) at b = 1,
    where ``repeat_kv`` and ``matmul`` keep stride-0 views and V is kept at a_kv d, not a d. The rest:
    RoPE's cos and sin (one (s, d) table each, shared by all layers and the batch), the final
    norm and the LM head's input, the LM head's 16-bit weight copy under autocast, and
    :func:`hf_logits_loss_bytes`.

    GPT-2 adds the embedding dropout mask, keeps its position ids and one more int64 (b, s)
    tensor, and has no RoPE (see :func:`gpt2_layer_terms` for ``gelu`` and ``device``).

    >>> from vrammath.presets import load_model
    >>> sorted(hf_activation_terms(load_model("llama-7b")))
    ['final_norm', 'head_input', 'head_weight_cast', 'layers', 'logits_loss', 'rope']
    """
    _check("recompute", recompute, HF_RECOMPUTE)
    if recompute == "full" and not spec.attention.fused_qkv:
        # the attention kernel's tensors are recomputed: only autocast is refused with dropout
        _check_dropout(spec, "eager", precision, device)
    c, autocast = _precision(precision)
    res = _residual_bytes(precision)
    sb = s * b
    if recompute == "full":
        layers = L * res * sb * h
        layers += _checkpoint_masks(spec, attention, res)  # the checkpoints also hold the masks
        if not spec.embeddings.learned_positions:  # ... and RoPE's (1, s) int64 position ids
            layers += 8 * s
    elif spec.experts is not None:
        layers = _moe_layers_bytes(spec, attention, precision, device)
    else:
        layers = _stacked_layers(spec, attention, precision, gelu, device)
    terms: dict[str, sympy.Expr] = {"layers": layers}
    learned = spec.embeddings.learned_positions
    if not learned:
        rotary = spec.attention.rotary_dim
        # a partial table has 2 ceil(r / 2) columns: the frequencies of every other dimension, twice
        width = d if rotary is None else 2 * (-(-rotary // 2))
        terms["rope"] = 2 * s * width * (4 if spec.attention.rope_fp32 else res)
        n_win = _window_layer_count(spec)
        if spec.attention.qk_norm == "head" and spec.norms.unit_offset and n_win not in (0, L):
            # Gemma-3: a second (cos, sin) pair with the sliding layers' own base
            terms["rope"] *= 2
    if spec.embeddings.dropout > 0:
        terms["embedding_dropout"] = _dropout_mask_bytes(c, device) * sb * h
    if learned:
        terms["positions"] = 8 * s  # int64 position ids kept by the position embedding
    terms["final_norm"] = (
        _unit_offset_norm_kept() if spec.norms.unit_offset else _norm_kept(spec, precision, device)
    )
    if learned:
        terms["labels_copy"] = 8 * sb  # one more int64 (b, s) tensor GPT-2 keeps (measured)
    terms["head_input"] = (2 if autocast else c) * sb * h
    terms["head_weight_cast"] = 2 * V * h if autocast else sympy.Integer(0)
    terms["logits_loss"] = hf_logits_loss_bytes(spec, precision)
    return {k: sympy.expand(v) for k, v in terms.items()}


# --- mixture-of-experts layers (vrammath.moe) ---------------------------------------------------

MOE_ACTIVATION_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe")
"""MoE model types whose whole layer is derived: GQA attention as LLaMA's (with Qwen3's q/k
norms), MoE MLP measured."""


def _moe_layers_bytes(
    spec: ModelSpec, attention: Attention, precision: Precision, device: Literal["cuda", "cpu"]
) -> sympy.Expr:
    """``L - L_e`` dense layers plus ``L_e`` layers whose SwiGLU term is the MoE block's
    (:func:`vrammath.moe.moe_mlp_kept_exprs`; the block's output is freed by the residual add)."""
    from vrammath.moe import moe_mlp_kept_exprs
    from vrammath.symbols import L_e

    if spec.model_type not in MOE_ACTIVATION_TYPES:
        missing = "latent attention" if spec.latent is not None else "its attention"
        raise InputError(
            "model",
            f"activations of {spec.model_type} need {missing}, not derived yet "
            f"(derived: {', '.join(MOE_ACTIVATION_TYPES)})",
            got=spec.name,
        )
    if precision != "bf16":
        raise InputError(
            "precision",
            "MoE activations are derived and measured in bf16 only (the grouped matmul takes "
            "bf16 inputs)",
            got=precision,
        )
    # Qwen3-MoE's q/k norms are Qwen3's (qk_norm_bytes, in the layer terms' "qk_norms")
    terms = hf_layer_terms(spec, attention, precision, device=device)
    dense = sum(terms.values(), sympy.Integer(0))
    moe = moe_mlp_kept_exprs(spec)
    moe_layer = dense - terms["mlp"] + moe["router"] + moe["experts"] + moe["shared"]
    return (L - L_e) * dense + L_e * moe_layer


def hf_activation_bytes(
    spec: ModelSpec,
    attention: Attention = "sdpa",
    precision: Precision = "bf16",
    recompute: HfRecompute = "none",
    *,
    gelu: str | None = None,
    device: Literal["cuda", "cpu"] = "cuda",
) -> sympy.Expr:
    """Total bytes kept for backward at the end of forward (sum of :func:`hf_activation_terms`).

    >>> from vrammath.presets import load_model
    >>> from vrammath.params import size_values
    >>> from vrammath.symbols import b, s
    >>> spec = load_model("llama-7b")
    >>> e = hf_activation_bytes(spec, "sdpa", "bf16")
    >>> round(e.subs({**size_values(spec), b: 1, s: 4096}) / 2**30, 2)
    23.38
    """
    terms = hf_activation_terms(spec, attention, precision, recompute, gelu=gelu, device=device)
    return sympy.expand(sum(terms.values(), sympy.Integer(0)))


def activation_exprs(
    spec: ModelSpec,
    attention: Attention = "sdpa",
    precision: Precision = "bf16",
    recompute: HfRecompute = "none",
    *,
    gelu: str | None = None,
    device: Literal["cuda", "cpu"] = "cuda",
) -> dict[str, sympy.Expr]:
    """Named components for an estimate: ``activations`` (layers + rest) and ``logits_loss``.

    >>> from vrammath.presets import load_model
    >>> sorted(activation_exprs(load_model("gpt2")))
    ['activations', 'logits_loss']
    """
    terms = hf_activation_terms(spec, attention, precision, recompute, gelu=gelu, device=device)
    logits = terms.pop("logits_loss")
    return {
        "activations": sympy.expand(sum(terms.values(), sympy.Integer(0))),
        "logits_loss": logits,
    }


__all__ = [
    "ATTENTIONS",
    "DEVICES",
    "GELU_KEPT",
    "HF_RECOMPUTE",
    "PARALLEL",
    "PRECISIONS",
    "RECOMPUTE",
    "SCHEDULES",
    "SDPA_GQA_MAX_HEAD_DIM",
    "activation_exprs",
    "gpt2_layer_terms",
    "hf_activation_bytes",
    "hf_activation_terms",
    "hf_checkpointed_backward_bytes",
    "hf_checkpointed_forward_bytes",
    "hf_last_layer_forward_bytes",
    "hf_layer_bytes",
    "hf_layer_terms",
    "hf_logits_loss_bytes",
    "hf_logits_loss_terms",
    "hf_top_layer_backward_bytes",
    "korthikanti_extra_terms",
    "korthikanti_first_stage_bytes",
    "korthikanti_interleave_factor",
    "korthikanti_layer_bytes",
    "korthikanti_layer_terms",
    "neox_layer_terms",
    "qk_norm_bytes",
    "window_reached",
]
