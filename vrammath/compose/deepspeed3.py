"""DeepSpeed ZeRO-3's own per-rank rows (``--engine deepspeed --zero 3``): the buffers its
optimizer allocates when the engine is built, the parameters its coordinator keeps gathered
(:mod:`vrammath.terms.deepspeed3`) and its step's transients. Its weights, master copy and
optimizer states are the rank's partition, :func:`vrammath.terms.deepspeed3.stage3_partition`
elements each (through :func:`vrammath.compose.engines.own_share`).

Source: DeepSpeed 0.19.8, ``deepspeed/runtime/zero/stage3.py``,
``DeepSpeedZeroOptimizer_Stage3``. Measured: ``validation/engines.json``, rows
``deepspeed-zero3*`` (DeepSpeed's engine on real CPU tensors, fake ranks).
"""

from __future__ import annotations

import sympy

from vrammath.compose.rows import Context, Term
from vrammath.compose.setup import Setup
from vrammath.terms.deepspeed3 import (
    stage3_gathered,
    stage3_partition,
    stage3_sub_groups,
)
from vrammath.terms.states import step_temporaries_expr

#: DeepSpeed's default ``reduce_bucket_size`` (elements), ``deepspeed/runtime/zero/config.py``.
DEEPSPEED_REDUCE_BUCKET = 500_000_000


def is_stage3(setup: Setup) -> bool:
    """Whether the setup is DeepSpeed's ZeRO-3 engine."""
    return setup.engine == "deepspeed" and setup.zero == 3


def bucket_elements(setup: Setup) -> int:
    """``reduce_bucket_size``: the setup's, or DeepSpeed's default."""
    return DEEPSPEED_REDUCE_BUCKET if setup.reduce_bucket_size is None else setup.reduce_bucket_size


def stage3_grad_partitions(ctx: Context) -> sympy.Expr | None:
    """The gradients: one flat buffer of the rank's partition in the gradient dtype
    (``grad_partitions_flat_buffer``), allocated and zeroed when the optimizer is built, never
    freed; the backward reduces each bucket into it (``__partition_grads``).

    Source: ``stage3.py``, ``DeepSpeedZeroOptimizer_Stage3.__init__``.
    """
    s = ctx.setup
    if not is_stage3(s) or s.offload_optimizer:
        return None
    return sympy.Integer(ctx.recipe.gradients * stage3_partition(s.model, s.gpus))


def stage3_host_grad_partitions(ctx: Context) -> sympy.Expr | None:
    """With ``offload_optimizer`` the gradient partitions' flat buffer is made on the host
    (``self.device`` is the CPU; pinned with ``pin_memory``), beside CPU Adam's fp32 gradient of
    each sub-group (the ``cpu_gradients`` row, ``subgroup_gradient_buffer``).

    Source: ``stage3.py``, ``DeepSpeedZeroOptimizer_Stage3.__init__`` and
    ``initialize_optimizer_states``.
    """
    s = ctx.setup
    if not is_stage3(s):
        return None
    return sympy.Integer(ctx.recipe.gradients * stage3_partition(s.model, s.gpus))


def stage3_ipg_bucket(ctx: Context) -> sympy.Expr | None:
    """The reduce (IPG) bucket, ``reduce_bucket_size`` elements in the gradient dtype: with
    ``contiguous_gradients`` (the default) allocated when the optimizer is built and never freed;
    each gradient is copied into it and reduced from it.

    Source: ``stage3.py``, ``DeepSpeedZeroOptimizer_Stage3.__init__``
    (``bucket.buffer = torch.empty(self.reduce_bucket_size, ...)``).
    """
    s = ctx.setup
    if not is_stage3(s):
        return None
    return sympy.Integer(ctx.recipe.gradients * bucket_elements(s))


def _gathered_bytes(ctx: Context, which: str) -> sympy.Expr:
    """Bytes of one of :class:`vrammath.terms.deepspeed3.Stage3Gathered`'s counts, in the
    compute dtype."""
    s = ctx.setup
    gathered = stage3_gathered(s.model, s.stage3, s.recompute == "full")
    width = 4 if ctx.precision == "fp32" else 2
    return sympy.Integer(width * int(getattr(gathered, which)))


def stage3_persistent(ctx: Context) -> sympy.Expr | None:
    """Parameters of at most ``stage3_param_persistence_threshold`` elements, whole: gathered
    at the first step's end and kept through every forward and backward after it (released at
    each step's start). The first iteration gathers and releases them with their modules.

    Source: ``parameter_offload.py``, ``DeepSpeedZeRoOffload.mark_persistent_parameters``;
    ``stage3.py``, ``_post_step``.
    """
    s = ctx.setup
    if not is_stage3(s) or s.iteration == "first":
        return None
    return _gathered_bytes(ctx, "persistent")


def stage3_held(ctx: Context) -> sympy.Expr | None:
    """Parameters gathered at the loss, the forward's end: the ones the coordinator keeps for
    their reuse within ``stage3_max_reuse_distance`` elements of the trace and the ones it has
    prefetched for what comes next
    (:func:`vrammath.terms.deepspeed3.stage3_gathered`). The first iteration, recording the
    trace, releases every module's parameters after it.
    """
    s = ctx.setup
    if not is_stage3(s) or s.iteration == "first":
        return None
    return _gathered_bytes(ctx, "held")


def stage3_held_backward(ctx: Context) -> sympy.Expr | None:
    """Parameters gathered at the backward's start, while the logits' gradients are made: what
    was gathered at the loss and what the root module's pre-backward hook has prefetched since
    (:func:`vrammath.terms.deepspeed3.stage3_gathered`); in the first iteration none.
    """
    s = ctx.setup
    if not is_stage3(s) or s.iteration == "first":
        return None
    return _gathered_bytes(ctx, "backward")


def stage3_step(ctx: Context) -> sympy.Expr | None:
    """The step's transients on the largest sub-group of ``sg`` elements: its 16-bit gradient
    partitions flattened (``2 sg``) and cast to fp32 (``4 sg``), then the optimizer's step on the
    fp32 partition beside that fp32 gradient (:func:`vrammath.terms.states.step_temporaries_expr`
    over one tensor of ``sg`` elements). The persistent parameters are released at the step's
    start (``partition_all_parameters``).

    With ``offload_optimizer`` the step runs on the host (CPU Adam over the host's fp32
    partition and gradient; the 16-bit partition is written back with ``copy_``, whose dtype
    conversion PyTorch makes on the CPU side): nothing on the device.

    Source: ``stage3.py``, ``DeepSpeedZeroOptimizer_Stage3.step``,
    ``_prepare_fp32_grad_for_sub_group`` and ``_optimizer_step``.
    """
    s = ctx.setup
    if not is_stage3(s) or s.offload_optimizer:
        return None
    sg = max(stage3_sub_groups(s.model, s.gpus, s.stage3.sub_group_size))
    opt = step_temporaries_expr(
        s.optimizer, s.implementation, ctx.recipe.state, params=sympy.Integer(sg), largest=sg
    )
    return sympy.Max(6 * sg, 4 * sg + opt)


#: DeepSpeed ZeRO-3's resident rows on the device, made with the optimizer (weights group).
STAGE3_STATE_TERMS: tuple[Term, ...] = (
    Term(
        key="stage3_grad_partitions",
        label="gradient partitions (DeepSpeed ZeRO-3)",
        device="gpu",
        builder=stage3_grad_partitions,
        group="weights",  # resident from the optimizer's construction: in every phase
        live="resident",
        note="the gradients: one flat buffer of the rank's partition, zeroed, never freed",
    ),
    Term(
        key="stage3_ipg_bucket",
        label="DeepSpeed reduce bucket (ZeRO-3)",
        device="gpu",
        builder=stage3_ipg_bucket,
        group="weights",  # resident from the optimizer's construction: in every phase
        live="resident",
        note="reduce_bucket_size elements, allocated with the optimizer, never freed",
    ),
)

#: Its host row under an offloaded optimizer.
STAGE3_HOST_TERMS: tuple[Term, ...] = (
    Term(
        key="stage3_host_grad_partitions",
        label="gradient partitions on the host (DeepSpeed ZeRO-3)",
        device="cpu",
        builder=stage3_host_grad_partitions,
        group="gradients",
        live="resident",
        offload="optimizer",
        note="the partitions' flat buffer, made on the host with an offloaded optimizer",
    ),
)

#: Its rows of a phase or a moment, the gathered parameters and the step's transients.
STAGE3_PHASE_TERMS: tuple[Term, ...] = (
    Term(
        key="stage3_persistent",
        label="persistent parameters (DeepSpeed ZeRO-3)",
        device="gpu",
        builder=stage3_persistent,
        group="in-flight",
        live="forward+backward",
        note="tensors at or under the persistence threshold, kept gathered",
    ),
    Term(
        key="stage3_held",
        label="parameters gathered at the loss (DeepSpeed ZeRO-3)",
        device="gpu",
        builder=stage3_held,
        group="in-flight",
        live="forward+backward",
        note="kept for reuse within the reuse distance, or prefetched",
    ),
    Term(
        key="stage3_held_backward",
        label="parameters gathered at the backward's start (DeepSpeed ZeRO-3)",
        device="gpu",
        builder=stage3_held_backward,
        group="in-flight",
        live="backward",
        note="the loss's set and what the root's pre-backward hook prefetched",
        listed=False,
    ),
    Term(
        key="stage3_step",
        label="DeepSpeed step transients (ZeRO-3)",
        device="gpu",
        builder=stage3_step,
        group="temporaries",
        live="step",
        note="the largest sub-group's gradients flattened and cast to fp32, with the "
        "optimizer's own temporaries",
    ),
)

__all__ = [
    "DEEPSPEED_REDUCE_BUCKET",
    "STAGE3_HOST_TERMS",
    "STAGE3_PHASE_TERMS",
    "STAGE3_STATE_TERMS",
    "bucket_elements",
    "is_stage3",
    "stage3_grad_partitions",
    "stage3_held",
    "stage3_held_backward",
    "stage3_host_grad_partitions",
    "stage3_ipg_bucket",
    "stage3_persistent",
    "stage3_step",
]
