"""The peak of a training step per GPU, phase by phase, from the per-GPU totals of each phase group.

A training iteration runs forward (activations grow), backward (activations are freed layer by
layer while gradients appear), ``optimizer.step()`` (states updated, with the implementation's
temporaries) and ``zero_grad(set_to_none=True)`` (gradients freed). In the steady state (second
iteration onward) the optimizer states exist from the start; in the first iteration they are created
inside the first ``step()``, so the first forward and backward run without them.

The memory terms arrive summed by phase group (:class:`Groups`, built by
:func:`vrammath.compose.estimate.estimate` from the rows of :data:`vrammath.compose.table.TERMS`). Two phase
models combine them: :func:`hf_phase_peaks`, exact for a Hugging Face model as transformers runs
it, and :func:`korthikanti_phase_peaks`, Megatron's as Korthikanti et al. publish it.

Examples
========

>>> from vrammath.compose.estimate import estimate
>>> from vrammath.model.presets import load_model
>>> from vrammath.compose.setup import Setup
>>> est = estimate(Setup(load_model("llama-7b"), recipe="bf16-pure", seq_len=512))
>>> sorted(est.phases)
['backward_peak', 'forward_peak', 'step_peak']
>>> round(est.gpu_bytes / 2**30, 2)
62.76

References
==========

.. [1] PyTorch ``torch/optim/adamw.py`` (for-loop, foreach and fused implementations).
.. [2] PyTorch FSDP2 ``fully_shard`` (all-gather per layer, prefetch of the next, reduce-scatter).
.. [3] Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
   arXiv:2205.05198.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import sympy

from vrammath.model.params import tensors
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import one_of
from vrammath.notation.symbols import L, P, V, a, b, h, s
from vrammath.terms.activations.latent import mla_layer_terms
from vrammath.terms.activations.layer import hf_layer_terms
from vrammath.terms.activations.model import hf_activation_terms, hf_logits_loss_terms
from vrammath.terms.activations.parts import Attention, HfRecompute, Precision
from vrammath.terms.activations.peaks import (
    hf_checkpointed_backward_bytes,
    hf_checkpointed_forward_bytes,
    hf_last_layer_forward_bytes,
    hf_math_attention_forward_bytes,
    hf_top_layer_backward_bytes,
)
from vrammath.terms.moe.peaks import moe_phase_candidates

Iteration = Literal["steady", "first"]

#: The phases of one iteration whose peaks an estimate reports.
PHASES = ("forward_peak", "backward_peak", "step_peak")

#: The loss HF's causal-LM models return: one fp32 scalar (the loss upcasts the logits).
LOSS_BYTES = 4


@dataclass(frozen=True)
class Groups:
    """Per-GPU bytes of each phase group (see :data:`vrammath.compose.rows.GROUPS`).

    ``weights`` is everything resident through the whole iteration except the optimizer states
    and the gradients (weights, master copy, quantization constants, adapters); ``optimizer``
    the optimizer states; ``gradients`` the gradients alive after backward; ``activations`` what
    forward keeps for backward (logits and loss included); ``temporaries`` the optimizer step's
    transients; ``in_flight`` what is in flight through forward and backward (ZeRO-3's gathered
    layers, a dequantized matrix), ``reduce`` what only backward adds (one layer's unsharded
    gradients before the reduce-scatter) and ``outputs`` the model output the training loop
    keeps (logits + loss, :func:`vrammath.compose.builders.kept_outputs`; 0 for a loop that keeps the loss
    only); ``bucket`` what lives from the backward's first gradient hook to its end, beside
    every tensor the forward left (DeepSpeed's reduce bucket); ``flush`` what the backward adds
    before its end only (a full bucket's flat copy); ``epilogue`` what the end of the backward
    holds in place of the gradients when it is more (DeepSpeed's gradients on their way to the
    kept ones, :func:`vrammath.compose.engines.deepspeed_epilogue`); ``forward`` what the forward
    alone adds to every moment (FSDP2's kept all-gather output when nothing reshards);
    ``unshard`` everything gathered while a layer is gathered in the forward, before that layer's
    activations exist (:func:`vrammath.compose.fsdp2.fsdp2_layer_unshard`); ``held`` what is
    gathered at the forward's end (:func:`vrammath.compose.deepspeed3.stage3_held`) and
    ``held_backward`` at the backward's start and in its top layer
    (:func:`vrammath.compose.deepspeed3.stage3_held_backward`), released before its end;
    ``bottom`` what accelerate's FSDP2 holds at the backward of its second-lowest layer beyond
    the backward's end (:func:`vrammath.compose.fsdp2.fsdp2_bottom_layers`).
    """

    weights: sympy.Expr
    optimizer: sympy.Expr
    gradients: sympy.Expr
    activations: sympy.Expr
    temporaries: sympy.Expr
    in_flight: sympy.Expr
    reduce: sympy.Expr
    outputs: sympy.Expr = sympy.S.Zero
    bucket: sympy.Expr = sympy.S.Zero
    flush: sympy.Expr = sympy.S.Zero
    epilogue: sympy.Expr = sympy.S.Zero
    forward: sympy.Expr = sympy.S.Zero
    unshard: sympy.Expr = sympy.S.Zero
    held: sympy.Expr = sympy.S.Zero
    held_backward: sympy.Expr = sympy.S.Zero
    bottom: sympy.Expr = sympy.S.Zero


def _check_iteration(iteration: str) -> None:
    if iteration not in ("steady", "first"):
        raise one_of("iteration", iteration, ("steady", "first"))


def _with_kept_outputs(
    phases: dict[str, sympy.Expr], outputs: sympy.Expr, iteration: Iteration
) -> dict[str, sympy.Expr]:
    """The phases of a loop that keeps the model output (logits + loss, ``outputs``) until the
    next forward rebinds it: the previous output is alive through the steady state's forward
    (the first iteration has none), the current one's logits through backward (the loss is
    alive in either loop there: it is backward's root), logits and loss through the step."""
    if outputs == 0:
        return phases
    forward = outputs if iteration == "steady" else sympy.Integer(0)
    add = {
        "forward_end": outputs - LOSS_BYTES,  # the new output's logits replace the old output
        "forward_peak": forward,
        "backward_peak": outputs - LOSS_BYTES,
        "step_peak": outputs,
    }
    return {k: e + add.get(k, 0) for k, e in phases.items()}


def _gradient_shares(
    spec: ModelSpec, done: tuple[str, ...] | None = None
) -> tuple[sympy.Expr, sympy.Expr]:
    """Parameters whose gradients exist at a layer's attention backward, at the top layer and
    at the bottom one: at the top the head, the final norm and the layer's MLP, second norm and
    output projection; at the bottom everything but the input side (the untied embedding,
    learned positions) and the layer's first norm and q/k/v. ``done`` names the layer's only
    tensors whose gradients exist (a backward further up the layer: GPT-2's GeLU)."""
    own = (
        "input_layernorm",
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "ln_1.",  # GPT-2's names
        "attn.c_attn.",
    )
    per_layer = [t for t in tensors(spec) if t.count == L]
    if done is None:
        pending = sympy.Add(*(t.numel for t in per_layer if t.name.startswith(own)))
    else:
        pending = sympy.Add(*(t.numel for t in per_layer if not t.name.startswith(done)))
    outside = sympy.Add(*(t.numel for t in tensors(spec) if t.count != L))
    last = sympy.Add(
        *(
            t.numel
            for t in tensors(spec)
            if t.component == "positions"
            or (t.component == "embedding" and not spec.tied_embeddings)
        )
    )
    top = outside - last + sympy.Add(*(t.numel for t in per_layer)) - pending
    return top, P - last - pending


def _checkpointed_peaks(
    spec: ModelSpec,
    precision: Precision,
    attention: Attention,
    device: Literal["cuda", "cpu"],
    kept: sympy.Expr,
    gradients: sympy.Expr,
    layer_terms: dict[str, sympy.Expr],
) -> tuple[sympy.Expr | None, sympy.Expr | None]:
    """The forward and backward peaks inside a checkpointed layer, where they are derived op by
    op (:func:`vrammath.terms.activations.peaks.hf_checkpointed_forward_bytes` and
    :func:`~vrammath.terms.activations.peaks.hf_checkpointed_backward_bytes`); None where not.

    ``kept`` is what forward left without the loss's buffers: every layer's checkpoint and
    what the layers share, plus what exists only after the last layer (the final norm's saved
    tensors, the head's input and weight cast), which is subtracted here. Forward peaks in the
    last layer, with the earlier layers' autocast weight casts cached. Backward peaks in the top
    or the bottom layer: the weight gradients made by then enter as their share of the per-GPU
    gradient total G (so that sharding divides them) -- at the top the head, the final norm and
    the layer's MLP, second norm and ``o_proj``; at the bottom everything but the untied
    embedding and the layer's first norm and q/k/v, while the checkpoints of the L - 1 layers
    above are freed.
    """
    forward = hf_checkpointed_forward_bytes(spec, attention, precision, device=device)
    backward = hf_checkpointed_backward_bytes(spec, attention, precision, device=device)
    tail = hf_activation_terms(spec, attention, precision, "full", device=device)
    before = kept - tail["final_norm"] - tail["head_input"] - tail["head_weight_cast"]
    in_layer = None
    if forward is not None:
        in_layer = before + (L - 1) * layer_terms["weight_casts"] + forward
    if backward is None:
        return in_layer, None
    top, bottom = _gradient_shares(spec)
    layer = backward["layer"]
    candidates = [
        before + layer + gradients * top / P,
        before - (L - 1) * backward["checkpoint"] + layer + gradients * bottom / P,
    ]
    if "mlp_layer" in backward:  # the MLP's backward: only its output projection is done
        top, bottom = _gradient_shares(spec, done=("mlp.c_proj", "mlp.down_proj"))
        mlp = backward["mlp_layer"]
        candidates += [
            before + mlp + gradients * top / P,
            before - (L - 1) * backward["checkpoint"] + mlp + gradients * bottom / P,
        ]
    return in_layer, _peak(*candidates)


def _peak(*candidates: sympy.Expr) -> sympy.Expr:
    """The largest of the candidates, left unevaluated: sympy's Max would compare them
    symbolically (a tenth of a second each, deciding nothing the numbers do not decide once they
    go in); every evaluation puts numbers in and takes the maximum exactly."""
    return sympy.Max(*candidates, evaluate=False)


def _compute_bytes(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def hf_phase_peaks(
    spec: ModelSpec,
    groups: Groups,
    *,
    precision: Precision = "bf16",
    attention: Attention = "sdpa",
    recompute: HfRecompute = "none",
    grad_bytes: int = 2,
    iteration: Iteration = "steady",
    device: Literal["cuda", "cpu"] = "cuda",
    activation_terms: Mapping[str, sympy.Expr] | None = None,
) -> dict[str, sympy.Expr]:
    """Bytes live at the peak of each phase of one training iteration, per GPU, for a Hugging
    Face model as transformers runs it.

    Explanation
    ===========

    With W, O, G, A, T the groups' totals (:class:`Groups`), F the terms in flight and R the
    reduce buffer:

    * ``forward_end`` = W + O + A
    * ``forward_peak`` = W + O + A + the logits' transients (the logits and their fp32 copy while
      the loss runs) + F. Under autocast with full recomputation, every layer's 16-bit weight
      copy is still in autocast's cache at the loss (the checkpoints do not keep them for
      backward, but the cache lives until the autocast region exits): + L times the layer's casts.
      With eager attention the peak may instead be at the last layer's softmax, before the final
      norm and the head exist: with full recomputation
      (:func:`~vrammath.terms.activations.peaks.hf_checkpointed_forward_bytes`, the layer saves nothing),
      without it (:func:`~vrammath.terms.activations.peaks.hf_last_layer_forward_bytes`).
    * ``backward_peak`` = the larger of the start of backward, W + O + A + 8sbV (the gradients of
      the log-softmax output and input), and its end, W + O + G + the embedding's gradient
      transient (a CPU accumulates a 16-bit embedding gradient in fp32, 4Vh; CUDA does not) + R,
      or a layer's attention backward; a bucket (``groups.bucket``) is added to each of these
      after the first gradient hook, and to the end of the forward (W + O + A + bucket: every
      forward tensor is still alive when the first hook allocates it); with eager attention and full recomputation the top or
      the bottom layer recomputed (:func:`~vrammath.terms.activations.peaks.hf_checkpointed_backward_bytes`),
      without recomputation the top layer
      (:func:`~vrammath.terms.activations.peaks.hf_top_layer_backward_bytes`), each with the weight
      gradients made by then as their share of G; elsewhere one layer's activations recomputed
      and the softmax backward's score-sized tensors; each + F.
    * For a mixture-of-experts model (SDPA, bf16) the in-layer candidates of both passes are the
      MoE blocks' own, op by op, at the topmost and the bottommost MoE layer
      (:func:`vrammath.terms.moe.peaks.moe_phase_candidates`), beside a dense layer's where the model
      has dense layers.
    * With ``groups.outputs`` (the loop keeps the model output) every phase adds it
      (:func:`vrammath.compose.builders.kept_outputs`).
    * ``step_peak`` = W + O + G + T. In the first iteration O is created inside this step and is
      absent before it.

    Parameters
    ==========

    spec : ModelSpec
    groups : Groups
        The per-GPU totals of the phase groups.
    precision, attention, recompute, device
        As in :func:`vrammath.terms.activations.model.hf_activation_terms`.
    grad_bytes : int
        Bytes per gradient element (the CPU's embedding-gradient transient depends on it).
    iteration : "steady" or "first"
        Second iteration onward, or the first one (no optimizer states before its step).
    activation_terms : dict or None
        The activation row's parts (:attr:`vrammath.compose.rows.Context.hf_activation_terms`),
        so that the phase model reads what the row kept instead of deriving it again.

    See Also
    ========

    korthikanti_phase_peaks, vrammath.compose.estimate.estimate
    """
    _check_iteration(iteration)
    W, G, O_, T_opt, act = (
        groups.weights,
        groups.gradients,
        groups.optimizer,
        groups.temporaries,
        groups.activations,
    )
    gathered, reduce_buffer, bucket = groups.in_flight, groups.reduce, groups.bucket
    flush, epilogue = groups.flush, groups.epilogue
    forward_only, unshard = groups.forward, groups.unshard
    held, held_bwd = groups.held, groups.held_backward
    O_before = O_ if iteration == "steady" else sympy.Integer(0)
    loss = hf_logits_loss_terms(spec, precision)
    c = _compute_bytes(precision)
    embed_temp = (
        (4 - grad_bytes) * V * h if device == "cpu" and grad_bytes < 4 else sympy.Integer(0)
    )
    end_grads = G + embed_temp if epilogue == 0 else sympy.Max(G + embed_temp, epilogue)
    if activation_terms is None:  # the activation row's own parts, when the caller has them
        activation_terms = hf_activation_terms(spec, attention, precision, recompute, device=device)
    # what the model keeps above the top layer: the final norm, the head's input and weight cast
    after = sum(activation_terms[k] for k in ("final_norm", "head_input", "head_weight_cast"))
    top_slides = spec.attention.window_layers > 0 and spec.attention.last_layer_slides
    if spec.latent is not None:  # DeepSeek-V3's latent attention in place of LLaMA's
        layer_terms = mla_layer_terms(spec, attention, precision, device=device)
    else:
        layer_terms = hf_layer_terms(spec, attention, precision, device=device, sliding=top_slides)
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
    in_layer = fwd_end - loss["kept"] + (fwd_layer if recompute == "full" else 0) + cast_cache
    forward_candidates = [fwd_end + loss["forward_transient"] + cast_cache]
    unchecked = hf_last_layer_forward_bytes(spec, attention, precision, device=device)
    if attention == "sdpa" and device == "cpu":  # the math kernel of SDPA with dropout
        unchecked = hf_math_attention_forward_bytes(spec, precision)
    if recompute == "none" and unchecked is not None:
        # the last layer's softmax, before the final norm and the head exist
        forward_candidates.append(in_layer - after - unchecked["later"] + unchecked["live"])
    recomputing = fwd_end - loss["kept"] + recomputed + attn_bwd
    top_layer = hf_top_layer_backward_bytes(spec, attention, precision, device=device)
    if recompute == "none" and top_layer is not None:
        top, _ = _gradient_shares(spec)
        recomputing = (
            fwd_end - loss["kept"] - after - top_layer["freed"] + G * top / P
        ) + top_layer["in_flight"]
    if recompute == "full":
        exact = _checkpointed_peaks(
            spec, precision, attention, device, fwd_end - loss["kept"], G, layer_terms
        )
        in_layer = exact[0] if exact[0] is not None else in_layer
        recomputing = exact[1] if exact[1] is not None else recomputing
    in_layers = [in_layer]
    in_backward = [recomputing]
    if spec.experts is not None:  # the MoE blocks' own op-by-op peaks replace a dense layer's
        moe = moe_phase_candidates(
            spec,
            before=act - loss["kept"] - after,
            dense_layer=layer_terms,
            G=G,
            recompute=recompute,
        )
        # a dense layer's own candidates stay where the model has dense layers
        dense = len(spec.experts.layers) < spec.layers
        if dense and spec.latent is not None and recompute == "full":
            # DeepSeek-V3's dense layers all run before its MoE layers, when the fewest
            # checkpoints exist: the dense layer's candidate (a whole layer's saved tensors on
            # top of every checkpoint) would stand above the forward it bounds
            in_layers = []
        in_layers = [W + O_before + x for x in moe["forward"]] + (in_layers if dense else [])
        in_backward = [W + O_before + x for x in moe["backward"]] + (in_backward if dense else [])
    forward_peak = _peak(*forward_candidates, *in_layers) + gathered + forward_only + held
    if unshard != 0:
        # gathering the top layer, before its activations exist, with everything gathered then
        # (a checkpointed layer keeps little: its whole activations are left in, an upper bound)
        below = act - loss["kept"] - after - (layer_total if recompute == "none" else 0)
        forward_peak = _peak(forward_peak, W + O_before + below + unshard)
    phases = {
        "forward_end": fwd_end,
        "forward_peak": forward_peak,
        "backward_peak": _peak(
            fwd_end + loss["backward_transient"] + gathered + held_bwd,
            *(x + gathered + held_bwd + bucket + flush for x in in_backward),
            W + O_before + end_grads + gathered + reduce_buffer + bucket,
            *([fwd_end + gathered + bucket + flush] if bucket != 0 else []),
            # accelerate's FSDP2 at the second-lowest layer: the tail resharded, the lowest
            # layer's activations left
            *(
                [W + O_before + end_grads + groups.bottom + layer_total]
                if groups.bottom != 0
                else []
            ),
        ),
        "step_peak": W + O_ + G + T_opt,
    }
    return _with_kept_outputs(phases, groups.outputs, iteration)


def korthikanti_phase_peaks(
    groups: Groups, *, iteration: Iteration = "steady", gradients_resident: bool = False
) -> dict[str, sympy.Expr]:
    """The phase peaks of a Megatron run: activations are freed as gradients appear, so the
    backward peak is the larger of the two (no logits or recomputation transients: the published
    activation formula stands for all of them).

    With ``gradients_resident`` the gradients are alive beside the activations through forward
    and backward: Megatron-Core's distributed optimizer keeps one persistent gradient buffer
    (``param_and_grad_buffer``) into which every micro-batch of a pipeline accumulates, so the
    later micro-batches' activations sit on top of it (the mixture-of-experts path of
    :func:`vrammath.compose.estimate.estimate`).

    >>> from vrammath.notation.symbols import P, b, s, h
    >>> z = sympy.Integer(0)
    >>> g = Groups(2*P, 12*P, 4*P, 34*s*b*h, 4*P, z, z)
    >>> korthikanti_phase_peaks(g)["backward_peak"]
    Max(18*P, 14*P + 34*b*h*s)
    >>> korthikanti_phase_peaks(g, gradients_resident=True)["forward_peak"]
    18*P + 34*b*h*s
    """
    _check_iteration(iteration)
    W, O_, G = groups.weights, groups.optimizer, groups.gradients
    O_before = O_ if iteration == "steady" else sympy.Integer(0)
    A, in_flight = groups.activations, groups.in_flight
    if gradients_resident:
        W, G = W + G, sympy.Integer(0)  # resident, counted once with the weights
    # the engines' moments (FSDP2's kept all-gather and layer unshard, DeepSpeed ZeRO-3's
    # gathered parameters) at the bound this model takes: every activation alive
    forward = W + O_before + A + in_flight + groups.forward + groups.held
    if groups.unshard != 0:
        forward = sympy.Max(forward, W + O_before + A + groups.unshard)
    phases = {
        "forward_peak": forward,
        "backward_peak": sympy.Max(
            W + O_before + A + groups.flush + groups.held_backward,
            W + O_before + (G if groups.epilogue == 0 else sympy.Max(G, groups.epilogue)),
        )
        + in_flight
        + groups.bucket,
        "step_peak": W + O_ + G + groups.temporaries,
    }
    return _with_kept_outputs(phases, groups.outputs, iteration)


__all__ = ["PHASES", "Groups", "Iteration", "hf_phase_peaks", "korthikanti_phase_peaks"]
