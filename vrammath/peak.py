"""The peak of a training step per GPU, phase by phase, composed from states and activations.

A training iteration runs forward (activations grow), backward (activations are freed layer by
layer while gradients appear), ``optimizer.step()`` (states updated, with the implementation's
temporaries) and ``zero_grad(set_to_none=True)`` (gradients freed). In the steady state (second
iteration onward) the optimizer states exist from the start; in the first iteration they are created
inside the first ``step()``, so the first forward and backward run without them.

Every phase is an expression in the run symbols (b, s) and the model symbols; the model states enter
as numbers from :mod:`vrammath.states` (exact bytes for the model), the activations as expressions
from :mod:`vrammath.activations`.

Examples
========

>>> from vrammath.presets import load_model
>>> from vrammath.symbols import b, s
>>> ph = step_phases(load_model("llama-7b"), precision="bf16", attention="sdpa")
>>> sorted(ph)
['backward_peak', 'forward_end', 'forward_peak', 'step_peak']
>>> round(float(peak_bytes(ph, load_model("llama-7b"), batch=1, seq=512)) / 2**30, 2)
62.76

References
==========

.. [1] PyTorch ``torch/optim/adamw.py`` (for-loop, foreach and fused implementations).
.. [2] PyTorch FSDP2 ``fully_shard`` (all-gather per layer, prefetch of the next, reduce-scatter).
"""

from __future__ import annotations

from typing import Literal

import sympy

from vrammath.activations import (
    Attention,
    HfRecompute,
    Precision,
    hf_activation_bytes,
    hf_layer_terms,
    hf_logits_loss_terms,
)
from vrammath.errors import one_of
from vrammath.model import ModelSpec
from vrammath.params import layer_param_count, size_values
from vrammath.states import model_state_bytes, optimizer_step_temp_bytes
from vrammath.symbols import L, V, a, b, h, s

Implementation = Literal["for-loop", "foreach", "fused"]
Iteration = Literal["steady", "first"]

#: states.py recipe of each precision a run is measured in.
RECIPE_OF: dict[str, str] = {
    "fp32": "fp32",
    "bf16": "bf16-pure",
    "fp16": "bf16-pure",
    "autocast-bf16": "autocast-bf16",
    "autocast-fp16": "autocast-fp16",
}


def _compute_bytes(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def step_phases(
    spec: ModelSpec,
    *,
    precision: Precision = "bf16",
    attention: Attention = "sdpa",
    recompute: HfRecompute = "none",
    optimizer: str = "adamw",
    implementation: Implementation = "foreach",
    iteration: Iteration = "steady",
    zero3_ranks: int | None = None,
    gelu: str = "gelu_new",
    device: Literal["cuda", "cpu"] = "cuda",
) -> dict[str, sympy.Expr]:
    """Bytes live at the peak of each phase of one training iteration, per GPU.

    Explanation
    ===========

    With W the weights (and buffers), O the optimizer states, G the gradients, A the activations
    kept at the end of forward (:func:`~vrammath.activations.hf_activation_bytes`):

    * ``forward_end`` = W + O + A
    * ``forward_peak`` = W + O + A + the logits' transients (the logits and their fp32 copy while
      the loss runs). Under autocast with full recomputation, every layer's 16-bit weight copy
      is still in autocast's cache at the loss (the checkpoints do not keep them for backward,
      but the cache lives until the autocast region exits): + L times the layer's casts.
    * ``backward_peak`` = the larger of the start of backward, W + O + A + 8sbV (the gradients of
      the log-softmax output and input), and its end, W + O + G + the embedding's gradient
      transient (a CPU accumulates a 16-bit embedding gradient in fp32, 4Vh; CUDA does not),
      or the top layer's backward: the loss's buffers freed, with full recomputation one layer's
      activations recomputed, with eager attention the softmax backward's score-sized tensors.
    * ``step_peak`` = W + O + G + the optimizer's temporaries (foreach: one state-sized copy of
      every parameter; for-loop: two of the largest tensor; fused: none). In the first iteration
      O is created inside this step and is absent before it.

    With ZeRO-3 / FSDP2 over N ranks, W, G and O are divided by N, and the gathered layers in
    flight are added: during forward and backward the current layer's and the prefetched next
    layer's full parameters (2 layers, compute dtype) and, in backward, one layer's unsharded
    gradients before the reduce-scatter.

    Parameters
    ==========

    spec : ModelSpec
    precision, attention, recompute
        As in :func:`vrammath.activations.hf_activation_terms`.
    optimizer, implementation
        As in :func:`vrammath.states.optimizer_step_temp_bytes`.
    iteration : "steady" or "first"
        Second iteration onward, or the first one (no optimizer states before its step).
    zero3_ranks : int or None
        FSDP2 / ZeRO-3 world size; None for no sharding.
    gelu, device
        Passed to the GPT-2 activation formula.

    See Also
    ========

    peak_bytes, vrammath.activations.hf_activation_bytes, vrammath.states.model_state_bytes
    """
    if iteration not in ("steady", "first"):
        raise one_of("iteration", iteration, ("steady", "first"))
    rec = RECIPE_OF.get(precision)
    if rec is None:
        raise one_of("precision", precision, tuple(RECIPE_OF))
    states = model_state_bytes(spec, rec, optimizer)
    temps = optimizer_step_temp_bytes(spec, rec, optimizer, implementation)
    n = 1 if zero3_ranks is None else zero3_ranks
    grad_bytes = states["gradients"] // max(1, _param_total(spec))
    gathered = sympy.Integer(0)
    reduce_buf = sympy.Integer(0)
    if zero3_ranks is not None:
        layer = layer_param_count(spec)
        gathered = sympy.Integer(2 * layer * _compute_bytes(precision))
        reduce_buf = sympy.Integer(layer * grad_bytes)
    return compose_phases(
        spec,
        weights=sympy.Rational(states["weights"] + states["master"], n),
        optimizer=sympy.Rational(states["optimizer"], n),
        gradients=sympy.Rational(states["gradients"], n),
        step_temporaries=sympy.Rational(temps, n),
        precision=precision,
        attention=attention,
        recompute=recompute,
        gathered=gathered,
        reduce_buffer=reduce_buf,
        grad_bytes=grad_bytes,
        iteration=iteration,
        gelu=gelu,
        device=device,
    )


def compose_phases(
    spec: ModelSpec,
    *,
    weights: sympy.Expr,
    optimizer: sympy.Expr,
    gradients: sympy.Expr,
    step_temporaries: sympy.Expr,
    precision: Precision = "bf16",
    attention: Attention = "sdpa",
    recompute: HfRecompute = "none",
    gathered: sympy.Expr | int = 0,
    reduce_buffer: sympy.Expr | int = 0,
    grad_bytes: int = 2,
    iteration: Iteration = "steady",
    activations: sympy.Expr | None = None,
    gelu: str = "gelu_new",
    device: Literal["cuda", "cpu"] = "cuda",
) -> dict[str, sympy.Expr]:
    """The phase peaks of :func:`step_phases` from given per-GPU state terms.

    ``weights`` is everything resident through the whole iteration except the optimizer states
    and the gradients (weights, master copy, quantization constants, adapters); ``optimizer`` the
    optimizer states; ``gradients`` the gradients alive after backward; ``step_temporaries`` the
    optimizer implementation's transients; ``gathered`` the ZeRO-3 layers in flight and
    ``reduce_buffer`` one layer's unsharded gradients before the reduce-scatter. ``activations``
    replaces the Hugging Face activation count (e.g. Korthikanti's, for tensor/pipeline
    parallel runs); the loss and recomputation transients are still those of the HF model.
    :func:`vrammath.estimate.estimate` composes its phases with this function.
    """
    if iteration not in ("steady", "first"):
        raise one_of("iteration", iteration, ("steady", "first"))
    W, G, O_, T_opt = weights, gradients, optimizer, step_temporaries
    O_before = O_ if iteration == "steady" else sympy.Integer(0)
    act = (
        hf_activation_bytes(spec, attention, precision, recompute, gelu=gelu, device=device)
        if activations is None
        else activations
    )
    loss = hf_logits_loss_terms(spec, precision)
    c = _compute_bytes(precision)
    embed_temp = (
        (4 - grad_bytes) * V * h if device == "cpu" and grad_bytes < 4 else sympy.Integer(0)
    )
    layer_terms = hf_layer_terms(spec, attention, precision, gelu=gelu, device=device)
    layer_total = sum(layer_terms.values(), sympy.Integer(0))
    recomputed = layer_total if recompute == "full" else sympy.Integer(0)
    score = a * s**2 * b
    attn_bwd = sympy.Integer(0)
    fwd_layer = sympy.Integer(0)
    if attention == "eager":
        # top layer's backward at the softmax: its MLP, second norm and o_proj input are freed,
        # the probabilities' gradient (and its fp32 cast) and the scores' gradient are alive
        freed = layer_terms["mlp"] + layer_terms["norms"] / 2 + layer_terms["output"]
        attn_bwd = (6 if c == 2 else 8) * score - freed
        # forward with checkpoints: one layer's activations plus the masked scores transient
        fwd_layer = layer_total + (4 if precision.startswith("autocast") else c) * score
    elif recompute == "full":
        fwd_layer = layer_total
    # autocast caches the 16-bit weight copies until the autocast region exits: with
    # checkpointing they are not kept for backward, yet every layer's copy is alive at the loss
    cast_cache = sympy.Integer(0)
    if recompute == "full" and precision.startswith("autocast"):
        cast_cache = L * layer_terms["weight_casts"]
    fwd_end = W + O_before + act
    return {
        "forward_end": fwd_end,
        "forward_peak": sympy.Max(
            fwd_end + loss["forward_transient"] + cast_cache + gathered,
            fwd_end
            - loss["kept"]
            + (fwd_layer if recompute == "full" else 0)
            + cast_cache
            + gathered,
        ),
        "backward_peak": sympy.Max(
            fwd_end + loss["backward_transient"] + gathered,
            fwd_end - loss["kept"] + recomputed + attn_bwd + gathered,
            W + O_before + G + embed_temp + gathered + reduce_buffer,
        ),
        "step_peak": W + O_ + G + T_opt,
    }


def _param_total(spec: ModelSpec) -> int:
    from vrammath.params import param_count

    return param_count(spec)


def peak_bytes(
    phases: dict[str, sympy.Expr], spec: ModelSpec, *, batch: int, seq: int
) -> sympy.Expr:
    """The step's peak: the largest phase, evaluated for ``spec`` at micro-batch and sequence.

    >>> from vrammath.presets import load_model
    >>> spec = load_model("gpt2")
    >>> ph = step_phases(spec, precision="fp32", attention="eager")
    >>> peak_bytes(ph, spec, batch=1, seq=1024) > ph["step_peak"]
    True
    """
    values = {**size_values(spec), b: batch, s: seq}
    return sympy.Max(*(e.subs(values) for e in phases.values()))


def phase_bytes(
    phases: dict[str, sympy.Expr], spec: ModelSpec, *, batch: int, seq: int
) -> dict[str, int]:
    """Every phase evaluated to whole bytes."""
    values = {**size_values(spec), b: batch, s: seq}
    return {k: int(sympy.ceiling(e.subs(values))) for k, e in phases.items()}


__all__ = ["RECIPE_OF", "compose_phases", "peak_bytes", "phase_bytes", "step_phases"]
