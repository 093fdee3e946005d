"""The cheapest plan: which ZeRO stage, CPU offload and recomputation to use.

Candidates over ZeRO stage, offload and recomputation (:func:`candidates`) are ranked by a
relative step-time cost (:func:`plan_cost`: ZeRO's extra communication, recomputation's extra
FLOPs, offload weights); :func:`cheapest_fit` returns the first that fits, so every cheaper one is
shown not to fit. :func:`vrammath.answers.fit.fit` states it beside the answers for the setup as given.

Examples
========

>>> from vrammath.model.presets import load_model
>>> from vrammath.compose.setup import Setup
>>> plan = cheapest_fit(Setup(load_model("llama-7b"), zero=3, gpus=8, gpu="A100-40GB"))
>>> [t.fits for t in plan.tried][-2:]
[False, True]

References
==========

.. [1] Rajbhandari et al. 2020, "ZeRO", arXiv:1910.02054 (communication volume per stage).
.. [2] Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
   arXiv:2205.05198 (what selective and full recomputation recompute).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import sympy

from vrammath.answers.budget import Budget, HostCheck, host_check, setup_budget
from vrammath.compose.estimate import Estimate, check_modelled, estimate
from vrammath.compose.setup import Setup, with_changes
from vrammath.model.params import layer_param_count
from vrammath.notation.errors import InputError
from vrammath.notation.units import fmt_bytes
from vrammath.notation.vocab import RECOMPUTES
from vrammath.terms.parallel import STAGES, zero_communication_elements

OFFLOAD_OPTIMIZER_COST = Fraction(1)
"""Relative step-time cost charged for optimizer offload (CPU Adam + PCIe traffic); a ranking
weight, not a prediction. It sits above ZeRO-3's extra communication (1/2), as DeepSpeed's and
Hugging Face's guidance orders them: stage 2 < stage 3 < offload."""

OFFLOAD_PARAMS_COST = Fraction(1)
"""Further relative cost charged for parameter offload (weights stream over PCIe every step)."""


def recompute_cost(setup: Setup) -> Fraction:
    """Extra training FLOPs of a recomputation policy, as a fraction of a step without it.

    Forward FLOPs per layer are ``2 b s N_layer`` for the matmuls with weights plus ``4 b s^2 a d``
    for the two attention matmuls; a training step is three forwards' worth. ``full`` repeats the
    forward (1/3); ``selective`` repeats only the attention core (Korthikanti et al. 2022).

    >>> from vrammath.model.presets import load_model
    >>> float(recompute_cost(Setup(load_model("llama-7b"), recompute="selective")))  # doctest: +ELLIPSIS
    0.0255...
    """
    if setup.recompute == "none":
        return Fraction(0)
    if setup.recompute == "full":
        return Fraction(1, 3)
    spec = setup.model
    core = 4 * setup.seq_len * spec.heads * spec.head_dim  # per token
    forward = 2 * layer_param_count(spec) + core
    return Fraction(core, 3 * forward)


def plan_cost(setup: Setup) -> Fraction:
    """The ranking cost of a setup's memory-saving options (lower is cheaper).

    ZeRO's extra communication (stage 3 moves 3P elements per step against 2P, ZeRO section 7)
    + :func:`recompute_cost` + the offload weights :data:`OFFLOAD_OPTIMIZER_COST` and
    :data:`OFFLOAD_PARAMS_COST`.
    """
    ratio = sympy.Rational(zero_communication_elements(setup.zero) / zero_communication_elements(0))
    comm = Fraction(int(ratio.p), int(ratio.q)) - 1
    cost = comm + recompute_cost(setup)
    if setup.offload_optimizer:
        cost += OFFLOAD_OPTIMIZER_COST
    if setup.offload_params:
        cost += OFFLOAD_PARAMS_COST
    return cost


def plan_label(setup: Setup) -> str:
    """``'ZeRO-3 + offload optimizer + recompute full'`` style name of a setup's options."""
    parts = [f"ZeRO-{setup.zero}" + ("" if setup.engine == "hf" else f" ({setup.engine})")]
    if setup.offload_optimizer:
        parts.append("offload optimizer")
    if setup.offload_params:
        parts.append("offload params")
    if setup.recompute != "none":
        parts.append(f"recompute {setup.recompute}")
    return " + ".join(parts)


@dataclass(frozen=True)
class Tried:
    """One candidate :func:`cheapest_fit` evaluated: its name, cost, GPU bytes, host bytes per
    node (0 without offload) and verdict (``fits``: the GPU and, where known, the host)."""

    label: str
    cost: Fraction
    bytes: int
    fits: bool
    host_bytes: int = 0
    host_fits: bool | None = True

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form (the cost as a fraction string and a float)."""
        return {
            "label": self.label,
            "cost": str(self.cost),
            "cost_float": float(self.cost),
            "bytes": self.bytes,
            "host_bytes": self.host_bytes,
            "host_fits": self.host_fits,
            "fits": self.fits,
        }


@dataclass(frozen=True)
class Plan:
    """The cheapest fitting combination (``setup`` None when none fits) and what was tried.

    Every candidate in ``tried`` before the chosen one is cheaper and does not fit (on the GPU,
    or on the host for an offloading one). ``host`` is the chosen plan's host side.
    """

    setup: Setup | None
    estimate: Estimate | None
    limit: int
    tried: tuple[Tried, ...]
    host: HostCheck | None = None

    @property
    def label(self) -> str:
        """The chosen plan's name, or ``'none'``."""
        return "none" if self.setup is None else plan_label(self.setup)

    def __str__(self) -> str:
        if self.setup is None or self.estimate is None:
            return (
                f"recommended: nothing fits ({len(self.tried)} combinations tried, "
                f"{fmt_bytes(self.limit)} usable)"
            )
        host = "" if self.host is None or not self.host.per_rank else f"; {self.host}"
        return (
            f"recommended: {self.label} on {self.setup.gpus} GPU(s) "
            f"({fmt_bytes(self.estimate.gpu_bytes)} of {fmt_bytes(self.limit)} usable{host}; "
            f"{len(self.tried) - 1} cheaper combination(s) do not fit)"
        )

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form: the chosen options, their bytes, the host side and every try."""
        chosen = self.setup
        return {
            "label": self.label,
            "zero": None if chosen is None else chosen.zero,
            "offload_optimizer": None if chosen is None else chosen.offload_optimizer,
            "offload_params": None if chosen is None else chosen.offload_params,
            "recompute": None if chosen is None else chosen.recompute,
            "gpus": None if chosen is None else chosen.gpus,
            "gpu_bytes": None if self.estimate is None else self.estimate.gpu_bytes,
            "limit_bytes": self.limit,
            "host": None if self.host is None else self.host.as_dict(),
            "tried": [t.as_dict() for t in self.tried],
        }


def checked_setup(setup: object) -> Setup:
    """``setup`` if it is a :class:`~vrammath.compose.setup.Setup`, else an :class:`InputError`."""
    if not isinstance(setup, Setup):
        raise InputError("setup", "must be a vrammath.Setup", got=type(setup).__name__)
    return setup


def _options(field: str, given: Iterable[object], allowed: Iterable[object]) -> list[Any]:
    pool = list(allowed)
    items = list(given) if isinstance(given, Iterable) and not isinstance(given, str) else None
    if not items or any(isinstance(x, bool) or x not in pool for x in items):
        raise InputError(
            field, "must be a non-empty selection of " + ", ".join(map(str, pool)), got=given
        )
    return items


def candidates(
    setup: Setup,
    *,
    stages: Iterable[int] = STAGES,
    offload: bool = True,
    recompute: Iterable[str] = RECOMPUTES,
) -> list[Setup]:
    """Every valid variant of ``setup`` over ZeRO stage, offload and recomputation, cheapest first.

    Ties in :func:`plan_cost` go to the lower stage, then to fewer offloads. Selective
    recomputation is Megatron's: it is tried only where the setup uses Korthikanti's formulas
    (Hugging Face models offer none or full); combinations a setup refuses are skipped.

    >>> from vrammath.model.presets import load_model
    >>> candidates(Setup(load_model("gpt2")), stages=[7])
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: stages: must be a non-empty selection of 0, 1, 2, 3 (got [7])
    """
    setup = checked_setup(setup)
    stage_list = _options("stages", stages, STAGES)
    policies = _options("recompute", recompute, RECOMPUTES)
    if not isinstance(offload, bool):
        raise InputError("offload", "must be True or False", got=offload)
    hf_run = setup.activation_model != "korthikanti" and setup.tp == 1 and setup.pp == 1
    out = []
    offloads = [(False, False), (True, False), (True, True)] if offload else [(False, False)]
    for stage in stage_list:
        for opt, par in offloads:
            if (opt and stage == 0) or (par and stage != 3):
                continue
            for policy in policies:
                if policy == "selective" and hf_run:
                    continue
                try:
                    variant = with_changes(
                        setup,
                        zero=stage,
                        offload_optimizer=opt,
                        offload_params=par,
                        recompute=policy,
                        # unsharded, a layout of shards means nothing (Setup refuses it)
                        shard=setup.shard if stage else "flat",
                    )
                    check_modelled(variant)  # e.g. full recomputation on the Korthikanti MoE path
                except InputError:
                    continue
                if variant not in out:  # an engine that fixes the stage makes --zero 0 its own
                    out.append(variant)
    return sorted(out, key=lambda c: (plan_cost(c), c.zero, c.offload_optimizer, c.offload_params))


def cheapest_fit(
    setup: Setup,
    budget: Budget | None = None,
    *,
    stages: Iterable[int] = STAGES,
    offload: bool = True,
    recompute: Iterable[str] = RECOMPUTES,
    cost: Callable[[Setup], Fraction] | None = None,
) -> Plan:
    """The cheapest combination of ZeRO stage, CPU offload and recomputation that fits.

    Candidates (:func:`candidates`) are estimated in order of ``cost`` (default
    :func:`plan_cost`); the first that fits is the plan, so every cheaper one is shown not to fit.
    An offloading candidate fits only if the node's host memory holds what its ranks offload
    (:func:`~vrammath.answers.budget.host_check`).
    """
    setup = checked_setup(setup)
    bud = setup_budget(setup, budget)
    if cost is not None and not callable(cost):
        raise InputError("cost", "must be a function of a Setup, or None", got=cost)
    lim = bud.usable
    pool = candidates(setup, stages=stages, offload=offload, recompute=recompute)
    if cost is not None:
        pool = sorted(pool, key=cost)
    rank = cost or plan_cost
    tried: list[Tried] = []
    for cand in pool:
        est = estimate(cand)
        host = host_check(est, bud)
        ok = est.gpu_bytes <= lim and host.fits is not False
        tried.append(Tried(plan_label(cand), rank(cand), est.gpu_bytes, ok, host.need, host.fits))
        if ok:
            return Plan(cand, est, lim, tuple(tried), host)
    return Plan(None, None, lim, tuple(tried))


__all__ = [
    "OFFLOAD_OPTIMIZER_COST",
    "OFFLOAD_PARAMS_COST",
    "Plan",
    "Tried",
    "candidates",
    "cheapest_fit",
    "checked_setup",
    "plan_cost",
    "plan_label",
    "recompute_cost",
]
