"""Formula access: every memory term's expressions by name, for ``vrammath formula`` and the docs.

Each expression is built by the module that owns its formula (activations, korthikanti, states,
parallel, lora, quant, kv_cache, estimate); this module only chooses which to show for a term.
"""

from __future__ import annotations

from typing import Literal, get_args

import sympy

from vrammath.activation_parts import Schedule
from vrammath.activations import activation_exprs, hf_logits_loss_terms
from vrammath.errors import InputError
from vrammath.estimate import estimate
from vrammath.korthikanti import korthikanti_first_stage_bytes, korthikanti_layer_bytes
from vrammath.kv_cache import kv_cache_expr
from vrammath.layer_terms import hf_layer_bytes
from vrammath.lora import lora_param_expr, lora_state_exprs, lora_step_temp_expr
from vrammath.model import ModelSpec
from vrammath.parallel import zero_communication_elements, zero_paper_bytes
from vrammath.params import param_exprs, param_total_expr
from vrammath.quant import frozen_base_exprs
from vrammath.setup import Setup
from vrammath.states import model_state_exprs, optimizer_step_temp_expr
from vrammath.vocab import (
    HF_RECOMPUTES,
    PARALLELS,
    PRECISION_OF,
    RECIPE_NAMES,
    RECOMPUTES,
    Attention,
    Implementation,
    Optimizer,
    Quant,
    Recipe,
    check,
)

# Korthikanti's own schedules (DualPipe is the mixture-of-experts layouts')
KORTHIKANTI_SCHEDULES: tuple[Schedule, ...] = ("1f1b", "interleaved")

Formula = Literal[
    "params",
    "states",
    "zero",
    "communication",
    "activations",
    "logits",
    "temporaries",
    "phases",
    "lora",
    "qlora",
    "kv",
]
FORMULAS: tuple[Formula, ...] = get_args(Formula)
"""The terms ``vrammath formula`` prints, in its order."""


def formula_exprs(
    term: str,
    spec: ModelSpec,
    *,
    recipe: Recipe = "bf16-mixed",
    optimizer: Optimizer = "adamw",
    implementation: Implementation = "foreach",
    stage: int = 0,
    attention: Attention = "sdpa",
    lora_targets: tuple[str, ...] = ("q", "v"),
    quant: Quant = "nf4",
) -> dict[str, sympy.Expr]:
    """The named expressions of one of :data:`FORMULAS` for ``spec`` (sizes still symbols).

    Every expression comes from the function that owns the formula; this only chooses them.

    >>> from vrammath.presets import load_model
    >>> formula_exprs("zero", load_model("llama-7b"), stage=3)
    {'zero-3 bytes per GPU (ZeRO paper)': P*(K + 4)/N_d}
    >>> formula_exprs("bert", load_model("llama-7b"))
    Traceback (most recent call last):
    ...
    vrammath.errors.InputError: term: must be one of params, states, zero, communication, activations, logits, temporaries, phases, lora, qlora, kv (got 'bert')
    """
    term = check("term", term, FORMULAS)
    impl = implementation
    precision = PRECISION_OF[check("recipe", recipe, RECIPE_NAMES)]
    hf_terms = ("activations", "logits", "phases")
    if term in hf_terms and spec.model_type == "gpt2" and precision.startswith("autocast"):
        raise InputError("recipe", "autocast is not derived for GPT-2's activations", recipe)
    if term == "params":
        return {**param_exprs(spec), "total": param_total_expr(spec)}
    if term == "states":
        return model_state_exprs(spec, recipe, optimizer)
    if term == "zero":
        return {f"zero-{stage} bytes per GPU (ZeRO paper)": zero_paper_bytes(stage)}
    if term == "communication":
        return {f"zero-{stage} elements communicated": zero_communication_elements(stage)}
    if term == "activations":
        out: dict[str, sympy.Expr] = {}
        for parallel in PARALLELS:
            for recompute in RECOMPUTES:
                out[f"korthikanti layer, parallel {parallel}, recompute {recompute}"] = (
                    korthikanti_layer_bytes(parallel, recompute)
                )
        for schedule in KORTHIKANTI_SCHEDULES:
            out[f"korthikanti first pipeline stage, tp_sp, {schedule}"] = (
                korthikanti_first_stage_bytes("tp_sp", "none", schedule=schedule)
            )
        out[f"hf layer ({spec.model_type}, {attention}, {precision})"] = hf_layer_bytes(
            spec, attention, precision
        )
        for recompute in HF_RECOMPUTES:
            exprs = activation_exprs(spec, attention, precision, recompute)
            out[f"hf activations, all layers, recompute {recompute}"] = exprs["activations"]
        return out
    if term == "logits":
        return hf_logits_loss_terms(spec, precision)
    if term == "temporaries":
        return {
            f"optimizer step temporaries ({impl})": optimizer_step_temp_expr(
                spec, recipe, optimizer, impl
            )
        }
    if term == "phases":
        setup = Setup(
            spec,
            recipe=recipe,
            optimizer=optimizer,
            implementation=impl,
            zero=stage,
            attention=attention,
        )
        return dict(estimate(setup).phase_exprs)
    if term == "lora":
        targets = lora_targets
        states = lora_state_exprs(spec, 1, targets, recipe, optimizer)  # in r, not the 1
        return {
            "trainable parameters": lora_param_expr(spec, targets),
            **{f"adapter {k}": v for k, v in states.items()},
            f"adapter step temporaries ({impl})": lora_step_temp_expr(
                spec, 1, targets, recipe, optimizer, impl
            ),
        }
    if term == "qlora":
        return {f"frozen base {k} ({quant})": v for k, v in frozen_base_exprs(spec, quant).items()}
    return {
        "KV cache": kv_cache_expr(spec),
        "KV cache per GPU, tensor parallel, paged": kv_cache_expr(spec, tp=True, paged=True),
    }


__all__ = ["FORMULAS", "Formula", "formula_exprs"]
