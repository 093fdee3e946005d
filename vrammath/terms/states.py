"""Model states: weights, gradients, master weights and optimizer states, per recipe and optimizer.

A *precision recipe* fixes the bytes per element of each state; an *optimizer* fixes how many state
tensors it keeps and of what shape. For optimizers whose states are proportional to the parameters
(Adam, SGD) the totals are ``bytes_per_param * P``; for shape-dependent ones (8-bit Adam keeps small
tensors in 32 bits and one fp32 scale per block of 256, Adafactor factors the second moment of every
matrix into a row and a column vector) the expression runs over the model's real tensor shapes.

Examples
========

>>> bytes_per_param("bf16-mixed", "adamw")
{'weights': 2, 'gradients': 2, 'master': 4, 'optimizer': 8}
>>> sum(bytes_per_param("bf16-megatron", "adamw").values())
18
>>> sum(bytes_per_param("bf16-pure", "adamw").values())
8
>>> from vrammath.model.presets import load_model
>>> model_state_bytes(load_model("llama-7b"), "bf16-mixed", "adamw")["optimizer"]
53907324928

References
==========

.. [1] Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
   Models", arXiv:1910.02054, section 3.1 (mixed-precision Adam: 2 + 2 + 12 bytes/parameter).
.. [2] Micikevicius et al. 2018, "Mixed Precision Training", arXiv:1710.03740.
.. [3] Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization", arXiv:2110.02861.
.. [4] Shazeer and Stern 2018, "Adafactor", arXiv:1804.04235.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sympy

from vrammath.model.params import (
    Tensor,
    fp32_param_expr,
    largest_tensor_numel,
    param_count,
    size_values,
    tensors,
)
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError, one_of
from vrammath.notation.symbols import P


@dataclass(frozen=True)
class Recipe:
    """Bytes per element of each model state under one precision recipe."""

    name: str
    weights: int
    gradients: int
    master: int
    state: int
    compute: str
    description: str


#: Every precision recipe by name, with the bytes per element of each model state.
RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("fp32", 4, 4, 0, 4, "fp32", "everything in fp32"),
        Recipe(
            "fp16-mixed",
            2,
            2,
            4,
            4,
            "fp16",
            "fp16 weights and gradients, fp32 master weights and optimizer states (ZeRO, DeepSpeed)",
        ),
        Recipe(
            "bf16-mixed",
            2,
            2,
            4,
            4,
            "bf16",
            "bf16 weights and gradients, fp32 master weights and optimizer states (ZeRO, DeepSpeed)",
        ),
        Recipe(
            "bf16-megatron",
            2,
            4,
            4,
            4,
            "bf16",
            "bf16 weights, fp32 gradient accumulation (main_grad), fp32 master and states (Megatron)",
        ),
        Recipe(
            "autocast-bf16",
            4,
            4,
            0,
            4,
            "bf16",
            "PyTorch autocast: fp32 parameters, gradients and states; bf16 copies made for compute",
        ),
        Recipe(
            "autocast-fp16",
            4,
            4,
            0,
            4,
            "fp16",
            "PyTorch autocast: fp32 parameters, gradients and states; fp16 copies made for compute",
        ),
        Recipe("bf16-pure", 2, 2, 0, 2, "bf16", "every state in bf16, no master copy"),
        Recipe(
            "deepseek-v3-fp8",
            2,
            4,
            4,
            2,
            "fp8",
            "bf16 weights (FP8 GEMMs), fp32 gradients and master weights, bf16 AdamW moments "
            "(DeepSeek-V3, arXiv:2412.19437 Section 3.3)",
        ),
    )
}

#: optimizer -> number of full-size state tensors it keeps per parameter tensor (the optimizers
#: whose states are proportional to the parameters)
STATE_TENSORS = {"adamw": 2, "adam": 2, "sgd": 0, "sgd-momentum": 1}
OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum", "adam8bit", "adafactor")
IMPLEMENTATIONS = ("for-loop", "foreach", "fused")

# bitsandbytes: tensors below this many elements keep 32-bit states; block-wise scales per 256.
BNB_MIN_8BIT_SIZE = 4096
BNB_BLOCK = 256


def recipe(name: str) -> Recipe:
    """A precision recipe by name (see :data:`RECIPES`)."""
    if name not in RECIPES:
        raise one_of("recipe", name, list(RECIPES))
    return RECIPES[name]


def _check_optimizer(optimizer: str) -> None:
    if optimizer not in OPTIMIZERS:
        raise one_of("optimizer", optimizer, OPTIMIZERS)


def proportional_widths(rec: Recipe, optimizer: str, refusal: str) -> dict[str, int]:
    """Bytes per parameter of each model state under ``rec``, for an optimizer of
    :data:`STATE_TENSORS`; any other (its states depend on tensor shapes) is refused with the
    message ``refusal``.

    >>> proportional_widths(recipe("bf16-pure"), "sgd-momentum", "no")
    {'weights': 2, 'gradients': 2, 'master': 0, 'optimizer': 2}
    """
    if optimizer not in STATE_TENSORS:
        raise InputError("optimizer", refusal, got=optimizer)
    return {
        "weights": rec.weights,
        "gradients": rec.gradients,
        "master": rec.master,
        "optimizer": STATE_TENSORS[optimizer] * rec.state,
    }


def bytes_per_param(recipe_name: str, optimizer: str) -> dict[str, int]:
    """Bytes per parameter of each model state, for optimizers proportional to the parameters.

    8-bit Adam and Adafactor depend on tensor shapes: use :func:`model_state_exprs` for them.
    """
    rec = recipe(recipe_name)
    _check_optimizer(optimizer)
    return proportional_widths(
        rec,
        optimizer,
        f"{optimizer}'s states depend on tensor shapes; per-parameter bytes need a model "
        "(use model_state_exprs); proportional optimizers: " + ", ".join(STATE_TENSORS),
    )


def tensor_optimizer_expr(
    tensor_list: Sequence[Tensor],
    values: Mapping[sympy.Symbol, int],
    optimizer: str,
    state_bytes: int,
    *,
    adafactor_momentum: bool = False,
) -> sympy.Expr:
    """Optimizer-state bytes of a list of tensors (the model's, or LoRA adapters').

    ``state_bytes`` is the width of one full-precision state element. bitsandbytes' 8-bit Adam
    (``Optimizer2State``) keeps ``m`` and ``v`` as uint8 codes plus one fp32 absmax per block of
    256 elements, except for tensors under 4096 elements, which keep fp32 states; ``values``
    decides that threshold for symbolic shapes.

    >>> from vrammath.model.params import Tensor
    >>> from vrammath.notation.symbols import h
    >>> w = Tensor("w", (h, h), sympy.Integer(1), "attention")
    >>> tensor_optimizer_expr([w], {h: 4096}, "adam8bit", 4)
    2*h**2 + 8*ceiling(h**2/256)
    >>> tensor_optimizer_expr([w], {h: 32}, "adam8bit", 4)
    8*h**2
    """
    _check_optimizer(optimizer)
    total = sympy.Integer(0)
    for tensor in tensor_list:
        numel = tensor.numel
        if optimizer in STATE_TENSORS:
            one = STATE_TENSORS[optimizer] * state_bytes * numel
        elif optimizer == "adam8bit":
            if int(numel.subs(values)) >= BNB_MIN_8BIT_SIZE:
                one = 2 * (numel + 4 * sympy.ceiling(numel / BNB_BLOCK))  # uint8 + fp32 absmax
            else:
                one = 2 * 4 * numel
        else:  # adafactor: exp_avg_sq_row (shape[:-1]) + exp_avg_sq_col (shape[:-2] + last)
            shape = tensor.shape  # 3-D expert weights keep one row/column pair per expert
            factored = sympy.Mul(*shape[:-1]) + sympy.Mul(*shape[:-2]) * shape[-1]
            second = factored if len(shape) >= 2 else numel
            first = numel if adafactor_momentum else 0
            one = state_bytes * (second + first)
        total += tensor.count * one
    return total


def _adam8bit_expr(spec: ModelSpec) -> sympy.Expr:
    return tensor_optimizer_expr(tensors(spec), size_values(spec), "adam8bit", 4)


def _adafactor_expr(spec: ModelSpec, state_bytes: int, momentum: bool) -> sympy.Expr:
    return tensor_optimizer_expr(
        tensors(spec), size_values(spec), "adafactor", state_bytes, adafactor_momentum=momentum
    )


def model_state_exprs(
    spec: ModelSpec, recipe_name: str, optimizer: str, *, adafactor_momentum: bool = False
) -> dict[str, sympy.Expr]:
    """Total bytes of each model state as an expression.

    Proportional states are written in ``P`` (Psi, the parameter count); shape-dependent optimizer
    states in the model symbols (h, I, L, ...). Substitute :func:`state_values` to evaluate.

    >>> from vrammath.model.presets import load_model
    >>> model_state_exprs(load_model("llama-7b"), "bf16-mixed", "adamw")
    {'weights': 2*P, 'gradients': 2*P, 'master': 4*P, 'optimizer': 8*P}
    """
    rec = recipe(recipe_name)
    _check_optimizer(optimizer)
    out: dict[str, sympy.Expr] = {
        "weights": rec.weights * P,
        "gradients": rec.gradients * P,
        "master": rec.master * P,
    }
    if optimizer in STATE_TENSORS:
        out["optimizer"] = STATE_TENSORS[optimizer] * rec.state * P
    elif optimizer == "adam8bit":
        out["optimizer"] = _adam8bit_expr(spec)
    else:
        out["optimizer"] = _adafactor_expr(spec, rec.state, adafactor_momentum)
    fp32 = fp32_param_expr(spec)
    if fp32 != 0:  # kept in fp32 by transformers: their states are 4 bytes whatever the recipe
        widths = {"weights": rec.weights, "gradients": rec.gradients}
        if optimizer in STATE_TENSORS:
            widths["optimizer"] = rec.state
        for key, width in widths.items():
            if 0 < width < 4:
                per_param = STATE_TENSORS[optimizer] if key == "optimizer" else 1
                out[key] = out[key] + per_param * (4 - width) * fp32
    return out


def state_values(spec: ModelSpec) -> dict[sympy.Symbol, int]:
    """Substitutions for model-state expressions: ``P`` and the model symbols."""
    return {P: param_count(spec), **size_values(spec)}


def model_state_bytes(
    spec: ModelSpec, recipe_name: str, optimizer: str, *, adafactor_momentum: bool = False
) -> dict[str, int]:
    """Exact bytes of each model state (weights, gradients, master, optimizer) on one replica."""
    values = state_values(spec)
    exprs = model_state_exprs(spec, recipe_name, optimizer, adafactor_momentum=adafactor_momentum)
    return {name: int(expr.subs(values)) for name, expr in exprs.items()}


def step_temporaries_expr(
    optimizer: str,
    implementation: str,
    state_bytes: int,
    *,
    params: sympy.Expr,
    largest: sympy.Expr,
) -> sympy.Expr:
    """Transient bytes allocated inside ``optimizer.step()`` of PyTorch's Adam/AdamW/SGD over a
    set of tensors with ``params`` elements in all, the largest of them ``largest`` elements.

    * ``fused``: the kernel updates in place -- no temporaries.
    * ``foreach``: ``_foreach_sqrt`` of the second moments materialises one state-sized copy of
      every tensor at once (``params * state_bytes``).
    * ``for-loop``: ``exp_avg_sq.sqrt() / bias_correction2_sqrt`` briefly holds two temporaries of
      the largest tensor.

    Optimizers other than Adam/AdamW are 0 here (SGD's update is in place). The whole model
    (:func:`optimizer_step_temp_expr`) and LoRA's adapters alone both use this rule.

    >>> from vrammath.notation.symbols import h
    >>> step_temporaries_expr("adamw", "for-loop", 4, params=P, largest=h**2)
    8*h**2
    >>> step_temporaries_expr("adamw", "foreach", 4, params=P, largest=h**2)
    4*P

    References
    ==========

    .. [1] PyTorch ``torch/optim/adam.py``: ``_single_tensor_adam``, ``_multi_tensor_adam``,
       ``_fused_adam``.
    """
    _check_optimizer(optimizer)
    if implementation not in IMPLEMENTATIONS:
        raise one_of("implementation", implementation, IMPLEMENTATIONS)
    if optimizer not in ("adam", "adamw") or implementation == "fused":
        return sympy.Integer(0)
    if implementation == "foreach":
        return state_bytes * params
    return 2 * state_bytes * largest


def optimizer_step_temp_expr(
    spec: ModelSpec, recipe_name: str, optimizer: str, implementation: str, *, ep: int = 1
) -> sympy.Expr:
    """Transient bytes allocated inside ``optimizer.step()`` over the whole model
    (:func:`step_temporaries_expr` with the recipe's state width); under expert parallelism
    (``ep``) the largest tensor is the larger of a rank's local expert tensors and the rest.

    >>> from vrammath.model.presets import load_model
    >>> optimizer_step_temp_expr(load_model("llama-7b"), "fp32", "adamw", "foreach")
    4*P
    """
    rec = recipe(recipe_name)
    temp = step_temporaries_expr(
        optimizer,
        implementation,
        rec.state,
        params=P,
        largest=sympy.Integer(largest_tensor_numel(spec, ep)),
    )
    if implementation == "foreach" and temp != 0 and rec.state < 4:
        # the fp32 parameters' square roots are fp32 (foreach groups tensors by dtype)
        temp += (4 - rec.state) * fp32_param_expr(spec)
    return temp


def optimizer_step_temp_bytes(
    spec: ModelSpec, recipe_name: str, optimizer: str, implementation: str
) -> int:
    """:func:`optimizer_step_temp_expr` evaluated for ``spec`` (one unsharded replica).

    >>> from vrammath.model.presets import load_model
    >>> optimizer_step_temp_bytes(load_model("llama-7b"), "fp32", "adamw", "foreach")
    26953662464
    """
    expr = optimizer_step_temp_expr(spec, recipe_name, optimizer, implementation)
    return int(expr.subs(state_values(spec)))


def optimizer_table(spec: ModelSpec, recipe_name: str = "bf16-mixed") -> list[dict[str, object]]:
    """Every optimizer's model states for ``spec`` under one recipe: exact bytes and bytes/param.

    Shape-dependent optimizers are evaluated on the real tensors: bitsandbytes' 8-bit Adam comes
    to just over 2 bytes per parameter (uint8 ``m`` and ``v`` plus 2 x 4/256 bytes of block-wise
    absmax), Adafactor to almost nothing.

    >>> from vrammath.model.presets import load_model
    >>> rows = optimizer_table(load_model("llama-7b"))
    >>> [(r["optimizer"], r["optimizer_bytes_per_param"]) for r in rows][:2]
    [('adamw', 8.0), ('adam', 8.0)]
    >>> row = next(r for r in rows if r["optimizer"] == "adam8bit")
    >>> round(row["optimizer_bytes_per_param"], 4), round(row["total_bytes_per_param"], 4)
    (2.0312, 10.0312)
    """
    psi = param_count(spec)
    out: list[dict[str, object]] = []
    for name in OPTIMIZERS:
        states = model_state_bytes(spec, recipe_name, name)
        out.append(
            {
                "optimizer": name,
                "recipe": recipe_name,
                **{f"{key}_bytes": value for key, value in states.items()},
                "optimizer_bytes_per_param": states["optimizer"] / psi,
                "total_bytes_per_param": sum(states.values()) / psi,
            }
        )
    return out


__all__ = [
    "BNB_BLOCK",
    "BNB_MIN_8BIT_SIZE",
    "IMPLEMENTATIONS",
    "OPTIMIZERS",
    "RECIPES",
    "STATE_TENSORS",
    "Recipe",
    "bytes_per_param",
    "model_state_bytes",
    "model_state_exprs",
    "optimizer_step_temp_bytes",
    "optimizer_step_temp_expr",
    "optimizer_table",
    "proportional_widths",
    "recipe",
    "state_values",
    "step_temporaries_expr",
    "tensor_optimizer_expr",
]
