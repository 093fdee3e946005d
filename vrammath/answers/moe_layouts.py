"""Mixture-of-experts training layouts answered: the busiest rank's model states and activations
under PP x EP x TP x DP, read from :func:`vrammath.compose.estimate.estimate` (the one composition), and
DeepSeek-V3's published layout.

Examples
========

>>> answer = deepseek_v3_training_memory()
>>> answer.rank.stages, round(answer.total / 2**30, 1)  # GiB on the busiest H800
((0, 15), 75.1)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict, Unpack

import sympy

from vrammath.compose.estimate import Component, Estimate, estimate
from vrammath.compose.moe_stage import busiest_rank
from vrammath.compose.setup import Setup
from vrammath.model.presets import load_model
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError
from vrammath.notation.vocab import (
    ACTIVATION_POLICY_NAMES,
    OPTIMIZERS,
    RECIPE_NAMES,
    SCHEDULES,
    check,
)
from vrammath.terms.korthikanti.layout import (
    BF16_FLASH,
    DEEPSEEK_V3_POLICY,
    POLICIES,
    ActivationPolicy,
    policy_name,
)
from vrammath.terms.korthikanti.moe import Ratio
from vrammath.terms.moe.layout import DEEPSEEK_V3_RECIPE, Layout, RankParams, check_layout
from vrammath.terms.states import Recipe, recipe


@dataclass(frozen=True)
class LayoutMemory:
    """Per-GPU memory of the busiest rank of a layout: its parameters, model states and
    activations (bytes), with the assumptions that produced them and the
    :class:`~vrammath.compose.estimate.Estimate` they are read from."""

    spec: ModelSpec
    layout: Layout
    recipe: Recipe
    policy: ActivationPolicy
    micro_batch: int
    seq_len: int
    rank: RankParams
    states: dict[str, int]
    activations: dict[str, int]
    estimate: Estimate

    @property
    def total(self) -> int:
        """Model states plus activations in bytes, the estimate's own totals
        (:attr:`~vrammath.compose.estimate.Estimate.model_state_bytes` and
        :attr:`~vrammath.compose.estimate.Estimate.activation_bytes`)."""
        return self.estimate.model_state_bytes + self.estimate.activation_bytes


def layout_setup(
    spec: ModelSpec,
    layout: Layout,
    recipe_name: Recipe | str = "bf16-mixed",
    optimizer: str = "adamw",
    *,
    micro_batch: int = 1,
    seq_len: int = 4096,
    policy: ActivationPolicy | str = BF16_FLASH,
    capacity_factor: Ratio | None = None,
    imbalance: Ratio = 1,
) -> Setup:
    """The :class:`~vrammath.compose.setup.Setup` of a layout: Korthikanti-style activations, the data
    parallel group as ``gpus``, sequence parallelism with tensor parallelism (Megatron-Core
    requires it for MoE), capacity buffers padded.

    >>> from vrammath.model.presets import load_model
    >>> setup = layout_setup(load_model("mixtral-8x7b"), Layout(64, pp=4, ep=8))
    >>> setup.gpus, setup.pp, setup.ep, setup.activation_formula, setup.policy
    (16, 4, 8, 'korthikanti', 'bf16-flash')
    """
    check_layout(spec, layout)  # the layout's own names first
    name = recipe_name.name if isinstance(recipe_name, Recipe) else recipe_name
    if isinstance(recipe_name, Recipe) and recipe(name) != recipe_name:
        raise InputError(
            "recipe", "must be a named recipe of vrammath.terms.states.RECIPES", got=name
        )
    for field, value in (("capacity_factor", capacity_factor), ("imbalance", imbalance)):
        if isinstance(value, sympy.Expr) and not value.is_number:
            raise InputError(field, "must be a number for an estimate", got=str(value))
    return Setup(
        spec,
        recipe=check("recipe", name, RECIPE_NAMES),
        optimizer=check("optimizer", optimizer, OPTIMIZERS),
        zero=layout.zero,
        gpus=layout.dp,
        tp=layout.tp,
        pp=layout.pp,
        ep=layout.ep,
        sp=layout.tp > 1,
        schedule=check("schedule", layout.schedule, SCHEDULES),
        micro_batch=micro_batch,
        seq_len=seq_len,
        activation_model="korthikanti",
        capacity_factor=None if capacity_factor is None else float(capacity_factor),
        imbalance=float(imbalance),
        activation_policy=check("activation_policy", policy_name(policy), ACTIVATION_POLICY_NAMES),
    )


class LayoutOptions(TypedDict, total=False):
    """The keyword options of :func:`layout_setup`, which :func:`layout_memory` passes on."""

    micro_batch: int
    seq_len: int
    policy: ActivationPolicy | str
    capacity_factor: Ratio | None
    imbalance: Ratio


def layout_memory(
    spec: ModelSpec,
    layout: Layout,
    recipe_name: Recipe | str = "bf16-mixed",
    optimizer: str = "adamw",
    **options: Unpack[LayoutOptions],
) -> LayoutMemory:
    """The busiest rank's model states and activations, read from
    :func:`vrammath.compose.estimate.estimate` of :func:`layout_setup` (the one composition); the
    arguments are :func:`layout_setup`'s.

    >>> from vrammath.model.presets import load_model
    >>> mem = layout_memory(load_model("mixtral-8x7b"), Layout(64, pp=4, ep=8))
    >>> mem.rank.stages, round(mem.total / 2**30, 1)
    ((3,), 48.7)
    """
    setup = layout_setup(spec, layout, recipe_name, optimizer, **options)
    est = estimate(setup)
    keys = {c.key: c.bytes for c in est.components}
    states = {k: keys.get(k) or 0 for k in ("weights", "gradients", "master", "optimizer")}
    acts = {"layers": keys["activations"] or 0}
    if "logits_loss" in keys:
        acts["head"] = keys["logits_loss"] or 0
    return LayoutMemory(
        spec,
        layout,
        recipe(setup.recipe),
        POLICIES[setup.policy],
        setup.micro_batch,
        setup.seq_len,
        busiest_rank(setup),
        states,
        acts,
        est,
    )


#: The published training layout of DeepSeek-V3 (report Section 3.2), 2,048 H800s with 16-way
#: pipeline parallelism under DualPipe, 64-way expert parallelism over 8 nodes, ZeRO-1 data
#: parallelism and no tensor parallelism.
DEEPSEEK_V3_LAYOUT = Layout(2048, pp=16, tp=1, ep=64, zero=1, schedule="dualpipe")


def deepseek_v3_training_memory(**options: Unpack[LayoutOptions]) -> LayoutMemory:
    """Per-GPU memory of DeepSeek-V3's pre-training on 2,048 H800s, from the formulas.

    ``options`` are :func:`layout_setup`'s keywords (:class:`LayoutOptions`), with the policy
    :data:`~vrammath.terms.korthikanti.layout.DEEPSEEK_V3_POLICY` unless one is given.

    The published layout (:data:`DEEPSEEK_V3_LAYOUT`), precision
    (:data:`~vrammath.terms.moe.layout.DEEPSEEK_V3_RECIPE`: bf16 weights, fp32 gradients and master
    weights, bf16 AdamW moments),
    sequences of 4,096 tokens (Section 4.2), dropless routing (Section 2.1.2) with balanced
    load (``imbalance`` 1). The micro-batch is not published: one sequence is assumed.

    >>> answer = deepseek_v3_training_memory()
    >>> {k: round(v / 2**30, 2) for k, v in answer.states.items()}
    {'weights': 9.95, 'gradients': 19.91, 'master': 0.72, 'optimizer': 0.72}

    References
    ==========

    .. [1] DeepSeek-AI, arXiv:2412.19437 (2024), Sections 2.1.2, 3.2, 3.3 and 4.2.
    """
    asked: LayoutOptions = {"policy": DEEPSEEK_V3_POLICY, **options}
    return layout_memory(
        load_model("deepseek-v3"), DEEPSEEK_V3_LAYOUT, DEEPSEEK_V3_RECIPE, "adamw", **asked
    )


STATES = ("weights", "gradients", "master", "optimizer")


def _ep_estimate(
    spec: ModelSpec, recipe_name: str, optimizer: str, zero: int, gpus: int, ep: int
) -> tuple[Component, ...]:
    recipe_ = check("recipe", recipe_name, RECIPE_NAMES)
    optimizer_ = check("optimizer", optimizer, OPTIMIZERS)
    setup = Setup(spec, recipe=recipe_, optimizer=optimizer_, zero=zero, gpus=gpus, ep=ep)
    return estimate(setup).components


def ep_state_bytes(
    spec: ModelSpec,
    recipe_name: str = "bf16-mixed",
    optimizer: str = "adamw",
    *,
    zero: int = 0,
    gpus: int = 1,
    ep: int = 1,
) -> dict[str, int]:
    """Model-state bytes on one rank under expert parallelism ``ep`` and ZeRO stage ``zero``
    over ``gpus`` data-parallel ranks: the state rows of :func:`vrammath.compose.estimate.estimate`
    (the one composition) for that setup, 0 for a state the recipe lacks.

    >>> from vrammath.model.presets import load_model
    >>> s = ep_state_bytes(load_model("deepseek-v3"), zero=1, gpus=2048, ep=64)
    >>> round(sum(s.values()) / 2**30, 2)  # GiB per GPU, no pipeline or tensor parallelism
    105.89
    """
    rows = {c.key: c.bytes or 0 for c in _ep_estimate(spec, recipe_name, optimizer, zero, gpus, ep)}
    return {k: rows.get(k, 0) for k in STATES}


def ep_state_exprs(
    spec: ModelSpec, recipe_name: str, optimizer: str, zero: int
) -> dict[str, sympy.Expr]:
    """:func:`ep_state_bytes` as expressions in ``P``, ``P_e``, ``n_ep`` and ``N_d``: the state
    rows of the estimate of an expert-parallel setup (the smallest ``n_ep > 1`` the experts
    allow; the expressions do not depend on it).

    >>> from vrammath.model.presets import load_model
    >>> ep_state_exprs(load_model("mixtral-8x7b"), "bf16-mixed", "adamw", 1)["optimizer"]
    8*P/N_d
    >>> ep_state_exprs(load_model("mixtral-8x7b"), "bf16-mixed", "adamw", 0)["weights"]
    2*P - 2*P_e + 2*P_e/n_ep
    """
    if spec.experts is None:
        raise InputError("model", "has no experts", got=spec.name)
    ep = next(n for n in range(2, spec.experts.count + 1) if spec.experts.count % n == 0)
    rows = {c.key: c.expr for c in _ep_estimate(spec, recipe_name, optimizer, zero, ep, ep)}
    return {k: rows.get(k) or sympy.Integer(0) for k in STATES}


__all__ = [
    "DEEPSEEK_V3_LAYOUT",
    "STATES",
    "LayoutMemory",
    "LayoutOptions",
    "deepseek_v3_training_memory",
    "ep_state_bytes",
    "ep_state_exprs",
    "layout_memory",
    "layout_setup",
]
