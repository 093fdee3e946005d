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
.. [5] DeepSpeed ``deepspeed/runtime/zero/stage_1_and_2.py``, ``DeepSpeedZeroOptimizer``:
   ``get_partition_info``, ``copy_grads_in_partition`` (DeepSpeed 0.19.8).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence
from typing import Literal, Protocol

import sympy

from vrammath.model.params import size_values, tensors
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError
from vrammath.notation.symbols import K, L, N_d, P

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
#: The FSDP2 engines: ``fully_shard`` as torchtitan wraps a model, and as accelerate does.
FSDP2_ENGINES = ("fsdp2", "accelerate-fsdp2")
ENGINE_STAGES = {"zero1-torch": 1, "ddp": 0, "megatron": 0, **dict.fromkeys(FSDP2_ENGINES, 3)}


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
    @property
    def reduce_bucket_size(self) -> int | None: ...
    @property
    def no_reshard(self) -> bool: ...
    @property
    def shard(self) -> str: ...


def engine_stage(fields: EngineFields) -> int:
    """The ZeRO stage of a setup whose engine fixes one -- ``--zero`` may repeat it or be left
    at 0 (a shorthand), any other stage is refused by name -- after refusing the engines'
    fields where the engine does not read them (``rank``, ``bucket_view``).

    >>> from types import SimpleNamespace as Fields
    >>> fields = dict(gpus=8, rank=None, bucket_view=False, reduce_bucket_size=None, no_reshard=False)
    >>> engine_stage(Fields(engine="zero1-torch", zero=0, **fields))
    1
    >>> engine_stage(Fields(engine="ddp", zero=2, **fields))
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: zero: --engine ddp is ZeRO stage 0 (got 2)
    """
    engine, zero, gpus = fields.engine, fields.zero, fields.gpus
    rank, bucket_view = fields.rank, fields.bucket_view
    if rank is not None and engine not in ("zero1-torch", "deepspeed", *FSDP2_ENGINES):
        raise InputError(
            "rank",
            "is read only where ranks differ (--engine zero1-torch, deepspeed or an FSDP2 one)",
            rank,
        )
    if rank is not None and rank >= gpus:
        raise InputError("rank", f"must be below --gpus ({gpus})", got=rank)
    if bucket_view and engine != "ddp":
        raise InputError("bucket_view", "is read only by --engine ddp", got=bucket_view)
    if fields.reduce_bucket_size is not None and engine != "deepspeed":
        raise InputError(
            "reduce_bucket_size",
            "is read only by --engine deepspeed",
            got=fields.reduce_bucket_size,
        )
    if fields.no_reshard and engine not in FSDP2_ENGINES:
        raise InputError(
            "no_reshard", "is read only by --engine fsdp2 or accelerate-fsdp2", fields.no_reshard
        )
    if engine == "deepspeed":
        if zero == 3 and rank is not None:  # each tensor cut on its own: every rank the same
            raise InputError(
                "rank", "is not read at DeepSpeed's stage 3 (ranks hold the same)", rank
            )
        if zero in (1, 2, 3):
            return zero
        why = "1, 2 or 3 (stage 0 is the plain loop: --engine hf)"
        raise InputError("zero", f"with --engine deepspeed must be {why}", got=zero)
    stage = ENGINE_STAGES.get(engine)
    if stage is None or zero in (0, stage):
        return zero if stage is None else stage
    why = " (its distributed optimizer is not modelled yet)" if engine == "megatron" else ""
    raise InputError("zero", f"--engine {engine} is ZeRO stage {stage}{why}", got=zero)


def engine_shard(fields: EngineFields) -> str:
    """How the setup's states divide: ``dim0`` under an FSDP2 engine over more than one GPU
    (``fully_shard`` cuts every tensor on its dim 0), else the setup's ``shard``, refused as
    ``dim0`` where nothing shards the states (it would change nothing)."""
    shard, zero, gpus = fields.shard, fields.zero, fields.gpus
    if fields.engine in FSDP2_ENGINES and gpus > 1:
        return "dim0"
    if shard != "flat" and zero == 0:
        raise InputError(
            "shard", "is read only where ZeRO/FSDP shards states (--zero 1, 2 or 3)", shard
        )
    if shard != "flat" and gpus == 1:
        raise InputError(
            "shard",
            "is read only where states are sharded over more than one GPU (--gpus 1: one "
            "rank holds every row, as flat does)",
            shard,
        )
    return shard


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


#: The order transformers registers a layer's top modules in, where it is not the attention, the
#: MLP, then the norms: GPT-2's blocks and GPT-NeoX's layers put norms first.
_LAYER_ORDERS = (
    ("ln_1", "attn", "ln_2", "mlp"),  # GPT-2
    ("input_layernorm", "post_attention_layernorm", "attention", "mlp"),  # GPT-NeoX
)


def _layer_order(names: list[str]) -> list[int]:
    """Indices of one layer's tensors in ``model.parameters()`` order: by top module (its
    registration order, ``_LAYER_ORDERS``), then by module in the order listed, each
    module's weight before its bias; Phi-3 registers ``o_proj`` before ``qkv_proj``."""
    paths = [n.rsplit(".", 1)[0] for n in names]
    first = {p: i for i, p in reversed(list(enumerate(paths)))}
    tops = {p.split(".")[0] for p in paths}
    order = next((o for o in _LAYER_ORDERS if tops <= set(o)), ())

    def key(i: int) -> tuple[int, int, int]:
        top, path = paths[i].split(".")[0], paths[i]
        module = -1 if path.endswith("o_proj") and "self_attn.qkv_proj" in paths else first[path]
        return (order.index(top) if order else 0, module, names[i].endswith(".bias"))

    return sorted(range(len(names)), key=key)


def module_order_numels(spec: ModelSpec) -> list[int]:
    """The element count of every parameter tensor in ``model.parameters()`` order: the
    embeddings, each layer's tensors in turn (in transformers' registration order), the final
    norm, the head.
    Flat-buffer engines lay the parameters out in this order, so it decides which tensors
    straddle a rank's partition; ``tests/measure/test_parameter_order.py`` checks it against
    transformers' own order for every dense preset it builds.

    >>> from vrammath.model.presets import load_model
    >>> numels = module_order_numels(load_model("llama-7b"))
    >>> numels[:3], numels[-2:], sum(numels)
    ([131072000, 16777216, 16777216], [4096, 131072000], 6738415616)
    """
    values = {k: sympy.Integer(v) for k, v in size_values(spec).items()}
    head: list[int] = []
    embed: list[int] = []
    layer: list[tuple[str, int]] = []
    once: list[int] = []
    for t in tensors(spec):
        n = int(t.numel.xreplace(values))
        if t.component == "head":
            head.append(n)
        elif t.component in ("embedding", "positions"):
            embed.append(n)
        elif t.count == L:
            layer.append((t.name, n))
        elif t.count == 1:
            once.append(n)
        else:  # experts and other per-kind counts have no single layer order
            raise InputError("model", "has tensors outside a plain layer stack", got=spec.name)
    ordered = [layer[i][1] for i in _layer_order([name for name, _ in layer])]
    return embed + ordered * int(values[L]) + once + head


def flat_padded_params(alignment: int = 2) -> sympy.Expr:
    """The elements of DeepSpeed's flat 16-bit buffer: ``P`` padded to a multiple of
    ``alignment * N_d`` (``flatten_dense_tensors_aligned`` with ``nccl_start_alignment_factor``
    2, reference [5]); each rank's partition is this over ``N_d``.

    >>> flat_padded_params().subs({P: 1695000, N_d: 8})
    1695008
    """
    return alignment * N_d * sympy.ceiling(P / (alignment * N_d))


def flat_rank_slices(
    numels: Sequence[int], world: int, alignment: int = 2
) -> list[list[tuple[int, int]]]:
    """Each rank's share of DeepSpeed ZeRO-1/2's flat buffer, tensor by tensor: for every tensor
    overlapping the rank's range, ``(its whole numel, the elements inside the range)``. The
    buffer (``numels`` in order, padded to a multiple of ``alignment * world``,
    :func:`flat_padded_params`) is cut into ``world`` equal ranges (``get_partition_info``,
    reference [5]), so a tensor straddling two ranges belongs to both.

    >>> flat_rank_slices([10, 3, 3], 2)  # ranges [0, 8) and [8, 16)
    [[(10, 8)], [(10, 2), (3, 3), (3, 3)]]
    """
    ends = list(itertools.accumulate(numels))
    size = -(-ends[-1] // (alignment * world)) * alignment if ends else 0
    out: list[list[tuple[int, int]]] = []
    for r in range(world):
        lo, hi = r * size, (r + 1) * size
        mine = []
        # the first tensor ending past lo, then on while tensors start before hi
        for i in range(bisect.bisect_right(ends, lo), len(ends)):
            start = ends[i] - numels[i]
            if start >= hi:
                break
            inside = min(ends[i], hi) - max(start, lo)
            if inside > 0:
                mine.append((numels[i], inside))
        out.append(mine)
    return out


def flat_kept_gradients(numels: Sequence[int], world: int, alignment: int = 2) -> tuple[int, ...]:
    """Elements of the gradients each rank keeps under DeepSpeed ZeRO-1/2: the whole numel of
    every tensor overlapping its range (:func:`flat_rank_slices`; ``copy_grads_in_partition``
    sizes its buffer so, reference [5]), and on a rank whose range reaches into the buffer's
    padding a zero pad of that many elements (``get_flat_partition``).

    >>> flat_kept_gradients([10, 3, 3], 2)
    (10, 16)
    >>> flat_kept_gradients([10, 3, 2], 2)  # 15 elements padded to 16: rank 1 pads one
    (10, 16)
    """
    size = -(-sum(numels) // (alignment * world)) * alignment
    return tuple(
        sum(n for n, _ in mine) + size - sum(inside for _, inside in mine)
        for mine in flat_rank_slices(numels, world, alignment)
    )


#: The FSDP units :func:`dim0_unit_params` sizes: one decoder layer, the root module (what no
#: layer holds: embeddings, final norm, head), accelerate's tail (what no layer holds but the
#: input embeddings: the final norm and the head), every parameter.
FsdpUnit = Literal["layer", "root", "tail", "all"]


def dim0_unit_params(spec: ModelSpec, unit: FsdpUnit) -> sympy.Expr:
    """Elements of one FSDP2 unit gathered: every tensor's dim 0 padded to a multiple of
    ``N_d`` (``fully_shard`` pads each shard to ``ceil(dim0 / N_d)`` rows; the all-gather output
    and the unsharded parameters are ``N_d`` such shards, ``FSDPParam.init_all_gather_outputs``
    and ``init_unsharded_param`` in ``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``).

    >>> from vrammath.model.presets import load_model
    >>> from vrammath.model.params import size_values
    >>> spec = load_model("gpt2")  # vocabulary 50257: 50264 rows gathered on 8 ranks
    >>> values = {**size_values(spec), N_d: 8}
    >>> [int(dim0_unit_params(spec, u).subs(values)) for u in ("layer", "root")]
    [7087872, 39390720]
    """
    one = sympy.Integer(1)
    total = sympy.Integer(0)
    for t in tensors(spec):
        if (unit == "layer" and t.count != L) or (unit in ("root", "tail") and t.count != one):
            continue
        if unit == "tail" and t.component in ("embedding", "positions"):
            continue
        padded = sympy.ceiling(t.shape[0] / N_d) * N_d * t.numel / t.shape[0]
        total += padded if unit != "all" else t.count * padded
    return total


def dim0_rank_params(spec: ModelSpec, world: int) -> tuple[int, ...]:
    """Elements each rank owns under FSDP2, without the padding: rank ``r`` holds rows
    ``[r c, (r + 1) c)`` of every tensor, ``c = ceil(dim0 / world)`` (``torch.chunk`` on dim 0,
    ``FSDPParam._init_sharded_param``), so the last ranks own fewer, or none of a tensor with
    fewer rows than ranks. The optimizer's states are made like the unpadded shard.

    >>> from vrammath.model.presets import load_model
    >>> numels = dim0_rank_params(load_model("llama-7b"), 7)
    >>> numels[0] > numels[-1], sum(numels)
    (True, 6738415616)
    """
    values = {k: sympy.Integer(v) for k, v in size_values(spec).items()}
    out = [0] * world
    for t in tensors(spec):
        rows = int(t.shape[0].xreplace(values))
        rest = int(t.numel.xreplace(values)) // rows
        count = int(t.count.xreplace(values))
        chunk = -(-rows // world)
        for r in range(world):
            out[r] += count * rest * max(0, min(chunk, rows - r * chunk))
    return tuple(out)


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
    "FSDP2_ENGINES",
    "FSDP_STRATEGIES",
    "STAGES",
    "EngineFields",
    "FsdpUnit",
    "convention_bytes",
    "dim0_rank_params",
    "dim0_unit_params",
    "engine_shard",
    "engine_stage",
    "flat_kept_gradients",
    "flat_padded_params",
    "flat_rank_slices",
    "module_order_numels",
    "tensor_numels",
    "zero_communication_elements",
    "zero_paper_bytes",
    "zero_stage",
    "zro_partition",
]
