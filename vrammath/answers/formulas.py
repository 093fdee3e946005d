"""Formula access: every memory term's expressions by name, for ``vrammath formula`` and the docs.

Each expression is built by the module that owns its formula (activations, korthikanti, states,
parallel, lora, quant, kv_cache, estimate); this module only chooses which to show for a term.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import sympy

from vrammath.compose.estimate import estimate
from vrammath.compose.setup import Setup
from vrammath.model.params import param_count, param_exprs, param_total_expr, size_values
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError
from vrammath.notation.symbols import P
from vrammath.notation.vocab import (
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
from vrammath.serve.kv_cache import kv_cache_expr
from vrammath.terms.activations.layer import hf_layer_bytes
from vrammath.terms.activations.model import activation_exprs, hf_logits_loss_terms
from vrammath.terms.activations.parts import Schedule
from vrammath.terms.korthikanti.dense import korthikanti_first_stage_bytes, korthikanti_layer_bytes
from vrammath.terms.lora.adapters import lora_param_expr, lora_state_exprs, lora_step_temp_expr
from vrammath.terms.lora.quant import frozen_base_exprs
from vrammath.terms.parallel import zero_communication_elements, zero_paper_bytes
from vrammath.terms.states import model_state_exprs, optimizer_step_temp_expr

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

#: The options of :func:`formula_exprs` each term reads. The CLI refuses the others by name,
#: so that a flag that changes nothing is not silently accepted.
FORMULA_OPTIONS: dict[str, tuple[str, ...]] = {
    "params": (),
    "states": ("recipe", "optimizer"),
    "zero": ("stage",),
    "communication": ("stage",),
    "activations": ("recipe", "attention"),
    "logits": ("recipe",),
    "temporaries": ("recipe", "optimizer", "implementation"),
    "phases": ("recipe", "optimizer", "implementation", "stage", "attention"),
    "lora": ("optimizer", "implementation", "lora_targets"),  # adapters fp32 whatever the recipe
    "qlora": ("quant",),
    "kv": (),
}


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

    >>> from vrammath.model.presets import load_model
    >>> formula_exprs("zero", load_model("llama-7b"), stage=3)
    {'zero-3 bytes per GPU (ZeRO paper)': P*(K + 4)/N_d}
    >>> formula_exprs("bert", load_model("llama-7b"))
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: term: must be one of params, states, zero, communication, activations, logits, temporaries, phases, lora, qlora, kv (got 'bert')
    """
    term = check("term", term, FORMULAS)
    impl = implementation
    precision = PRECISION_OF[check("recipe", recipe, RECIPE_NAMES)]
    hf_terms = ("activations", "logits", "phases")
    if term in hf_terms and spec.conv1d and precision.startswith("autocast"):
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


def undominated(candidates: list[sympy.Basic]) -> list[sympy.Basic]:
    """The candidates of a maximum that no other candidate bounds term by term.

    Every symbol is positive, so where ``a - b`` expands to terms that are each a nonnegative
    coefficient times a product known to be nonnegative, ``b`` can never be the maximum: it is
    dropped (of equal candidates the first stays). A cheap, sound test: what it cannot decide
    stays.

    >>> from vrammath.notation.symbols import b, s
    >>> undominated([2 * b * s + 8, b * s + 8, 3 * s, b * s + 8])
    [2*b*s + 8, 3*s]
    """
    polys = [sympy.expand(c).as_coefficients_dict() for c in candidates]
    nonneg: dict[sympy.Basic, bool] = {}

    def at_least(big: dict[sympy.Basic, Any], small: dict[sympy.Basic, Any]) -> bool:
        for term in big.keys() | small.keys():
            diff = big.get(term, 0) - small.get(term, 0)
            if diff == 0:
                continue
            if term not in nonneg:
                nonneg[term] = bool(term.is_nonnegative)
            if diff < 0 or not nonneg[term]:
                return False
        return True

    kept: list[int] = []
    for i, poly in enumerate(polys):
        if any(at_least(polys[j], poly) for j in kept):
            continue
        kept = [j for j in kept if not at_least(poly, polys[j])] + [i]
    return [candidates[i] for i in sorted(kept)]


def with_sizes(expr: sympy.Expr, spec: ModelSpec) -> sympy.Expr:
    """``expr`` with the model's sizes (and its parameter count) put in.

    A peak is a ``Max`` of candidates left unevaluated (see :mod:`vrammath.compose.peak`); it stays
    so here, its candidates each get the numbers, instead of sympy comparing polynomials in the
    run symbols that remain (tens of seconds on DeepSeek-V3, deciding nothing).

    >>> from vrammath.model.presets import load_model
    >>> from vrammath.notation.symbols import b, h, s
    >>> with_sizes(sympy.Max(2 * b * s * h, 3 * h, evaluate=False), load_model("llama-7b"))
    Max(12288, 8192*b*s)
    """
    sizes = {k: sympy.Integer(v) for k, v in {**size_values(spec), P: param_count(spec)}.items()}

    def put(e: sympy.Basic) -> sympy.Basic:
        if isinstance(e, sympy.Max):
            return sympy.Max(*undominated([put(a) for a in e.args]), evaluate=False)
        if isinstance(e, sympy.Min):
            return sympy.Min(*(put(a) for a in e.args), evaluate=False)
        if not e.has(sympy.Max, sympy.Min):
            return e.xreplace(sizes)
        return e.func(*(put(a) for a in e.args))

    return sympy.sympify(put(sympy.sympify(expr)))


__all__ = ["FORMULAS", "FORMULA_OPTIONS", "Formula", "formula_exprs", "undominated", "with_sizes"]
