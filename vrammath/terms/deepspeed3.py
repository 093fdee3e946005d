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

#: A decoder layer's modules in the order the coordinator's trace meets them in the forward
#: (transformers' LLaMA family): the layer, its containers (attention, MLP, the activation
#: module) and its leaves; a leaf the model lacks (q_norm and k_norm are Qwen3's) is skipped.
LAYER_FORWARD = (
    "", "input_layernorm", "self_attn", "self_attn.q_proj", "self_attn.q_norm",
    "self_attn.k_proj", "self_attn.k_norm", "self_attn.v_proj", "self_attn.o_proj",
    "post_attention_layernorm", "mlp", "mlp.gate_proj", "mlp.act_fn", "mlp.up_proj",
    "mlp.down_proj",
)  # fmt: skip

#: The same layer in the backward's trace, as DeepSpeed 0.19.8 records it on these models, the
#: MLP first (down, up, activation, gate), then the attention (output, v, k, q), the input
#: norm last.
LAYER_BACKWARD = (
    "", "mlp", "mlp.down_proj", "mlp.up_proj", "mlp.act_fn", "mlp.gate_proj",
    "post_attention_layernorm", "self_attn", "self_attn.o_proj", "self_attn.v_proj",
    "self_attn.k_norm", "self_attn.k_proj", "self_attn.q_norm", "self_attn.q_proj",
    "input_layernorm",
)  # fmt: skip

#: Modules without parameters of their own, in every layer: in the trace all the same.
_CONTAINERS = frozenset({"", "self_attn", "mlp", "mlp.act_fn"})


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
    through forward and backward; ``held`` besides them at the forward's end (the loss) -- the
    parameters the coordinator keeps for their reuse and the ones it has prefetched -- and
    ``backward`` at the backward's start, after the root module's pre-backward hook has
    prefetched again."""

    persistent: int
    held: int
    backward: int


Module = list[tuple[str, int]]
"""One entry of the trace: a module's own parameters, (name, elements); [] for a container."""


def _trace(spec: ModelSpec, recompute: bool = False) -> tuple[list[Module], list[Module]]:
    """The coordinator's module trace, forward and backward, each module's own parameters (a
    tied head's is the embedding's). With full recomputation (transformers' non-reentrant
    checkpoint of each layer) a layer's backward meets its MLP's output projection, then the
    layer's forward again (its modules, not the layer itself), then the rest of its backward."""
    values = {k: sympy.Integer(v) for k, v in size_values(spec).items()}
    mods: dict[str, Module] = {}
    for t in tensors(spec):
        module = t.name.rsplit(".", 1)[0] if t.name.endswith((".weight", ".bias")) else t.name
        n = int(t.numel.xreplace(values))
        if t.count != 1 and module not in LAYER_FORWARD:
            raise InputError(
                "model",
                f"with DeepSpeed ZeRO-3 needs a decoder whose modules' order is modelled "
                f"(LLaMA-family names; {module} is not)",
                got=spec.name,
            )
        if t.count == 1 and t.component not in ("embedding", "head", "norms"):
            raise InputError(
                "model", f"with DeepSpeed ZeRO-3 has a module not modelled ({module})", spec.name
            )
        mods.setdefault(module, []).append((t.name, n))
    embed = mods.pop("embed_tokens")
    head = mods.pop("lm_head", list(embed))  # tied: the embedding's parameter
    norm = mods.pop("norm")

    def layer(i: int, order: tuple[str, ...]) -> list[Module]:
        return [
            [] if m in _CONTAINERS else [(f"{i}.{name}", n) for name, n in mods[m]]
            for m in order
            if m in _CONTAINERS or m in mods
        ]

    forward: list[Module] = [[], [], embed, []]  # the root, the model, the embedding, rotary
    for i in range(spec.layers):
        forward += layer(i, LAYER_FORWARD)
    forward += [norm, head]
    backward: list[Module] = [[], head, [], norm]  # the root, the head, the model, the norm
    for i in reversed(range(spec.layers)):
        if recompute:  # the first hook fires, then the checkpoint recomputes the layer
            backward += layer(i, LAYER_BACKWARD[:3]) + layer(i, LAYER_FORWARD[1:])
            backward += layer(i, LAYER_BACKWARD[3:])
        else:
            backward += layer(i, LAYER_BACKWARD)
    return forward, [*backward, embed]


@functools.lru_cache(maxsize=64)
def stage3_gathered(spec: ModelSpec, knobs: Stage3Knobs, recompute: bool = False) -> Stage3Gathered:
    """Replay the coordinator over one steady iteration (forward, then backward; ``recompute``:
    each layer checkpointed) and return what is gathered at the loss.

    Source: ``partitioned_param_coordinator.py``, ``fetch_sub_module`` (fetch, then pop the
    module's own entries from the parameter queue, then prefetch while fewer than
    ``min(max_live - available, prefetch_bucket)`` elements are in flight) and
    ``__params_to_release`` (not persistent, not already fetched for a later step, not met again
    within ``max_reuse_distance`` elements of the trace). Measured: ``validation/engines.json``,
    rows ``deepspeed-zero3*``.
    """
    forward, backward = _trace(spec, recompute)
    trace = forward + backward
    numel = {pid: n for module in forward for pid, n in module}
    persist = {pid for pid, n in numel.items() if n <= knobs.param_persistence_threshold}
    queue = [(pid, step) for step, module in enumerate(trace) for pid, _ in module]
    head = 0  # the queue's front
    available: set[str] = set()
    n_available = 0
    recent: dict[str, int] = {}
    held = at_backward = 0
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
        if step == len(forward) - 1:  # the head's post-forward: the loss comes next
            held = sum(numel[pid] for pid in available)
        if step == len(forward):  # the root's pre-backward, before the logits' gradients
            at_backward = sum(numel[pid] for pid in available)
    return Stage3Gathered(sum(numel[p] for p in persist), held, at_backward)


def stage3_partition(spec: ModelSpec, world: int) -> int:
    """Elements of one rank's partition: ``ceil(numel / N_d)`` of every parameter tensor
    (``partition_numel``), each tensor once.

    >>> from vrammath.model.presets import load_model
    >>> stage3_partition(load_model("llama-7b"), 8)
    842301952
    """
    forward, _ = _trace(spec)
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
    "LAYER_BACKWARD",
    "LAYER_FORWARD",
    "Stage3Gathered",
    "Stage3Knobs",
    "stage3_gathered",
    "stage3_partition",
    "stage3_sub_groups",
]
