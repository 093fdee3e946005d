"""Op-by-op peaks of one decoder layer: what is alive at its forward and backward peaks.

Checkpointed layers (non-reentrant ``torch.utils.checkpoint``), the last layer's forward and the
top layer's backward, measured op by op with ``MemTracker`` on transformers' decoder layers;
:mod:`vrammath.compose.peak` composes them into a step's peaks.

Examples
========

>>> from vrammath.model.presets import load_model
>>> hf_checkpointed_forward_bytes(load_model("llama-7b"), "sdpa") is None
True
"""

from __future__ import annotations

from collections.abc import Mapping

import sympy

from vrammath.model.spec import ModelSpec
from vrammath.notation.signatures import after
from vrammath.notation.symbols import I, a, a_kv, b, d, h, s
from vrammath.terms.activations.gpt import GELU_KEPT
from vrammath.terms.activations.layer import hf_layer_terms
from vrammath.terms.activations.parts import (
    EagerLayerOptions,
    LayerOptions,
    Precision,
    _dropout_mask_bytes,
    _norm_kept,
    _precision,
    _residual_bytes,
)


@after(EagerLayerOptions)
def hf_checkpointed_forward_bytes(layer: EagerLayerOptions) -> sympy.Expr | None:
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

    >>> from vrammath.model.presets import load_model
    >>> hf_checkpointed_forward_bytes(load_model("llama-7b"), "eager", "bf16")
    2*a*b*d*s + 8*a*b*s**2 + 4*a_kv*b*d*s + 2*b*h*s
    >>> hf_checkpointed_forward_bytes(load_model("gpt2"), "eager", "fp32", device="cpu")
    12*a*b*s**2 + 20*b*h*s + 4*h*s
    """
    spec, attention, precision, device = layer.spec, layer.attention, layer.precision, layer.device
    if attention != "eager":
        return None
    c, autocast = _precision(precision)
    sb = s * b
    if spec.norms.kind == "layernorm":
        # without attention dropout the peak is at the softmax: its input and output (2c)
        noise = _dropout_mask_bytes(c, device) if spec.attention.dropout > 0 else 0
        embeddings = c * sb * h + (c * s * h if spec.embeddings.learned_positions else 0)
        return sympy.expand(embeddings + 4 * c * sb * h + (2 * c + noise) * a * s**2 * b)
    if not spec.mlp.gated:
        return None
    cq = 4 if autocast else c  # Q and K after RoPE
    norm_out = _residual_bytes(precision) * sb * h
    qkv = cq * sb * d * (a + a_kv) + c * sb * a_kv * d
    repeated = (cq + c) * sb * a * d if spec.attention.kv_heads < spec.attention.heads else 0
    casts = 2 * (h * a * d + 2 * h * a_kv * d) if autocast else 0
    per_score = 8
    if spec.attention.dropout > 0:
        # at the dropout: the fp32 softmax output, its cast to the query's dtype (none when
        # that is fp32), the dropout's mask and output in the query's dtype
        q_bytes = 4 if c == 4 or (autocast and not spec.attention.rope_fp32) else c
        cast = 0 if q_bytes == 4 else q_bytes
        per_score = max(per_score, 4 + cast + _dropout_mask_bytes(q_bytes, device) + q_bytes)
    return sympy.expand(norm_out + qkv + repeated + casts + per_score * a * s**2 * b)


@after(EagerLayerOptions)
def hf_last_layer_forward_bytes(layer: EagerLayerOptions) -> dict[str, sympy.Expr] | None:
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

    >>> from vrammath.model.presets import load_model
    >>> sorted(hf_last_layer_forward_bytes(load_model("llama-7b"), "eager", "bf16"))
    ['later', 'live']
    """
    spec, device = layer.spec, layer.device
    if layer.attention != "eager" or spec.norms.kind != "rmsnorm" or not spec.mlp.gated:
        return None
    if (pure := _pure_layer_terms(layer)) is None:
        return None
    c, terms = pure
    sb = s * b
    later = _after_attention(terms, c) + terms["scores"]
    repeated = spec.attention.kv_heads < spec.attention.heads
    originals = 2 * c * sb * a_kv * d if repeated else 0
    own = 2 * c * sb * h if c == 2 else 0  # the residual and inputs_embeds
    scores = (10 if device == "cpu" and c == 2 else 8) * a * s**2 * b
    live = c * b * s**2 + 8 * s + own + originals + scores
    return {"later": sympy.expand(later), "live": sympy.expand(live)}


def _pure_layer_terms(layer: LayerOptions) -> tuple[int, dict[str, sympy.Expr]] | None:
    """(compute bytes, :func:`~vrammath.terms.activations.layer.hf_layer_terms`) of a layer in
    pure precision; None under autocast, whose op-by-op walks are not derived."""
    c, autocast = _precision(layer.precision)
    if autocast:
        return None
    return c, hf_layer_terms(layer.spec, layer.attention, layer.precision, device=layer.device)


def _after_attention(terms: Mapping[str, sympy.Expr], c: int) -> sympy.Expr:
    """What a layer (:func:`~vrammath.terms.activations.layer.hf_layer_terms`) keeps after its
    attention: the MLP's tensors, the second norm's, ``o_proj``'s input and the MLP's input."""
    return terms["mlp"] + terms["norms"] / 2 + terms["output"] + c * s * b * h


def _gpt2_mlp_backward_bytes(spec: ModelSpec, c: int, res: int, device: str) -> sympy.Expr:
    """A checkpointed GPT-2 block at its GeLU's backward (a one-op GeLU), where it peaks when
    the MLP's tensors outweigh the scores (short sequences): the recomputed layer up to ``c_fc``
    -- the first LayerNorm's statistics and output, the copies of Q, K^T and V the matmuls
    kept, the softmax output (with dropout's mask and output), the merged heads and the
    attention's residual dropout mask, the second LayerNorm's input, statistics and output,
    ``c_fc``'s output -- and in flight the incoming gradient and two I-sized gradients (of the
    GeLU's output and of its input). With residual dropout the peak comes one op earlier, at
    ``c_proj``'s weight gradient, with the dropout's input gradient (c sbh) alive and the GeLU's
    output still kept instead of its input gradient. Measured op by op with ``MemTracker``."""
    sb = s * b
    stats = 2 * (_norm_kept(spec, "fp32" if c == 4 else "bf16", device) - c * sb * h)
    score = c * a * s**2 * b
    if spec.attention.dropout > 0:
        score += (_dropout_mask_bytes(c, device) + c) * a * s**2 * b
    resid = _dropout_mask_bytes(c, device) * sb * h if spec.mlp.dropout > 0 else 0
    attention = c * sb * h + 3 * c * sb * h + score + c * sb * h + resid
    mlp = 2 * c * sb * h + c * sb * I
    grads = res * sb * h + 2 * c * sb * I
    if spec.mlp.dropout > 0:  # the peak is at c_proj's backward: its dropout's gradient too
        grads += c * sb * h
    return sympy.expand(stats + attention + mlp + grads)


def hf_math_attention_forward_bytes(
    spec: ModelSpec, precision: Precision = "bf16"
) -> dict[str, sympy.Expr] | None:
    """The last decoder layer at the end of SDPA's math kernel (a CPU with attention dropout),
    without recomputation: what the layer has not kept yet (``later``) and what is alive only
    then (``live``), for LLaMA-style layers and pure precision.

    Explanation
    ===========

    Measured op by op (``MemTracker``, each live tensor named by the op that made it). At the
    cast of the kernel's fp32 output back to 16 bits the layer has not yet kept its MLP's
    tensors, its second norm's, the MLP's input or ``o_proj``'s input (``later``). Alive then
    and freed by forward's end (``live``):

    * the (1, s) int64 position ids, the kernel's (s, s) fp32 causal bias, and in 16-bit the
      layer's input and the token embeddings (as at the softmax of eager attention);
    * Q, K and V after RoPE (c sb (a + 2 a_kv) d) and the kernel's two more fp32 copies at
      a heads (the repeated K before scaling and a contiguous V: 8 sb a d; one, 4 sb a d,
      without GQA, where nothing is repeated);
    * the output being made (c sb a d); in 16-bit also the fp32 upcasts of Q, K and V
      (4 sb (a + 2 a_kv) d), the kernel's fp32 output (4 sb a d) and the 16-bit copy of the
      dropped-out probabilities the kernel returns beside it (c as^2b).

    Returns ``None`` where it is not derived (no attention dropout, autocast, GPT blocks).

    >>> from vrammath.model.readers import from_hf_config
    >>> spec = from_hf_config({"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
    ...     "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
    ...     "attention_dropout": 0.1})
    >>> hf_math_attention_forward_bytes(spec, "fp32")["live"]
    12*a*b*d*s + 8*a_kv*b*d*s + 4*s**2 + 8*s
    """
    c, autocast = _precision(precision)
    if autocast or spec.attention.dropout == 0 or spec.attention.fused_qkv:
        return None
    sb = s * b
    later = _after_attention(hf_layer_terms(spec, "sdpa", precision, device="cpu"), c)
    own = 2 * c * sb * h if c == 2 else 0
    copies = 2 if spec.attention.kv_heads < spec.attention.heads else 1  # no K repeat in MHA
    live = 8 * s + 4 * s**2 + own + c * sb * (a + 2 * a_kv) * d + c * sb * a * d
    live += copies * 4 * sb * a * d
    if c == 2:
        live += 4 * sb * (a + 2 * a_kv) * d + 4 * sb * a * d + c * a * s**2 * b
    return {"later": sympy.expand(later), "live": sympy.expand(live)}


@after(EagerLayerOptions)
def hf_top_layer_backward_bytes(layer: EagerLayerOptions) -> dict[str, sympy.Expr] | None:
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
    (:func:`vrammath.compose.peak.hf_phase_peaks`).

    StarCoder2's layer (LayerNorm, a plain GeLU MLP, LLaMA's attention) is the same walk: its
    second LayerNorm's input and statistics, the MLP's kept tensors and its input are freed.

    >>> from vrammath.model.presets import load_model
    >>> sorted(hf_top_layer_backward_bytes(load_model("llama-7b"), "eager", "bf16"))
    ['freed', 'in_flight']
    """
    spec = layer.spec
    if layer.attention != "eager" or spec.attention.fused_qkv:  # GPT-2 and GPT-NeoX blocks
        return None
    if spec.norms.kind != "rmsnorm" and spec.mlp.gated:  # LayerNorm: StarCoder2's plain MLP only
        return None
    if (pure := _pure_layer_terms(layer)) is None:
        return None
    c, terms = pure
    sb = s * b
    probs = 2 * a * s**2 * b if c == 2 else 0
    freed = _after_attention(terms, c) + probs
    freed += c * sb * a * d  # the repeated V
    in_flight = c * sb * h + c * sb * a * d + 8 * a * s**2 * b
    return {"freed": sympy.expand(freed), "in_flight": sympy.expand(in_flight)}


@after(EagerLayerOptions)
def hf_checkpointed_backward_bytes(layer: EagerLayerOptions) -> dict[str, sympy.Expr] | None:
    """Activation bytes a checkpointed decoder layer holds at its backward peak (``layer``),
    above what was alive before its recomputation (its input, ``checkpoint``, included), for non-reentrant checkpointing, eager
    attention and LLaMA-style layers. The weight gradients made by then are counted by the
    phase model (:func:`vrammath.compose.peak.hf_phase_peaks`).

    Explanation
    ===========

    The layer is recomputed with saving, then back-propagated from the top: the MLP, the second
    norm and ``o_proj`` are done (their saved tensors freed) and ``bmm(probs, V)``'s backward has
    freed the 16-bit probabilities and V when the softmax backward runs -- the peak (measured op
    by op with ``MemTracker``, the live tensors listed at that op). Alive from the recomputation:

    * the first norm's saved tensors (``_norm_kept``), less its fp32 input where the residual
      stream is fp32 (fp32 and autocast: the upcast is a no-op and the input is the checkpoint);
    * the q/k/v linears' inputs: one shared c sbh tensor, or under autocast three 16-bit casts;
    * Q and the repeated K that ``Q K^T`` saves (c sb a d each, 16-bit under autocast);
    * the fp32 softmax output (4 a s^2 b); under autocast the q/k/v weight casts;

    and the gradients in flight: the layer's incoming gradient (residual dtype, sbh), the
    attention output's gradient (c sb a d) and eight bytes per score element -- the
    probabilities' gradient cast to fp32 and the softmax backward's fp32 output.

    ``mlp_layer`` is the other candidate, the MLP's backward (it wins at short sequences or
    with attention dropout, whose mask and output the recomputed layer keeps): the whole
    recomputed layer (:func:`~vrammath.terms.activations.layer.hf_layer_terms`) less ``down_proj``'s input,
    with the incoming gradient and three I-sized gradients in flight (measured op by op).

    A GPT-2 block peaks earlier, at ``bmm(probs, V)``'s backward: its first LayerNorm's
    statistics and output, the fused QKV, the softmax output, the dropout's noise and output are
    alive, with the incoming gradient, the attention output's gradient and its contiguous copy
    (c sbh each) and the gradient of the dropped-out probabilities (c a s^2 b). Without
    attention dropout it peaks at the softmax backward: the LayerNorm's statistics and output,
    the copies of Q and K^T the scores' matmul kept, the softmax output, and in flight the
    incoming gradient, V's gradient (c sbh) and the probabilities' gradient with the softmax
    backward's output (2c a s^2 b).

    Returns ``None`` where it is not derived (SDPA).

    >>> from vrammath.model.presets import load_model
    >>> peaks = hf_checkpointed_backward_bytes(load_model("llama-7b"), "eager", "fp32")
    >>> peaks["layer"], peaks["checkpoint"]
    (12*a*b*d*s + 12*a*b*s**2 + 12*b*h*s + 4*b*s, 4*b*h*s)
    >>> peaks["mlp_layer"]
    24*I*b*s + 16*a*b*d*s + 4*a*b*s**2 + 24*b*h*s + 8*b*s
    """
    spec, attention, precision, device = layer.spec, layer.attention, layer.precision, layer.device
    if attention != "eager":
        return None
    c, autocast = _precision(precision)
    res = _residual_bytes(precision)
    sb = s * b
    if spec.norms.kind == "layernorm":
        stats = _norm_kept(spec, precision, device) - c * sb * h  # its input is the checkpoint
        if spec.attention.dropout > 0:
            noise = _dropout_mask_bytes(c, device)
            recomputed = stats + c * sb * h + 3 * c * sb * h + (2 * c + noise) * a * s**2 * b
            grads = res * sb * h + 2 * c * sb * h + c * a * s**2 * b
        else:  # the peak moves to the softmax backward: Q and K's copies, the probabilities
            recomputed = stats + c * sb * h + 2 * c * sb * h + c * a * s**2 * b
            grads = res * sb * h + c * sb * h + 2 * c * a * s**2 * b
        out = {"layer": sympy.expand(recomputed + grads), "checkpoint": res * sb * h}
        if GELU_KEPT.get(spec.mlp.activation) == 1:  # a one-op GeLU: its backward may peak
            out["mlp_layer"] = _gpt2_mlp_backward_bytes(spec, c, res, device)
        return out
    if not spec.mlp.gated:
        return None
    norm = _norm_kept(spec, precision, "cuda") - (4 * sb * h if res == 4 else 0)
    inputs = 3 * 2 * sb * h if autocast else c * sb * h
    qk = 2 * c * sb * a * d
    casts = 2 * (h * a * d + 2 * h * a_kv * d) if autocast else 0
    in_flight = res * sb * h + c * sb * a * d + 8 * a * s**2 * b
    recomputed = sum(hf_layer_terms(spec, attention, precision, device=device).values())
    return {
        "layer": sympy.expand(norm + inputs + qk + 4 * a * s**2 * b + casts + in_flight),
        "checkpoint": res * sb * h,
        # the MLP's backward, where the whole recomputed layer is alive (its product freed by
        # down_proj's backward) with the incoming gradient and three I-sized gradients
        # (where the residual stream is fp32 the first norm's input is the checkpoint; in
        # 16-bit the layer still holds its 16-bit residual beside the norm's fp32 copy)
        "mlp_layer": sympy.expand(
            recomputed
            - (4 * sb * h if res == 4 else c * sb * h * -1)
            + res * sb * h
            + 2 * c * sb * I
        ),
    }


__all__ = [
    "hf_checkpointed_backward_bytes",
    "hf_checkpointed_forward_bytes",
    "hf_last_layer_forward_bytes",
    "hf_math_attention_forward_bytes",
    "hf_top_layer_backward_bytes",
]
