"""A setup's busiest pipeline rank on the Korthikanti-style mixture-of-experts path: its layout,
its parameters, and the numbers the state rows of :data:`vrammath.compose.table.TERMS` take there.

Explanation
===========

``Setup.gpus`` is the data-parallel group, so a setup with ``pp`` stages of ``tp`` ranks is a
:class:`~vrammath.terms.moe.layout.Layout` of ``gpus * pp * tp`` GPUs. The busiest rank is the one
whose model states :func:`vrammath.terms.moe.layout.layout_state_bytes` finds largest;
:func:`rank_values` gives its ``P``, ``P_e`` and ``n_ep`` so that the table's rows (``P``
unsharded, ``P - P_e + P_e / n_ep`` under expert parallelism, ``P / (c N_d)`` sharded, ``c`` the
stages a rank holds, :func:`stage_copies`) reproduce that count.

Examples
========

>>> from vrammath.model.presets import load_model
>>> from vrammath.compose.setup import Setup
>>> setup = Setup(load_model("mixtral-8x7b"), gpus=8, pp=4, ep=8, zero=1)
>>> setup_layout(setup).gpus, busiest_rank(setup).stages
(32, (3,))
"""

from __future__ import annotations

import math

import sympy

from vrammath.compose.setup import Setup
from vrammath.notation.symbols import P, P_e, n_ep
from vrammath.terms.moe.layout import Layout, RankParams, check_layout, layout_state_bytes


def setup_layout(setup: Setup) -> Layout:
    """The :class:`~vrammath.terms.moe.layout.Layout` of a setup: ``Setup.gpus`` is the
    data-parallel group, so the layout has ``gpus * pp * tp`` GPUs.

    >>> from vrammath.model.presets import load_model
    >>> from vrammath.compose.setup import Setup
    >>> setup_layout(Setup(load_model("mixtral-8x7b"), gpus=8, pp=2, ep=8, zero=1))
    Layout(gpus=16, pp=2, tp=1, ep=8, zero=1, schedule='1f1b')
    """
    return Layout(
        setup.gpus * setup.pp * setup.tp,
        pp=setup.pp,
        tp=setup.tp,
        ep=setup.ep,
        zero=setup.zero,
        schedule=setup.schedule,
    )


def busiest_rank(setup: Setup) -> RankParams:
    """The pipeline rank whose model states are the largest
    (:func:`vrammath.terms.moe.layout.layout_state_bytes`), refused by name where the layout is not
    modelled.

    >>> from vrammath.model.presets import load_model
    >>> from vrammath.compose.setup import Setup
    >>> busiest_rank(Setup(load_model("mixtral-8x7b"), gpus=8, pp=4, ep=8, zero=1)).stages
    (3,)
    """
    layout = setup_layout(setup)
    check_layout(setup.model, layout)
    rank, _ = layout_state_bytes(setup.model, layout, setup.recipe, setup.optimizer)
    return rank


def rank_values(setup: Setup, rank: RankParams) -> dict[sympy.Symbol, int]:
    """``P``, ``P_e`` and ``n_ep`` of the busiest rank, so that the state rows of
    :data:`vrammath.compose.table.TERMS` (``P`` unsharded, ``P - P_e + P_e / n_ep`` under expert
    parallelism, ``P / (c N_d)`` once sharded, :func:`stage_copies`) give
    :func:`~vrammath.terms.moe.layout.layout_state_bytes`.

    Explanation
    ===========

    ``P`` is the rank's stages before expert parallelism (its dense part plus ``e_p`` times its
    local experts) and ``P_e`` their routed experts. A sharded state is ``P / (c N_d)`` on
    :mod:`vrammath.terms.moe.layout`'s rank, ``c`` the stages it holds.

    >>> from vrammath.model.presets import load_model
    >>> from vrammath.compose.setup import Setup
    >>> setup = Setup(load_model("deepseek-v3"), gpus=128, pp=16, ep=64, zero=1,
    ...               schedule="dualpipe", activation_model="korthikanti")
    >>> values = rank_values(setup, busiest_rank(setup))
    >>> values[P] - values[P_e] + values[P_e] // values[n_ep]
    5343227904
    """
    experts = rank.experts * setup.ep
    out = {P: math.ceil(rank.dense + experts)}
    if setup.model.experts is not None:
        out |= {P_e: math.ceil(experts), n_ep: setup.ep}
    return out


def stage_copies(setup: Setup) -> int:
    """The stages one rank holds, ``c``: 2 under DualPipe (rank ``i`` holds stages ``i`` and
    ``p - 1 - i``, and the ``2 N_d`` ranks holding a stage shard its states together), else 1.
    A sharded row's ``N_d`` becomes ``c N_d``.

    >>> from vrammath.model.presets import load_model
    >>> from vrammath.compose.setup import Setup
    >>> stage_copies(Setup(load_model("deepseek-v3"), gpus=128, pp=16, ep=64, zero=1,
    ...                    schedule="dualpipe", activation_model="korthikanti"))
    2
    """
    return setup_layout(setup).copies


__all__ = ["busiest_rank", "rank_values", "setup_layout", "stage_copies"]
