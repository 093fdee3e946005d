"""The builders of the term table's rows (:data:`vrammath.compose.table.TERMS`): each takes the
:class:`~vrammath.compose.rows.Context` of a setup and returns a term's whole-model expression
(None where the term does not exist for the setup), its label or its note. The formulas they call
live in :mod:`vrammath.terms`; a builder only picks the one the setup asks for.
"""

from __future__ import annotations

import sympy

from vrammath.compose.deepspeed3 import is_stage3
from vrammath.compose.peak import LOSS_BYTES
from vrammath.compose.rows import (
    CPU_ADAM_GRAD_BYTES,
    Builder,
    Context,
    state_recipe,
)
from vrammath.model.params import largest_tensor_numel, layer_param_expr
from vrammath.notation.symbols import L, P, V, b, s
from vrammath.terms.activations.parts import Parallel, Schedule
from vrammath.terms.korthikanti.dense import korthikanti_first_stage_bytes
from vrammath.terms.lora.adapters import lora_activation_layer_expr, lora_step_temp_expr
from vrammath.terms.lora.quant import dequant_buffer_expr
from vrammath.terms.moe.params import ep_layer_param_expr
from vrammath.terms.parallel import FSDP2_ENGINES, flat_padded_params
from vrammath.terms.states import optimizer_step_temp_expr, step_temporaries_expr

# --- full fine-tuning: the model's own states ---------------------------------------------------


def weights(ctx: Context) -> sympy.Expr:
    if ctx.lora:
        return ctx.frozen_base["weights"]
    if ctx.setup.engine == "deepspeed" and not is_stage3(ctx.setup):  # its flat buffer, padded
        return ctx.model_states["weights"].xreplace({P: flat_padded_params()})
    return ctx.model_states["weights"]


def groups_note(ctx: Context) -> str:
    """Which ranks a mixture-of-experts state is spread over (see ``shard_group``)."""
    s = ctx.setup
    if s.model.experts is None:
        return ""
    return f"groups: dense DP {s.gpus}; routed experts EP {s.ep} x EDP {s.gpus // s.ep}"


def weights_label(ctx: Context) -> str:
    quant = ctx.setup.quant
    if quant is not None:
        return f"frozen base weights ({quant} codes + 16-bit rest)"
    if ctx.lora:
        width = {1: "int8", 2: "16-bit", 4: "fp32"}.get(ctx.base_bytes, f"{ctx.base_bytes}-byte")
        return f"frozen base weights ({width})"
    if ctx.setup.engine in FSDP2_ENGINES and ctx.setup.recipe == "bf16-mixed":
        return "weights (fp32 shards, also the master)"
    return "weights"


def state(key: str) -> Builder:
    def build(ctx: Context) -> sympy.Expr | None:
        if ctx.lora or (key == "master" and ctx.recipe.master == 0):
            return None
        if key == "gradients" and ctx.setup.bucket_view:  # views of DDP's buckets
            return None
        if key == "gradients" and ctx.setup.engine == "megatron":  # in its main_grad buffer
            return None
        if key == "gradients" and is_stage3(ctx.setup):  # in its grad_partitions_flat_buffer
            return None
        return ctx.model_states[key]

    return build


def offloaded_state(key: str) -> Builder:
    def build(ctx: Context) -> sympy.Expr:
        if key == "gradients":  # CPU Adam's fp32 gradient partition
            return CPU_ADAM_GRAD_BYTES * P
        return ctx.model_states[key]

    return build


# --- LoRA / QLoRA: the frozen base's extras and the adapters ------------------------------------


def quant_constants(ctx: Context) -> sympy.Expr | None:
    return ctx.frozen_base["quant_constants"] if ctx.setup.quant is not None else None


def adapter(key: str) -> Builder:
    def build(ctx: Context) -> sympy.Expr | None:
        if not ctx.lora:
            return None
        expr = ctx.adapter_states[key]
        return None if key == "master" and expr == 0 else expr

    return build


def adapter_note(ctx: Context) -> str:
    return f"rank {ctx.setup.lora_rank} on {','.join(ctx.setup.lora_targets)}"


def dequant_buffer(ctx: Context) -> sympy.Expr | None:
    return dequant_buffer_expr(ctx.setup.model, 2) if ctx.setup.quant is not None else None


def adapter_activations(ctx: Context) -> sympy.Expr | None:
    s = ctx.setup
    if not ctx.lora:
        return None
    layer = lora_activation_layer_expr(
        s.model, s.lora_targets, input_bytes=ctx.base_bytes, adapter_bytes=4, dropout=s.lora_dropout
    )
    return layer if s.recompute == "full" else L * layer


def adapter_activations_label(ctx: Context) -> str:
    full = ctx.setup.recompute == "full"
    return "adapter activations (one layer, recomputed)" if full else "adapter activations"


def adapter_activations_note(ctx: Context) -> str:
    if ctx.setup.recompute == "full":
        return "kept only while a layer is recomputed"
    masks = " + dropout masks" if ctx.setup.lora_dropout else ""
    return "lora_A inputs" + masks + " + lora_A outputs"


# --- in flight: ZeRO-3's gathered layers and reduce buffer --------------------------------------


def layer_params(ctx: Context) -> sympy.Expr:
    """One layer's parameters as ZeRO-3 gathers them (a MoE layer's local experts under --ep)."""
    if ctx.setup.ep > 1:
        return ep_layer_param_expr(ctx.setup.model)
    return layer_param_expr(ctx.setup.model)


def gathered(ctx: Context) -> sympy.Expr | None:
    # gathered for compute even when the shards live on the CPU; FSDP2's and DeepSpeed's own
    # rows stand for it
    if ctx.setup.zero != 3 or ctx.setup.engine in (*FSDP2_ENGINES, "deepspeed"):
        return None
    return 2 * ctx.recipe.weights * layer_params(ctx)


def reduce_buffer(ctx: Context) -> sympy.Expr | None:
    if ctx.setup.zero != 3 or ctx.setup.engine in (*FSDP2_ENGINES, "deepspeed"):
        return None
    return ctx.recipe.gradients * layer_params(ctx)


# --- activations --------------------------------------------------------------------------------


def activations(ctx: Context) -> sympy.Expr:
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
        # one stage is also the last: the final norm, the output layer's input, fp32 logits
        last_stage_on_first=s.pp == 1,
        activation_bytes=4 if ctx.precision == "fp32" else 2,
    )


def activations_label(ctx: Context) -> str:
    if ctx.setup.activation_formula == "hf":
        return "activations kept for backward"
    if ctx.setup.korthikanti_moe:
        stages = ", ".join(str(j) for j in ctx.moe_rank.stages)
        return f"activations, busiest pipeline rank (stages {stages}; Korthikanti-style MoE)"
    return "activations, first pipeline stage (Korthikanti et al.)"


def activations_note(ctx: Context) -> str:
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


def logits_loss(ctx: Context) -> sympy.Expr | None:
    if ctx.setup.korthikanti_moe:  # the head's, on the rank holding the last stage
        return ctx.moe_activations.get("head")
    if ctx.setup.activation_formula != "hf":
        return None  # Korthikanti's formula includes its own
    return ctx.hf_activations["logits_loss"]


def logits_loss_note(ctx: Context) -> str:
    if ctx.setup.korthikanti_moe:
        heads = 1 + ctx.setup.model.mtp_layers
        return f"final norm, output-layer input, fp32 logits (Korthikanti 4.3) x {heads} head(s)"
    return "logits and the fp32 log-softmax the loss keeps for backward"


# --- the optimizer step -------------------------------------------------------------------------


def step_temporaries(ctx: Context) -> sympy.Expr | None:
    s = ctx.setup
    if s.engine == "deepspeed":  # its step row holds the optimizer's (engines.deepspeed_step)
        return None
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
    return optimizer_step_temp_expr(
        s.model, state_recipe(s), s.optimizer, s.implementation, ep=s.ep
    )


def step_note(ctx: Context) -> str:
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


__all__ = [
    "activations",
    "activations_label",
    "activations_note",
    "adapter",
    "adapter_activations",
    "adapter_activations_label",
    "adapter_activations_note",
    "adapter_note",
    "dequant_buffer",
    "gathered",
    "groups_note",
    "kept_outputs",
    "layer_params",
    "logits_loss",
    "logits_loss_note",
    "offloaded_state",
    "quant_constants",
    "reduce_buffer",
    "state",
    "step_note",
    "step_temporaries",
    "weights",
    "weights_label",
]
