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

from vrammath.compose.rows import Context
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


def _compute_bytes(ctx: Context) -> int:
    return 4 if ctx.precision == "fp32" else 2


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
    return sympy.Integer(_compute_bytes(ctx) * stage3_gathered(s.model, s.stage3).persistent)


def stage3_held(ctx: Context) -> sympy.Expr | None:
    """Parameters gathered at the loss and through the backward's start: the ones the
    coordinator keeps for their reuse within ``stage3_max_reuse_distance`` elements of the
    trace and the ones it has prefetched for the backward
    (:func:`vrammath.terms.deepspeed3.stage3_gathered`). The first iteration, recording the
    trace, releases every module's parameters after it.
    """
    s = ctx.setup
    if not is_stage3(s) or s.iteration == "first":
        return None
    return sympy.Integer(_compute_bytes(ctx) * stage3_gathered(s.model, s.stage3).held)


def stage3_step(ctx: Context) -> sympy.Expr | None:
    """The step's transients on the largest sub-group of ``sg`` elements: its 16-bit gradient
    partitions flattened (``2 sg``) and cast to fp32 (``4 sg``), then the optimizer's step on the
    fp32 partition beside that fp32 gradient (:func:`vrammath.terms.states.step_temporaries_expr`
    over one tensor of ``sg`` elements). The persistent parameters are released at the step's
    start (``partition_all_parameters``).

    Source: ``stage3.py``, ``DeepSpeedZeroOptimizer_Stage3.step``,
    ``_prepare_fp32_grad_for_sub_group`` and ``_optimizer_step``.
    """
    s = ctx.setup
    if not is_stage3(s):
        return None
    sg = max(stage3_sub_groups(s.model, s.gpus, s.stage3.sub_group_size))
    opt = step_temporaries_expr(
        s.optimizer, s.implementation, ctx.recipe.state, params=sympy.Integer(sg), largest=sg
    )
    return sympy.Max(6 * sg, 4 * sg + opt)


__all__ = [
    "DEEPSPEED_REDUCE_BUCKET",
    "bucket_elements",
    "is_stage3",
    "stage3_grad_partitions",
    "stage3_held",
    "stage3_ipg_bucket",
    "stage3_persistent",
    "stage3_step",
]
