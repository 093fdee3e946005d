"""Sharding and parallelism: ZeRO stages 0-3 (and FSDP's names for them), CPU offload, and the
bytes-per-parameter conventions of the estimators people use.

ZeRO partitions the model states over ``N_d`` data-parallel ranks: stage 1 the optimizer states
(master weights included), stage 2 also the gradients, stage 3 also the weights. FSDP's
``NO_SHARD``, ``SHARD_GRAD_OP`` and ``FULL_SHARD`` are stages 0, 2 and 3.

Examples
========

>>> from vrammath.notation.symbols import P, N_d, K
>>> zero_paper_bytes(2)
2*P + P*(K + 2)/N_d
>>> [round(float(zero_paper_bytes(k).subs({P: 7.5e9, N_d: 64, K: 12})) / 1e9, 2) for k in (1, 2, 3)]
[31.41, 16.64, 1.88]

References
==========

.. [1] Rajbhandari et al. 2020, "ZeRO", arXiv:1910.02054, section 5 and Table 1.
.. [2] Ren et al. 2021, "ZeRO-Offload", arXiv:2101.06840.
.. [3] Zhao et al. 2023, "PyTorch FSDP", arXiv:2304.11277.
.. [4] PyTorch ``torch/distributed/optim/zero_redundancy_optimizer.py``,
   ``ZeroRedundancyOptimizer._partition_parameters`` (torch 2.13).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import sympy

from vrammath.model.params import size_values, tensors
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError
from vrammath.notation.symbols import K, N_d, P

STAGES = (0, 1, 2, 3)
FSDP_STRATEGIES = {"NO_SHARD": 0, "SHARD_GRAD_OP": 2, "FULL_SHARD": 3}
CONVENTIONS = ("paper", "deepspeed", "megatron", "megatron-distopt")


def zero_stage(value: int | str) -> int:
    """A ZeRO stage from ``0``-``3`` or an FSDP sharding-strategy name.

    >>> zero_stage("FULL_SHARD"), zero_stage("2")
    (3, 2)
    """
    if isinstance(value, bool):
        raise InputError("zero", "must be 0, 1, 2, 3 or " + ", ".join(FSDP_STRATEGIES), got=value)
    if isinstance(value, int) and value in STAGES:
        return value
    if isinstance(value, str):
        text = value.strip()
        if text in {"0", "1", "2", "3"}:
            return int(text)
        # ASCII only: str.upper() maps "ſ" (long s) to "S" and "ı" to "I"
        if text.isascii() and text.upper() in FSDP_STRATEGIES:
            return FSDP_STRATEGIES[text.upper()]
    raise InputError("zero", "must be 0, 1, 2, 3 or " + ", ".join(FSDP_STRATEGIES), got=value)


def zero_paper_bytes(stage: int) -> sympy.Expr:
    """Per-device model-state bytes exactly as ZeRO's section 5 writes them (2 + 2 + K bytes).

    Stage 0 (plain data parallelism) ``(2 + 2 + K) P``; P_os ``4P + KP/N_d``;
    P_os+g ``2P + (2 + K)P/N_d``; P_os+g+p ``(4 + K)P/N_d``. ``K = 12`` for mixed-precision Adam.
    """
    stage = zero_stage(stage)
    return {
        0: (2 + 2 + K) * P,
        1: 4 * P + K * P / N_d,
        2: 2 * P + (2 + K) * P / N_d,
        3: (4 + K) * P / N_d,
    }[stage]


def zero_communication_elements(stage: int) -> sympy.Expr:
    """Elements each rank sends and receives per step: 2P (all-reduce = reduce-scatter +
    all-gather) for stages 0-2, 3P for stage 3 (parameters gathered in forward and backward)."""
    return 3 * P if zero_stage(stage) == 3 else 2 * P


def convention_bytes(
    convention: str, stage: int = 0, largest_layer: sympy.Expr | None = None
) -> sympy.Expr:
    """Per-GPU model-state bytes under another tool's published convention (Adam, 16-bit).

    * ``paper``: ZeRO's 2 + 2 + 12 (see :func:`zero_paper_bytes`).
    * ``deepspeed``: DeepSpeed's estimators count 18 bytes/parameter of sharded state -- fp16
      gradient 2 + fp32 gradient 4 + fp32 master 4 + Adam 8 -- on top of the fp16 weights: ZeRO-2
      ``2P + 18P/N_d``; ZeRO-3 ``4 * largest_layer + 18P/N_d`` (the gathered largest layer).
    * ``megatron``: Megatron-LM's ``theoretical_memory_usage``: 18 bytes/parameter (bf16 weight
      2, fp32 main_grad 4, fp32 master 4, Adam 8), not sharded.
    * ``megatron-distopt``: with the distributed optimizer, ``6 + 12/N_d``.

    >>> convention_bytes("megatron-distopt")
    6*P + 12*P/N_d
    """
    if convention == "paper":
        return zero_paper_bytes(stage).subs(K, 12)
    if convention == "deepspeed":
        stage = zero_stage(stage)
        if stage == 3:
            if largest_layer is None:
                raise InputError("largest_layer", "is required for DeepSpeed's ZeRO-3 estimate")
            return 4 * largest_layer + 18 * P / N_d
        if stage == 2:
            return 2 * P + 18 * P / N_d
        raise InputError("zero", "DeepSpeed's estimators cover stages 2 and 3", got=stage)
    if convention == "megatron":
        return 18 * P
    if convention == "megatron-distopt":
        return 6 * P + 12 * P / N_d
    raise InputError("convention", "must be one of " + ", ".join(CONVENTIONS), got=convention)


#: The ZeRO stage an engine implies (``--engine ddp`` is plain data parallelism, stage 0).
ENGINE_STAGES = {"zero1-torch": 1, "ddp": 0, "megatron": 0}


class EngineFields(Protocol):
    """The fields of a setup :func:`engine_stage` reads."""

    @property
    def engine(self) -> str: ...
    @property
    def zero(self) -> int: ...
    @property
    def gpus(self) -> int: ...
    @property
    def rank(self) -> int | None: ...
    @property
    def bucket_view(self) -> bool: ...


def engine_stage(fields: EngineFields) -> int:
    """The ZeRO stage of a setup whose engine fixes one -- ``--zero`` may repeat it or be left
    at 0 (a shorthand), any other stage is refused by name -- after refusing the engines'
    fields where the engine does not read them (``rank``, ``bucket_view``).

    >>> from types import SimpleNamespace as Fields
    >>> engine_stage(Fields(engine="zero1-torch", zero=0, gpus=8, rank=None, bucket_view=False))
    1
    >>> engine_stage(Fields(engine="ddp", zero=2, gpus=8, rank=None, bucket_view=False))
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: zero: --engine ddp is ZeRO stage 0 (got 2)
    """
    engine, zero, gpus = fields.engine, fields.zero, fields.gpus
    rank, bucket_view = fields.rank, fields.bucket_view
    if rank is not None and engine != "zero1-torch":
        raise InputError("rank", "is read only where ranks differ (--engine zero1-torch)", rank)
    if rank is not None and rank >= gpus:
        raise InputError("rank", f"must be below --gpus ({gpus})", got=rank)
    if bucket_view and engine != "ddp":
        raise InputError("bucket_view", "is read only by --engine ddp", got=bucket_view)
    stage = ENGINE_STAGES.get(engine)
    if stage is None or zero in (0, stage):
        return zero if stage is None else stage
    why = " (its distributed optimizer is not modelled yet)" if engine == "megatron" else ""
    raise InputError("zero", f"--engine {engine} is ZeRO stage {stage}{why}", got=zero)


def tensor_numels(spec: ModelSpec) -> list[int]:
    """The element count of every parameter tensor of the model, one entry per tensor (a tied
    embedding once), in :func:`vrammath.model.params.tensors`'s order.

    >>> from vrammath.model.presets import load_model
    >>> numels = tensor_numels(load_model("llama-7b"))
    >>> len(numels), max(numels), sum(numels)
    (291, 131072000, 6738415616)
    """
    values = {k: sympy.Integer(v) for k, v in size_values(spec).items()}
    out: list[int] = []
    for t in tensors(spec):
        out += [int(t.numel.xreplace(values))] * int(t.count.xreplace(values))
    return out


def zro_partition(numels: Iterable[int], world: int) -> tuple[int, ...]:
    """Elements whose optimizer states each rank owns under PyTorch's
    ``ZeroRedundancyOptimizer`` (one parameter group): whole tensors, largest first, each to the
    rank with the fewest elements so far, the lowest index on a tie
    (``_partition_parameters`` and ``_get_min_index``, reference [4]). Every rank keeps every
    parameter, gradient and master copy; only the inner optimizer's states and its step are
    split, so a rank holding a large embedding owns more than ``P / N_d``.

    >>> from vrammath.model.presets import load_model
    >>> zro_partition(tensor_numels(load_model("llama-7b")), 8)[:3]
    (850395136, 850395136, 837881856)
    >>> zro_partition([5, 3, 3, 1], 2)
    (6, 6)
    """
    sizes = [0] * world
    for n in sorted(numels, reverse=True):
        sizes[sizes.index(min(sizes))] += n
    return tuple(sizes)


__all__ = [
    "CONVENTIONS",
    "ENGINE_STAGES",
    "FSDP_STRATEGIES",
    "STAGES",
    "EngineFields",
    "convention_bytes",
    "engine_stage",
    "tensor_numels",
    "zero_communication_elements",
    "zero_paper_bytes",
    "zero_stage",
    "zro_partition",
]
