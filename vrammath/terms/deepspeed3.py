"""DeepSpeed ZeRO-3 on one rank: how its partitions are cut, which parameters its coordinator
keeps gathered, and how its step walks the partition.

Stage 3 partitions every parameter on its own (``partition_numel``: ``ceil(numel / N_d)``
elements per rank, ``deepspeed/runtime/zero/partition_parameters.py``), so a rank's flat
buffers hold :func:`stage3_partition` elements, not ``P / N_d``.

The parameter coordinator (``deepspeed/runtime/zero/partitioned_param_coordinator.py``,
``PartitionedParameterCoordinator``) gathers a module's parameters in its pre-forward and
pre-backward hooks and releases them in its post hooks. The first iteration records the order
of the modules (the trace) and releases every parameter after its module; from the second on,
with the trace complete, it prefetches ahead (``stage3_prefetch_bucket_size`` elements, no more
than ``stage3_max_live_parameters`` gathered) and does not release a parameter that comes back
within ``stage3_max_reuse_distance`` elements of the trace. Parameters of at most
``stage3_param_persistence_threshold`` elements are persistent: gathered once, after the first
step, and kept (released at each step's start, ``partition_all_parameters``, and gathered again
at its end, ``_post_step``). :func:`stage3_gathered` replays the coordinator over a model's
module trace. Its prefetch budget is counted per fetch (``stage3_prefetch_bucket_size`` new
elements each time), so from the second iteration on the gathered set grows until
``stage3_max_live_parameters`` stops it: on LLaMA-7B it holds about that many elements at the
loss.

>>> from vrammath.model.presets import load_model
>>> held = stage3_gathered(load_model("llama-7b"), Stage3Knobs())
>>> held.persistent, held.held
(266240, 1030750208)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import sympy

from vrammath.model.params import size_values, tensors
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError
from vrammath.terms.parallel import module_order_numels

#: A decoder layer's modules in the order its forward runs them (transformers' LLaMA family);
#: the backward runs them in reverse (the trace shows v, k, q and down, up, gate).
LAYER_FORWARD_ORDER = (
    "input_layernorm",
    "self_attn.q_proj",
    "self_attn.q_norm",
    "self_attn.k_proj",
    "self_attn.k_norm",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "post_attention_layernorm",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


@dataclass(frozen=True)
class Stage3Knobs:
    """The ``zero_optimization`` keys of stage 3 that decide what is gathered, at DeepSpeed's
    defaults (``deepspeed/runtime/zero/config.py``, ``DeepSpeedZeroConfig``)."""

    prefetch_bucket_size: int = 50_000_000
    max_live_parameters: int = 1_000_000_000
    max_reuse_distance: int = 1_000_000_000
    param_persistence_threshold: int = 100_000
    sub_group_size: int = 1_000_000_000


#: DeepSpeed's defaults (a setup without a DeepSpeed config).
DEFAULT_STAGE3 = Stage3Knobs()


@dataclass(frozen=True)
class Stage3Gathered:
    """Elements a rank holds gathered (full, 16-bit) in the steady state: ``persistent``
    through forward and backward; ``held`` besides them from the forward's end (the loss)
    through the backward's start -- the parameters the coordinator keeps for their reuse and
    the ones it has prefetched for the backward."""

    persistent: int
    held: int


def _module_params(spec: ModelSpec) -> list[list[tuple[str, int]]]:
    """The forward's modules, each a list of (parameter name, elements); a tied head's is the
    embedding's parameter."""
    values = {k: sympy.Integer(v) for k, v in size_values(spec).items()}
    first: dict[str, list[tuple[str, int]]] = {}
    layer: dict[str, list[tuple[str, int]]] = {}
    last: dict[str, list[tuple[str, int]]] = {}
    for t in tensors(spec):
        module = t.name.rsplit(".", 1)[0] if t.name.endswith((".weight", ".bias")) else t.name
        n = int(t.numel.xreplace(values))
        if t.component in ("embedding", "positions"):
            first.setdefault(module, []).append((t.name, n))
        elif t.count == 1:
            last.setdefault(module, []).append((t.name, n))
        elif module in LAYER_FORWARD_ORDER:
            layer.setdefault(module, []).append((t.name, n))
        else:
            raise InputError(
                "model",
                f"with DeepSpeed ZeRO-3 needs a decoder whose modules' order is modelled "
                f"(LLaMA-family names; {module} is not)",
                got=spec.name,
            )
    modules = list(first.values())
    ordered = [m for m in LAYER_FORWARD_ORDER if m in layer]
    for i in range(spec.layers):
        modules += [[(f"{i}.{name}", n) for name, n in layer[m]] for m in ordered]
    modules += [last[m] for m in sorted(last, key=lambda m: m != "norm")]  # norm, then head
    if spec.tied_embeddings:  # lm_head's weight is the embedding's
        modules.append(list(modules[0]))
    return modules


@functools.lru_cache(maxsize=64)
def stage3_gathered(spec: ModelSpec, knobs: Stage3Knobs) -> Stage3Gathered:
    """Replay the coordinator over one steady iteration (forward, then backward) and return
    what is gathered at the loss.

    Source: ``partitioned_param_coordinator.py``, ``fetch_sub_module`` (fetch, then pop the
    module's own entries from the parameter queue, then prefetch while fewer than
    ``min(max_live - available, prefetch_bucket)`` elements are in flight) and
    ``__params_to_release`` (not persistent, not already fetched for a later step, not met again
    within ``max_reuse_distance`` elements of the trace). Measured: ``validation/engines.json``,
    rows ``deepspeed-zero3*``.
    """
    forward = _module_params(spec)
    trace = forward + forward[::-1]
    numel = {pid: n for module in forward for pid, n in module}
    persist = {pid for pid, n in numel.items() if n <= knobs.param_persistence_threshold}
    queue = [(pid, step) for step, module in enumerate(trace) for pid, _ in module]
    head = 0  # the queue's front
    available: set[str] = set()
    n_available = 0
    recent: dict[str, int] = {}
    held = 0
    for step, module in enumerate(trace):
        mine = {pid for pid, _ in module}
        for pid in mine - available - persist:
            available.add(pid)
            n_available += numel[pid]
        pending = {pid for pid in mine if recent.get(pid, -(10**18)) < step}
        popped: set[str] = set()
        while head < len(queue) and len(popped) < len(pending):
            pid, last_use = queue[head]
            head += 1
            recent[pid] = last_use
            popped.add(pid)
        budget = min(knobs.max_live_parameters - n_available, knobs.prefetch_bucket_size)
        prefetched = 0
        while head < len(queue) and prefetched < budget:
            pid, last_use = queue[head]
            head += 1
            recent[pid] = max(recent.get(pid, -(10**18)), last_use)
            if pid not in available and pid not in persist:
                available.add(pid)
                prefetched += numel[pid]
        n_available += prefetched
        # the post hook: the step counter has moved past this module
        release = {pid for pid in mine - persist if recent.get(pid, -(10**18)) <= step + 1}
        traversed = 0
        for later in trace[step + 1 :]:
            if traversed >= knobs.max_reuse_distance:
                break
            for pid, n in later:
                release.discard(pid)
                traversed += n
        for pid in release & available:
            available.discard(pid)
            n_available -= numel[pid]
        if step == len(forward) - 1:
            held = sum(numel[pid] for pid in available)
    return Stage3Gathered(sum(numel[p] for p in persist), held)


def stage3_partition(spec: ModelSpec, world: int) -> int:
    """Elements of one rank's partition: ``ceil(numel / N_d)`` of every parameter tensor
    (``partition_numel``), each tensor once.

    >>> from vrammath.model.presets import load_model
    >>> stage3_partition(load_model("llama-7b"), 8)
    842301952
    """
    forward = _module_params(spec)
    seen = {pid: n for module in forward for pid, n in module}
    return sum(-(-n // world) for n in seen.values())


def stage3_sub_groups(spec: ModelSpec, world: int, sub_group_size: int) -> list[int]:
    """The partition's sub-groups the step walks one at a time, in elements: parameters in
    ``model.parameters()`` order accumulate until a group reaches ``sub_group_size``
    (``DeepSpeedZeroOptimizer_Stage3._create_fp16_sub_groups``)."""
    parts = [-(-n // world) for n in module_order_numels(spec)]
    if sum(parts) <= sub_group_size:
        return [sum(parts)]
    groups, size = [], 0
    for part in parts:
        size += part
        if size >= sub_group_size:
            groups.append(size)
            size = 0
    return groups + ([size] if size else [])


__all__ = [
    "DEFAULT_STAGE3",
    "LAYER_FORWARD_ORDER",
    "Stage3Gathered",
    "Stage3Knobs",
    "stage3_gathered",
    "stage3_partition",
    "stage3_sub_groups",
]
