"""Mixture-of-experts training layouts: model states per GPU under PP x EP x TP x DP with ZeRO.

Explanation
===========

``gpus`` ranks form ``p`` pipeline stages of ``t`` tensor-parallel ranks; the remaining
``N_d = gpus / (p t)`` ranks are the data-parallel group, of which the ``ep`` expert-parallel
ranks are a part (Megatron-Core's and DeepSpeed-MoE's groups, as in ``vrammath.terms.moe.params``): the routed
experts' own data-parallel group has ``N_d / ep`` ranks. Evenly split, one rank holds

.. math::

    \\frac{\\Psi - \\Psi_e}{p t} + \\frac{\\Psi_e}{p t e_p}

parameters (experts over ``t e_p``: Megatron's expert tensor parallelism equal to ``t``), and a
state that ZeRO shards is ``Psi / (p t N_d)`` per rank, since the dense part is sharded over
``N_d`` ranks and the experts' over ``N_d / e_p``. ZeRO-1 shards the master weights and
optimizer states; ZeRO-2 (gradients) and ZeRO-3 (weights) are refused with ``p > 1``, as
DeepSpeed refuses them with pipeline parallelism.

DualPipe (DeepSeek-V3's schedule) feeds micro-batches from both ends: rank ``i`` holds stage
``i`` and stage ``p - 1 - i`` ("two copies of the model parameters", report Section 3.2.1,
Table 2). Weights and gradients double; the optimizer side is taken as sharded over every rank
that holds a stage (the two copies are data-parallel replicas of it), so it does not. Its
in-flight activations are those of ``p + 1`` micro-batches of one stage (Table 2), against
``p`` for 1F1B's first stage (Korthikanti et al.'s ``L`` layers' worth).

:func:`layout_state_bytes` counts the busiest rank exactly from the model's tensors: stage ``j``
holds layers ``floor(j n / p)`` to ``floor((j + 1) n / p) - 1`` of the ``n`` transformer layers
(the multi-token-prediction layers last), stage 0 the embedding, the last stage the final norm,
the head and the MTP modules' own projection and norms (the MTP modules share the embedding
and head, DeepSeek-V3's Section 3.2.3).

Examples
========

>>> layout_state_exprs("bf16-mixed", "adamw", zero=1)["optimizer"]
8*P/(N_d*p*t)
>>> layout_state_exprs("bf16-mixed", "adamw", zero=1, copies=2)["weights"]
4*P/(p*t) - 4*P_e/(p*t) + 4*P_e/(n_ep*p*t)

References
==========

.. [1] DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv:2412.19437 (2024), Section 3.2
   (16-way PP, 64-way EP over 8 nodes, ZeRO-1 DP, no TP; DualPipe, Table 2), Section 3.3.
.. [2] Rajbhandari et al. 2022, "DeepSpeed-MoE", arXiv:2201.05596; Megatron-Core
   ``parallel_state.py`` (expert-data-parallel group).
.. [3] Rajbhandari et al. 2020, "ZeRO", arXiv:1910.02054.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import sympy

from vrammath.model.params import Tensor, rank_share, size_values, tensors
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError, one_of
from vrammath.notation.symbols import L, L_e, N_d, P, P_e, n_ep, p, t
from vrammath.terms.moe.params import check_ep, mtp_param_count
from vrammath.terms.parallel import zero_stage
from vrammath.terms.states import STATE_TENSORS, Recipe, proportional_widths, recipe

SCHEDULES = ("1f1b", "dualpipe")
#: ZeRO stage from which each model state is sharded
SHARDED_FROM = {"weights": 3, "gradients": 2, "master": 1, "optimizer": 1}

#: The precision of DeepSeek-V3 (report Section 3.3), bf16 weights for compute (FP8 made per
#: GEMM), fp32 gradients and master weights, AdamW moments in bf16: the recipe
#: ``deepseek-v3-fp8`` of :data:`vrammath.terms.states.RECIPES`.
DEEPSEEK_V3_RECIPE = recipe("deepseek-v3-fp8")


@dataclass(frozen=True)
class Layout:
    """A parallel layout: ``gpus`` ranks, ``pp`` stages, ``tp`` tensor-parallel ranks, ``ep``
    expert-parallel ranks (inside the data-parallel group), ZeRO stage ``zero`` and the
    pipeline ``schedule`` (``1f1b`` or ``dualpipe``)."""

    gpus: int
    pp: int = 1
    tp: int = 1
    ep: int = 1
    zero: int = 1
    schedule: str = "1f1b"

    @property
    def dp(self) -> int:
        """The data-parallel ranks, ``gpus / (pp tp)``."""
        return self.gpus // (self.pp * self.tp)

    @property
    def copies(self) -> int:
        """The stages each rank holds, 2 under DualPipe and 1 otherwise."""
        return 2 if self.schedule == "dualpipe" else 1


def check_layout(spec: ModelSpec, layout: Layout) -> None:
    """Refuse, by name, a layout that is not modelled or does not divide.

    >>> from vrammath.model.presets import load_model
    >>> check_layout(load_model("deepseek-v3"), Layout(2048, pp=16, ep=64, zero=2))
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: zero: stages 2 and 3 are not modelled with pipeline parallelism (DeepSpeed refuses them) (got 2)
    """
    for name in ("gpus", "pp", "tp", "ep"):
        value = getattr(layout, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(name, "must be a positive integer", got=value)
    if layout.schedule not in SCHEDULES:
        raise one_of("schedule", layout.schedule, SCHEDULES)
    zero = zero_stage(layout.zero)
    if layout.gpus % (layout.pp * layout.tp):
        raise InputError(
            "gpus", f"must be a multiple of pp*tp = {layout.pp * layout.tp}", got=layout.gpus
        )
    if layout.pp > spec.layers + spec.mtp_layers:
        raise InputError(
            "pp", f"must be at most the {spec.layers + spec.mtp_layers} layers", got=layout.pp
        )
    if layout.pp > 1 and zero >= 2:
        raise InputError(
            "zero",
            "stages 2 and 3 are not modelled with pipeline parallelism (DeepSpeed refuses them)",
            got=zero,
        )
    if layout.schedule == "dualpipe" and layout.pp % 2:
        raise InputError("pp", "must be even for DualPipe (two stages per rank)", got=layout.pp)
    if spec.heads % layout.tp:
        raise InputError("tp", f"must divide the {spec.heads} attention heads", got=layout.tp)
    check_ep(spec, layout.ep, layout.dp)


def _recipe(value: Recipe | str) -> Recipe:
    return value if isinstance(value, Recipe) else recipe(value)


def state_widths(rec: Recipe, optimizer: str) -> dict[str, int]:
    """Bytes per parameter of each model state on a layout: every parameter at the recipe's
    width (no fp32 exceptions), full-size optimizer states only.

    >>> state_widths(DEEPSEEK_V3_RECIPE, "adamw")
    {'weights': 2, 'gradients': 4, 'master': 4, 'optimizer': 4}
    """
    return proportional_widths(
        rec,
        optimizer,
        "must be one of " + ", ".join(STATE_TENSORS) + " for a parallel layout "
        "(shape-dependent optimizer states are not split by group here)",
    )


def layout_state_exprs(
    recipe_name: Recipe | str, optimizer: str = "adamw", *, zero: int = 1, copies: int = 1
) -> dict[str, sympy.Expr]:
    """Model-state bytes per rank, the parameters split evenly over ``p`` stages and ``t``
    tensor-parallel ranks, experts over ``e_p`` (the module's Explanation). ``copies`` is the
    stages each rank holds (2 for DualPipe).

    At ``p = t = 1`` it is :func:`vrammath.answers.moe_layouts.ep_state_exprs`.

    >>> layout_state_exprs("bf16-mixed", "adamw", zero=0)["master"]
    4*P/(p*t) - 4*P_e/(p*t) + 4*P_e/(n_ep*p*t)
    """
    widths = state_widths(_recipe(recipe_name), optimizer)
    stage = zero_stage(zero)
    held = copies * ((P - P_e) / (p * t) + P_e / (p * t * n_ep))
    sharded = P / (p * t * N_d)  # copies stages, each sharded over copies * N_d ranks
    return {
        state: sympy.expand(width * (sharded if stage >= SHARDED_FROM[state] else held))
        for state, width in widths.items()
    }


@dataclass(frozen=True)
class RankParams:
    """Parameters one rank holds: its ``stages``, dense and expert parts (after tensor and
    expert parallelism), and the same parts divided by the ranks each is sharded over."""

    rank: int
    stages: tuple[int, ...]
    dense: Fraction
    experts: Fraction
    dense_sharded: Fraction
    experts_sharded: Fraction

    @property
    def held(self) -> Fraction:
        """Parameters held unsharded."""
        return self.dense + self.experts

    @property
    def sharded(self) -> Fraction:
        """Parameters held once ZeRO shards them."""
        return self.dense_sharded + self.experts_sharded


def _layer_tensor(tensor: Tensor, moe: bool) -> bool:
    return bool(tensor.count == L or tensor.count == (L_e if moe else L - L_e))


def stage_params(spec: ModelSpec, layout: Layout) -> list[tuple[Fraction, Fraction]]:
    """(dense, expert) parameters of each pipeline stage on one tensor/expert-parallel rank.

    Norms and routers are replicated over tensor-parallel ranks; the rest is split over ``tp``
    (:func:`vrammath.model.params.rank_share`, the rule :func:`vrammath.model.params.rank_param_count`
    uses; Megatron-Core replicates MLA's down projections, which this split divides), the routed
    experts over ``tp * ep``. The stages differ from ``rank_param_count``'s: layers
    ``floor(j n / p)`` onward here (the MTP layers included), ``ceil(L / p)`` per stage there
    (the fullest stage, as Korthikanti et al.'s first stage).

    >>> from vrammath.model.presets import load_model
    >>> [(int(d), int(e)) for d, e in stage_params(load_model("mixtral-8x7b"), Layout(8, ep=8))]
    [(1605636096, 5637144576)]
    """
    values = size_values(spec)
    tp, ep = layout.tp, layout.ep

    def split(tensor: Tensor) -> Fraction:
        return rank_share(tensor, int(tensor.numel.subs(values)), tp, ep)

    def part(pick: list[Tensor]) -> tuple[Fraction, Fraction]:
        dense = sum((split(x) for x in pick if x.component != "experts"), Fraction(0))
        return dense, sum((split(x) for x in pick if x.component == "experts"), Fraction(0))

    all_tensors = tensors(spec)
    moe_ids = set(spec.experts.layers) if spec.experts is not None else set()
    layer = {moe: part([x for x in all_tensors if _layer_tensor(x, moe)]) for moe in (True, False)}
    ends = {
        c: part([x for x in all_tensors if x.count == 1 and x.component in c])
        for c in (("embedding", "positions"), ("norms", "head"))
    }
    mtp_extra = Fraction(0)
    if spec.mtp_layers:  # MTP's projection and norms beyond its (MoE) decoder layer
        full = sum(int(x.numel.subs(values)) for x in all_tensors if _layer_tensor(x, True))
        mtp_extra = Fraction(mtp_param_count(spec) // spec.mtp_layers - full, tp)
    n = spec.layers + spec.mtp_layers
    out = []
    for j in range(layout.pp):
        ids = range(j * n // layout.pp, (j + 1) * n // layout.pp)
        dense, experts = Fraction(0), Fraction(0)
        for i in ids:  # MTP layers (i >= L) are MoE layers with their extras
            d, e = layer[i in moe_ids or i >= spec.layers]
            dense, experts = dense + d + (mtp_extra if i >= spec.layers else 0), experts + e
        if j == 0:
            dense += ends[("embedding", "positions")][0]
        if j == layout.pp - 1:
            dense += ends[("norms", "head")][0]
            if spec.tied_embeddings and layout.pp > 1:
                dense += ends[("embedding", "positions")][0]
        out.append((dense, experts))
    return out


def rank_params(spec: ModelSpec, layout: Layout) -> list[RankParams]:
    """Every pipeline rank's :class:`RankParams` (DualPipe: stages ``i`` and ``p - 1 - i``).

    >>> from vrammath.model.presets import load_model
    >>> ranks = rank_params(load_model("deepseek-v3"), Layout(2048, 16, ep=64, schedule="dualpipe"))
    >>> ranks[0].stages, int(ranks[0].held)
    ((0, 15), 5343227904)
    """
    check_layout(spec, layout)
    stages = stage_params(spec, layout)
    edp = layout.dp // layout.ep
    out = []
    for r in range(layout.pp):
        own = (r,) if layout.copies == 1 else (r, layout.pp - 1 - r)
        dense = sum((stages[j][0] for j in own), Fraction(0))
        experts = sum((stages[j][1] for j in own), Fraction(0))
        # each stage is held by `copies` ranks of the pipeline group, all sharding its states
        out.append(
            RankParams(
                r,
                own,
                dense,
                experts,
                dense / (layout.dp * layout.copies),
                experts / (edp * layout.copies),
            )
        )
    return out


def layout_state_bytes(
    spec: ModelSpec,
    layout: Layout,
    recipe_name: Recipe | str = "bf16-mixed",
    optimizer: str = "adamw",
) -> tuple[RankParams, dict[str, int]]:
    """The busiest rank and its model-state bytes (shards rounded up), counted exactly.

    >>> from vrammath.model.presets import load_model
    >>> spec = load_model("deepseek-v3")
    >>> layout = Layout(2048, pp=16, ep=64, zero=1, schedule="dualpipe")
    >>> rank, states = layout_state_bytes(spec, layout, DEEPSEEK_V3_RECIPE)
    >>> rank.stages, round(sum(states.values()) / 2**30, 2)  # GiB on the busiest rank
    ((0, 15), 31.31)
    """
    widths = state_widths(_recipe(recipe_name), optimizer)
    stage = zero_stage(layout.zero)

    def states(rank: RankParams) -> dict[str, int]:
        return {
            k: math.ceil(w * (rank.sharded if stage >= SHARDED_FROM[k] else rank.held))
            for k, w in widths.items()
        }

    busiest = max(rank_params(spec, layout), key=lambda r: sum(states(r).values()))
    return busiest, states(busiest)


__all__ = [
    "DEEPSEEK_V3_RECIPE",
    "SCHEDULES",
    "Layout",
    "RankParams",
    "check_layout",
    "layout_state_bytes",
    "layout_state_exprs",
    "rank_params",
    "stage_params",
    "state_widths",
]
