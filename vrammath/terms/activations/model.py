"""Activation memory of the whole model as transformers' implementations keep it, exactly.

``hf_*`` give the bytes that Hugging Face transformers' implementations keep for backward, as
PyTorch autograd saves them, summed over the layers (:mod:`vrammath.terms.activations.layer`,
:mod:`vrammath.terms.activations.gpt`; sliding-window and mixture-of-experts layers here), plus the
logits and the loss, for fp32, pure 16-bit and autocast runs. They are checked against
PyTorch's own memory count by ``vrammath.measure`` (see ``validation/matrix.json``).
Korthikanti et al. (2022) as published is in :mod:`vrammath.terms.korthikanti.dense`, the op-by-op peaks of
one layer in :mod:`vrammath.terms.activations.peaks`; the names of those modules are also importable from
here.

Examples
========

>>> from vrammath.model.presets import load_model
>>> sorted(activation_exprs(load_model("gpt2")))
['activations', 'logits_loss']
"""

from __future__ import annotations

from collections.abc import Mapping

import sympy

from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError
from vrammath.notation.signatures import after
from vrammath.notation.symbols import L, L_e, V, b, d, h, s
from vrammath.terms.activations.latent import mla_layer_terms, mla_rope_bytes
from vrammath.terms.activations.layer import (
    hf_layer_bytes,
    hf_layer_terms,
    window_reached,
)
from vrammath.terms.activations.parts import (
    HF_RECOMPUTE,
    Attention,
    ModelOptions,
    Precision,
    _check,
    _dropout_mask_bytes,
    _norm_kept,
    _precision,
    _residual_bytes,
    _total,
    _unit_offset_norm_kept,
)
from vrammath.terms.moe.params import moe_mlp_kept_exprs

# ---------------------------------------------------------------------------------------------
# Sliding-window layers (Mistral, Qwen2 with use_sliding_window, Gemma-2/3)
# ---------------------------------------------------------------------------------------------


def _window_layer_count(spec: ModelSpec) -> sympy.Expr:
    """Layers with a sliding window: L when all of them slide, else the spec's number."""
    n = spec.attention.window_layers if spec.sliding_window is not None else 0
    return L if n == spec.layers else sympy.Integer(n)


def _stacked_layers(run: ModelOptions) -> sympy.Expr:
    """All L layers without recomputation: global layers plus sliding-window layers."""
    layer = (run.spec, run.attention, run.precision)
    full = hf_layer_bytes(*layer, gelu=run.gelu, device=run.device)
    n = _window_layer_count(run.spec)
    if n == 0:
        return L * full
    sliding = hf_layer_bytes(*layer, gelu=run.gelu, device=run.device, sliding=True)
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

    >>> from vrammath.model.presets import load_model
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

    >>> from vrammath.model.presets import load_model
    >>> from vrammath.notation.symbols import b, s, V
    >>> float(hf_logits_loss_bytes(load_model("qwen2-72b")).subs({b: 1, s: 4096, V: 152064})) / 2**30
    2.320343032479286
    """
    return sympy.expand(hf_logits_loss_terms(spec, precision)["kept"])


@after(ModelOptions)
def hf_activation_terms(run: ModelOptions) -> dict[str, sympy.Expr]:
    """Every tensor group the whole model keeps for backward at the end of forward.

    Explanation
    ===========

    ``layers`` is L times :func:`~vrammath.terms.activations.layer.hf_layer_bytes` without recomputation; with full recomputation
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
    tensor, and has no RoPE (see :func:`~vrammath.terms.activations.gpt.gpt2_layer_terms` for ``gelu`` and ``device``).

    >>> from vrammath.model.presets import load_model
    >>> sorted(hf_activation_terms(load_model("llama-7b")))
    ['final_norm', 'head_input', 'head_weight_cast', 'layers', 'logits_loss', 'rope']
    """
    spec, attention, precision, device = run.spec, run.attention, run.precision, run.device
    _check("recompute", run.recompute, HF_RECOMPUTE)
    c, autocast = _precision(precision)
    res = _residual_bytes(precision)
    sb = s * b
    if run.recompute == "full":
        layers = L * res * sb * h
        layers += _checkpoint_masks(spec, attention, res)  # the checkpoints also hold the masks
        if not spec.embeddings.learned_positions:  # ... and RoPE's (1, s) int64 position ids
            layers += 8 * s
    elif spec.experts is not None:
        layers = _moe_layers_bytes(run)
    else:
        layers = _stacked_layers(run)
    terms: dict[str, sympy.Expr] = {"layers": layers}
    learned = spec.embeddings.learned_positions
    if not learned:
        rotary = spec.attention.rotary_dim
        # a partial table has 2 ceil(r / 2) columns: the frequencies of every other dimension, twice
        width = d if rotary is None else 2 * (-(-rotary // 2))
        terms["rope"] = 2 * s * width * (4 if spec.attention.rope_fp32 else res)
        if spec.latent is not None:  # DeepSeek-V3's tables are qk_rope_head_dim wide
            terms["rope"] = mla_rope_bytes(spec, precision)
        n_win = _window_layer_count(spec)
        if spec.attention.qk_norm == "head" and spec.norms.unit_offset and n_win not in (0, L):
            # Gemma-3: a second (cos, sin) pair with the sliding layers' own base
            terms["rope"] *= 2
    if spec.embeddings.dropout > 0:
        # the mask has the embeddings' dtype: the parameters' (fp32 under autocast)
        terms["embedding_dropout"] = _dropout_mask_bytes(res, device) * sb * h
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


# --- mixture-of-experts layers (vrammath.terms.moe.params) ---------------------------------------------------

"""MoE model types whose whole layer is derived: GQA attention as LLaMA's (with Qwen3's q/k
norms) or DeepSeek-V3's latent attention (:mod:`vrammath.terms.activations.latent`), MoE MLP measured."""


def _moe_layers_bytes(run: ModelOptions) -> sympy.Expr:
    """``L - L_e`` dense layers plus ``L_e`` layers whose SwiGLU term is the MoE block's
    (:func:`vrammath.terms.moe.params.moe_mlp_kept_exprs`; the block's output is freed by the residual add).
    Latent attention's layer is :func:`vrammath.terms.activations.latent.mla_layer_terms`."""

    if run.precision != "bf16":
        raise InputError(
            "precision",
            "MoE activations are derived and measured in bf16 only (the grouped matmul takes "
            "bf16 inputs)",
            got=run.precision,
        )
    # Qwen3-MoE's q/k norms are Qwen3's (qk_norm_bytes, in the layer terms' "qk_norms")
    layer_terms = mla_layer_terms if run.spec.latent is not None else hf_layer_terms
    terms = layer_terms(run.spec, run.attention, run.precision, device=run.device)
    dense = sum(terms.values(), sympy.Integer(0))
    moe = moe_mlp_kept_exprs(run.spec)
    moe_layer = dense - terms["mlp"] + moe["router"] + moe["experts"] + moe["shared"]
    return (L - L_e) * dense + L_e * moe_layer


@after(hf_activation_terms)
def hf_activation_bytes(terms: dict[str, sympy.Expr]) -> sympy.Expr:
    """Total bytes kept for backward at the end of forward: the sum of
    :func:`hf_activation_terms`, which takes the same arguments.

    >>> from vrammath.model.presets import load_model
    >>> from vrammath.model.params import size_values
    >>> from vrammath.notation.symbols import b, s
    >>> spec = load_model("llama-7b")
    >>> e = hf_activation_bytes(spec, "sdpa", "bf16")
    >>> round(e.subs({**size_values(spec), b: 1, s: 4096}) / 2**30, 2)
    23.38
    """
    return _total(terms)


@after(hf_activation_terms)
def activation_exprs(terms: dict[str, sympy.Expr]) -> dict[str, sympy.Expr]:
    """Named components for an estimate: ``activations`` (layers + rest) and ``logits_loss``, of
    :func:`hf_activation_terms`, which takes the same arguments.

    >>> from vrammath.model.presets import load_model
    >>> sorted(activation_exprs(load_model("gpt2")))
    ['activations', 'logits_loss']
    """
    return activation_components(terms)


def activation_components(terms: Mapping[str, sympy.Expr]) -> dict[str, sympy.Expr]:
    """:func:`hf_activation_terms`' parts as an estimate's two components: ``activations``
    (every part but the logits and loss, summed) and ``logits_loss``."""
    rest = sum((v for k, v in terms.items() if k != "logits_loss"), sympy.Integer(0))
    return {"activations": sympy.expand(rest), "logits_loss": terms["logits_loss"]}


__all__ = [
    "activation_components",
    "activation_exprs",
    "hf_activation_bytes",
    "hf_activation_terms",
    "hf_logits_loss_bytes",
    "hf_logits_loss_terms",
]
