"""The table of memory terms: every term of a training setup is one row.

A row (:class:`~vrammath.compose.rows.Term`) says what a term is -- key, label, device, the function that builds its
whole-model expression, the ZeRO stage from which it is sharded over ``N_d``, the offload that
moves it off the GPU, its phase group and when it is live -- and nothing about how terms combine.
:func:`vrammath.compose.estimate.estimate` is the one composition: it builds every row of
:data:`TERMS` for a :class:`~vrammath.compose.setup.Setup`, shards and offloads it by the row's
columns, sums the rows by phase group and hands the sums to a phase model of
:mod:`vrammath.compose.peak`. The table plays the part ``sympy/physics/units/definitions/
unit_definitions.py`` plays for units: definitions as data, composed elsewhere.

A builder returns ``None`` when its term does not exist for the setup (no master copy in a pure
16-bit recipe, no adapters in a full fine-tune); the term is then absent from the estimate.

Examples
========

>>> [t.key for t in TERMS if t.group == "optimizer"]
['optimizer', 'cpu_optimizer', 'adapter_optimizer']
>>> TERMS_BY_KEY["gradients"].sharded_from, TERMS_BY_KEY["gradients"].live
(2, 'backward+step')

.. rubric:: How to add a term

Write its builder (a function of a :class:`~vrammath.compose.rows.Context`, returning the whole-model bytes as a sympy
expression in the symbols of :mod:`vrammath.notation.symbols`, or ``None`` where the term does not
exist), give it a row, and append the row to the table -- :data:`TERMS` in this module for a term
every estimate should have, or a table of your own passed to ``estimate(..., terms=...)``. Its
group decides which phases it enters, its ``sharded_from`` how ZeRO divides it; nothing else
changes. Here, an exponential moving average of the weights (``torch_ema``'s shadow copy: one
fp32 tensor per parameter, ``4 P``), resident through the whole iteration, so in the weights group:

>>> from vrammath.compose.estimate import estimate
>>> from vrammath.model.presets import load_model
>>> from vrammath.compose.setup import Setup
>>> from vrammath.notation.symbols import P
>>> ema = Term(
...     key="ema",
...     label="EMA of the weights (fp32)",
...     device="gpu",
...     builder=lambda ctx: 4 * P,
...     group="weights",
...     live="resident",
... )
>>> setup = Setup(load_model("gpt2"))
>>> with_ema = estimate(setup, terms=TERMS + (ema,))
>>> with_ema.component("ema").expr, with_ema.component("ema").bytes
(4*P, 497759232)
>>> with_ema.gpu_bytes - estimate(setup).gpu_bytes
497759232

Add a test that pins its value on one real model (``tests/test_terms.py``), a docstring in
sympy's order with the source of the formula, and, for a term the default table gains, run
``tests/test_golden.py``: the golden numbers move only by the new term.
"""

from __future__ import annotations

import sympy

from vrammath.compose.peak import LOSS_BYTES
from vrammath.compose.rows import (
    CPU_ADAM_GRAD_BYTES,
    Builder,
    Context,
    ShardGroup,
    Term,
)
from vrammath.model.params import largest_tensor_numel, layer_param_expr
from vrammath.notation.symbols import L, P, V, b, s
from vrammath.terms.activations.parts import Parallel, Schedule
from vrammath.terms.korthikanti.dense import korthikanti_first_stage_bytes
from vrammath.terms.lora.adapters import lora_activation_layer_expr, lora_step_temp_expr
from vrammath.terms.lora.quant import dequant_buffer_expr
from vrammath.terms.moe.params import ep_layer_param_expr
from vrammath.terms.states import optimizer_step_temp_expr, step_temporaries_expr

# --- full fine-tuning: the model's own states ---------------------------------------------------


def _weights(ctx: Context) -> sympy.Expr:
    return ctx.frozen_base["weights"] if ctx.lora else ctx.model_states["weights"]


def _groups_note(ctx: Context) -> str:
    """Which ranks a mixture-of-experts state is spread over (see ``shard_group``)."""
    s = ctx.setup
    if s.model.experts is None:
        return ""
    return f"groups: dense DP {s.gpus}; routed experts EP {s.ep} x EDP {s.gpus // s.ep}"


def _weights_label(ctx: Context) -> str:
    quant = ctx.setup.quant
    if quant is not None:
        return f"frozen base weights ({quant} codes + 16-bit rest)"
    if ctx.lora:
        width = {1: "int8", 2: "16-bit", 4: "fp32"}.get(ctx.base_bytes, f"{ctx.base_bytes}-byte")
        return f"frozen base weights ({width})"
    return "weights"


def _state(key: str) -> Builder:
    def build(ctx: Context) -> sympy.Expr | None:
        if ctx.lora or (key == "master" and ctx.recipe.master == 0):
            return None
        return ctx.model_states[key]

    return build


def _offloaded_state(key: str) -> Builder:
    def build(ctx: Context) -> sympy.Expr:
        if key == "gradients":  # CPU Adam's fp32 gradient partition
            return CPU_ADAM_GRAD_BYTES * P
        return ctx.model_states[key]

    return build


# --- LoRA / QLoRA: the frozen base's extras and the adapters ------------------------------------


def _quant_constants(ctx: Context) -> sympy.Expr | None:
    return ctx.frozen_base["quant_constants"] if ctx.setup.quant is not None else None


def _adapter(key: str) -> Builder:
    def build(ctx: Context) -> sympy.Expr | None:
        if not ctx.lora:
            return None
        expr = ctx.adapter_states[key]
        return None if key == "master" and expr == 0 else expr

    return build


def _adapter_note(ctx: Context) -> str:
    return f"rank {ctx.setup.lora_rank} on {','.join(ctx.setup.lora_targets)}"


def _dequant_buffer(ctx: Context) -> sympy.Expr | None:
    return dequant_buffer_expr(ctx.setup.model, 2) if ctx.setup.quant is not None else None


def _adapter_activations(ctx: Context) -> sympy.Expr | None:
    s = ctx.setup
    if not ctx.lora:
        return None
    layer = lora_activation_layer_expr(
        s.model, s.lora_targets, input_bytes=ctx.base_bytes, adapter_bytes=4, dropout=s.lora_dropout
    )
    return layer if s.recompute == "full" else L * layer


def _adapter_activations_label(ctx: Context) -> str:
    full = ctx.setup.recompute == "full"
    return "adapter activations (one layer, recomputed)" if full else "adapter activations"


def _adapter_activations_note(ctx: Context) -> str:
    if ctx.setup.recompute == "full":
        return "kept only while a layer is recomputed"
    masks = " + dropout masks" if ctx.setup.lora_dropout else ""
    return "lora_A inputs" + masks + " + lora_A outputs"


# --- in flight: ZeRO-3's gathered layers and reduce buffer --------------------------------------


def _layer_params(ctx: Context) -> sympy.Expr:
    """One layer's parameters as ZeRO-3 gathers them (a MoE layer's local experts under --ep)."""
    if ctx.setup.ep > 1:
        return ep_layer_param_expr(ctx.setup.model)
    return layer_param_expr(ctx.setup.model)


def _gathered(ctx: Context) -> sympy.Expr | None:
    # gathered for compute even when the shards live on the CPU
    if ctx.setup.zero != 3:
        return None
    return 2 * ctx.recipe.weights * _layer_params(ctx)


def _reduce_buffer(ctx: Context) -> sympy.Expr | None:
    if ctx.setup.zero != 3:
        return None
    return ctx.recipe.gradients * _layer_params(ctx)


# --- activations --------------------------------------------------------------------------------


def _activations(ctx: Context) -> sympy.Expr:
    if ctx.setup.activation_formula == "hf":
        return ctx.hf_activations["activations"]
    s = ctx.setup
    if s.korthikanti_moe:
        return ctx.moe_activations["layers"]
    parallel: Parallel = "tp_sp" if s.sp else "tp"
    # DualPipe is the MoE path's alone (Setup refuses it here)
    schedule: Schedule = "interleaved" if s.schedule == "interleaved" else "1f1b"
    return korthikanti_first_stage_bytes(
        parallel,
        s.recompute,
        schedule=schedule,
        activation_bytes=4 if ctx.precision == "fp32" else 2,
    )


def _activations_label(ctx: Context) -> str:
    if ctx.setup.activation_formula == "hf":
        return "activations kept for backward"
    if ctx.setup.korthikanti_moe:
        stages = ", ".join(str(j) for j in ctx.moe_rank.stages)
        return f"activations, busiest pipeline rank (stages {stages}; Korthikanti-style MoE)"
    return "activations, first pipeline stage (Korthikanti et al.)"


def _activations_note(ctx: Context) -> str:
    s = ctx.setup
    if s.korthikanti_moe:
        rows = "dropless" if s.capacity_factor is None else f"capacity {s.capacity_factor:g}"
        return f"policy {s.policy}; {rows}, imbalance {s.imbalance:g}; {s.schedule}"
    if s.activation_formula != "hf":
        return "as published: GPT block, 4h GeLU MLP, 1-byte dropout masks"
    how = f"{s.model.model_type} as transformers runs it, {s.attention}, {ctx.precision}"
    if ctx.lora:
        # frozen linears keep no inputs for weight gradients: an upper bound under LoRA
        how += "; full fine-tuning's count, an upper bound with a frozen base"
    return how + (", checkpoints only" if ctx.hf_recompute == "full" else "")


def _logits_loss(ctx: Context) -> sympy.Expr | None:
    if ctx.setup.korthikanti_moe:  # the head's, on the rank holding the last stage
        return ctx.moe_activations.get("head")
    if ctx.setup.activation_formula != "hf":
        return None  # Korthikanti's formula includes its own
    return ctx.hf_activations["logits_loss"]


def _logits_loss_note(ctx: Context) -> str:
    if ctx.setup.korthikanti_moe:
        heads = 1 + ctx.setup.model.mtp_layers
        return f"final norm, output-layer input, fp32 logits (Korthikanti 4.3) x {heads} head(s)"
    return "logits and the fp32 log-softmax the loss keeps for backward"


# --- the optimizer step -------------------------------------------------------------------------


def _step_temporaries(ctx: Context) -> sympy.Expr:
    s = ctx.setup
    if s.lora_rank is not None:
        return lora_step_temp_expr(
            s.model,
            s.lora_rank,
            s.lora_targets,
            s.recipe,
            s.optimizer,
            s.implementation,
            adapter_dtype="fp32",
        )
    if s.korthikanti_moe:  # a layout's states: every parameter at the recipe's width
        largest = sympy.Integer(largest_tensor_numel(s.model, s.ep))
        return step_temporaries_expr(
            s.optimizer, s.implementation, ctx.recipe.state, params=P, largest=largest
        )
    return optimizer_step_temp_expr(s.model, s.recipe, s.optimizer, s.implementation, ep=s.ep)


def _step_note(ctx: Context) -> str:
    adapters = ", adapters only" if ctx.lora else ""
    return "transient, during optimizer.step()" + adapters


# --- the training loop ---------------------------------------------------------------------------


def kept_outputs(ctx: Context) -> sympy.Expr | None:
    """The model output a training loop keeps alive: the logits (b s V in the compute dtype)
    and the fp32 loss, when the loop holds the output object (``Setup.keep_outputs``).

    Explanation
    ===========

    ``out = model(**batch); out.loss.backward()`` keeps ``out`` -- and with it the logits,
    b s V in the dtype ``lm_head`` produces (2 bytes in bf16, fp16 and autocast, 4 in fp32) --
    until ``out`` is rebound by the next iteration's forward. A loop that keeps only the loss
    (``loss = model(**batch).loss``) frees the logits once the loss is computed; that is what
    the default estimate assumes. Measured on both loop shapes (``validation/engines.json``,
    section ``loops``: a tiny LLaMA and LLaMA-7B, b1, bf16, sdpa), keeping the output adds,
    per phase peak:

    * forward: the previous iteration's output (logits + loss, b s V c + 4) in the steady state,
      nothing in the first iteration;
    * backward: the logits (b s V c; the loss is backward's root in either loop);
    * optimizer step (and ``zero_grad``): logits + loss, b s V c + 4.

    Which common loops keep what (read from their sources):

    * transformers ``Trainer`` (``src/transformers/trainer.py``): ``training_step`` calls
      ``compute_loss``, whose ``outputs = model(**inputs)`` is a local returned only with
      ``return_outputs=True`` (evaluation); training gets the loss alone and backward runs after
      ``compute_loss`` has returned, so the logits are freed: keep_outputs off.
    * TRL's ``SFTTrainer`` (``trl/trainer/sft_trainer.py``): its ``compute_loss`` calls
      ``super().compute_loss(..., return_outputs=True)`` to log token accuracy and entropy from
      the logits, then returns the loss only: the output dies with the call, off.
    * accelerate's examples (``examples/nlp_example.py``) and the Hugging Face course's plain
      PyTorch loop: ``outputs = model(**batch); loss = outputs.loss;
      accelerator.backward(loss)`` -- the output lives through backward and step: on.
    * Lightning (``LightningModule.training_step`` contract, ``loops/optimization/automatic.py``'s
      ``ClosureResult``): the loop keeps what ``training_step`` returns; returning the loss
      tensor (or ``{"loss": loss}``) frees the logits with the step's locals: off. Returning the
      logits in the dict keeps them: on.

    Examples
    ========

    >>> from vrammath.model.presets import load_model
    >>> from vrammath.compose.setup import Setup
    >>> kept_outputs(Context(Setup(load_model("llama-7b"), keep_outputs=True)))
    2*V*b*s + 4
    >>> kept_outputs(Context(Setup(load_model("llama-7b")))) is None
    True

    See Also
    ========

    vrammath.compose.peak.hf_phase_peaks : where the term enters each phase.

    References
    ==========

    .. [1] transformers ``src/transformers/trainer.py``, ``Trainer.training_step`` and
       ``Trainer.compute_loss``.
    .. [2] accelerate ``examples/nlp_example.py``; Hugging Face course, chapter 3, "A full
       training" (the plain PyTorch loop).
    .. [3] TRL ``trl/trainer/sft_trainer.py``, ``SFTTrainer.compute_loss``.
    .. [4] Lightning ``src/lightning/pytorch/loops/optimization/automatic.py`` (``ClosureResult``)
       and the ``LightningModule.training_step`` documentation.
    """
    if not ctx.setup.keep_outputs:
        return None
    logits = 4 if ctx.precision == "fp32" else 2
    return logits * b * s * V + LOSS_BYTES


# the model states: dense parts over the data-parallel group, routed experts over expert
# parallelism and the expert-data-parallel group (vrammath.terms.moe.params)
EDP: ShardGroup = "dp+edp"

#: Every memory term of a training setup, in the order an estimate lists them.
TERMS: tuple[Term, ...] = (
    Term("weights", _weights_label, "gpu", _weights, "weights", "resident", 3, "params",
         lambda ctx: "no gradients, master copy or optimizer states" if ctx.lora
         else _groups_note(ctx), shard_group=EDP),
    Term("gradients", "gradients", "gpu", _state("gradients"), "gradients", "backward+step", 2,
         "optimizer", _groups_note, shard_group=EDP),
    Term("master", "master weights (fp32)", "gpu", _state("master"), "weights", "resident", 1,
         "optimizer", _groups_note, shard_group=EDP),
    Term("optimizer", "optimizer states", "gpu", _state("optimizer"), "optimizer", "resident", 1,
         "optimizer", _groups_note, shard_group=EDP),
    Term("cpu_master", "master weights (fp32) (offloaded)", "cpu",
         _offloaded_state("master"), "weights", "resident", 1, "optimizer", shard_group=EDP),
    Term("cpu_optimizer", "optimizer states (offloaded)", "cpu",
         _offloaded_state("optimizer"), "optimizer", "resident", 1, "optimizer",
         shard_group=EDP),
    Term("cpu_gradients", "gradients (offloaded)", "cpu",
         _offloaded_state("gradients"), "gradients", "backward+step", 1,
         "optimizer", shard_group=EDP),
    Term("cpu_weights", "weights (offloaded)", "cpu", _offloaded_state("weights"),
         "weights", "resident", 3, "params", shard_group=EDP),
    Term("quant_constants", lambda ctx: f"quantization constants ({ctx.setup.quant})", "gpu",
         _quant_constants, "weights", "resident", 3,
         note=lambda ctx: "uint8 absmax per 64 + fp32 per 256 + offset"
         if ctx.setup.quant == "nf4" else ""),
    Term("adapter_weights", "adapter weights (fp32)", "gpu", _adapter("weights"), "weights",
         "resident", 3, note=_adapter_note),
    Term("adapter_gradients", "adapter gradients (fp32)", "gpu", _adapter("gradients"),
         "gradients", "backward+step", 2, note=_adapter_note),
    Term("adapter_master", "adapter master weights", "gpu", _adapter("master"), "weights",
         "resident", 1, note=_adapter_note),
    Term("adapter_optimizer", lambda ctx: f"adapter optimizer states ({ctx.setup.optimizer})",
         "gpu", _adapter("optimizer"), "optimizer", "resident", 1, note=_adapter_note),
    Term("dequant_buffer", "dequantization buffer (transient)", "gpu", _dequant_buffer,
         "in-flight", "forward+backward", note="one frozen matrix in bf16 per matmul"),
    Term("adapter_activations", _adapter_activations_label, "gpu", _adapter_activations,
         "activations", "forward+backward", note=_adapter_activations_note),
    Term("gathered", "gathered layers (ZeRO-3 in flight)", "gpu", _gathered, "in-flight",
         "forward+backward", note="current layer + one prefetched, unsharded"),
    Term("reduce_buffer", "reduce-scatter buffer (ZeRO-3)", "gpu", _reduce_buffer, "in-flight",
         "backward", note="one layer's unsharded gradients before the reduce-scatter",
         listed=False),
    Term("activations", _activations_label, "gpu", _activations, "activations",
         "forward+backward", note=_activations_note),
    Term("logits_loss", "logits and loss buffers kept", "gpu", _logits_loss, "activations",
         "forward+backward", note=_logits_loss_note),
    Term("outputs", "model output kept by the loop", "gpu", kept_outputs, "outputs",
         "resident", note="logits + loss, until the next forward rebinds the output"),
    Term("step_temporaries",
         lambda ctx: f"optimizer step temporaries ({ctx.setup.implementation})", "gpu",
         _step_temporaries, "temporaries", "step", 1, "optimizer", note=_step_note,
         shard_group=EDP),
)  # fmt: skip

#: The rows by key.
TERMS_BY_KEY: dict[str, Term] = {t.key: t for t in TERMS}


__all__ = [
    "TERMS",
    "TERMS_BY_KEY",
    "kept_outputs",
]
