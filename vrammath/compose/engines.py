"""The engines' own per-rank rules: what a real training engine keeps on one rank where it
differs from ZeRO's textbook partition.

``Setup.engine`` names the engine. ``hf`` (the default) is the single-process Hugging Face loop,
with ``--zero`` read as DeepSpeed's flat partition (``ceil(P / N_d)`` elements per rank).
``zero1-torch`` is PyTorch's ``ZeroRedundancyOptimizer``: every rank keeps every parameter,
gradient and master copy; only the inner optimizer's states and its step are split, by whole
tensors (:func:`vrammath.terms.parallel.zro_partition`), so the optimizer rows of a rank hold
``P_r`` parameters' states -- the rank's own share, which differs between ranks.

Examples
========

>>> from vrammath.model.presets import load_model
>>> from vrammath.compose.setup import Setup
>>> setup = Setup(load_model("llama-7b"), recipe="fp32", engine="zero1-torch", gpus=8)
>>> setup.zero, counted_rank(setup)
(1, (0, 850395136))
>>> counted_rank(Setup(load_model("llama-7b"), recipe="fp32", engine="zero1-torch", gpus=8, rank=2))
(2, 837881856)
"""

from __future__ import annotations

import functools

from vrammath.compose.rows import Group, Term
from vrammath.compose.setup import Setup
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError
from vrammath.terms.parallel import tensor_numels, zro_partition

#: The groups ``ZeroRedundancyOptimizer`` splits: its inner optimizer's states and the step's
#: temporaries (``step`` runs the inner optimizer on the rank's own parameters only).
ZRO_GROUPS: tuple[Group, ...] = ("optimizer", "temporaries")


@functools.lru_cache(maxsize=256)
def _partition(spec: ModelSpec, world: int) -> tuple[int, ...]:
    return zro_partition(tensor_numels(spec), world)


def counted_rank(setup: Setup) -> tuple[int, int]:
    """The rank an estimate counts and the parameters whose optimizer states it owns: the
    setup's ``rank``, or the busiest (the lowest index among the fullest)."""
    sizes = _partition(setup.model, setup.gpus)
    rank = sizes.index(max(sizes)) if setup.rank is None else setup.rank
    return rank, sizes[rank]


def sharded_stage(setup: Setup, term: Term) -> int:
    """The ZeRO stage a row is divided by under the setup's engine: the setup's own, except
    under ``zero1-torch``, which splits only :data:`ZRO_GROUPS` (its masters stay whole: they
    are the parameters the optimizer updates, which every rank keeps)."""
    if setup.engine == "zero1-torch":
        return setup.zero if term.group in ZRO_GROUPS else 0
    return setup.zero


def check_engine(setup: Setup) -> None:
    """Refuse what an engine's rules do not describe yet, naming the field."""
    if setup.engine != "zero1-torch":
        return
    s = setup
    refusals = (
        (
            "optimizer",
            s.optimizer in ("adam8bit", "adafactor"),
            s.optimizer,
            "adamw, adam, sgd or sgd-momentum (states shaped by the tensors it gets are not modelled)",
        ),
        (
            "implementation",
            s.implementation == "for-loop" and s.optimizer in ("adamw", "adam"),
            s.implementation,
            "foreach or fused (a for-loop step's temporaries follow the rank's largest tensor)",
        ),
        (
            "offload_optimizer",
            s.offload_optimizer,
            True,
            "false (ZeroRedundancyOptimizer does not offload)",
        ),
        (
            "lora_rank",
            s.lora_rank is not None,
            s.lora_rank,
            "unset (the adapters' partition is not modelled)",
        ),
        ("tp/pp", s.tp > 1 or s.pp > 1, (s.tp, s.pp), "1 (data parallelism only)"),
        (
            "model",
            s.model.experts is not None,
            s.model.name,
            "a dense model (experts are not modelled)",
        ),
        ("shard", s.shard != "flat", s.shard, "flat (the engine assigns whole tensors)"),
    )
    for field, refused, got, allowed in refusals:
        if refused:
            raise InputError(field, f"with --engine zero1-torch must be {allowed}", got=got)


__all__ = ["ZRO_GROUPS", "check_engine", "counted_rank", "sharded_stage"]
