"""FSDP2's own per-rank rows: what ``fully_shard`` keeps gathered and in flight, under the two
ways a Hugging Face decoder is wrapped (``Setup.engine``): ``fsdp2``, as torchtitan wraps it
(every decoder layer, then the model, whose root unit keeps the embeddings, the final norm and
the head), and ``accelerate-fsdp2``, as accelerate 1.15's ``fsdp2_prepare_model`` does (every
decoder layer, the input embedding, ``[final norm, head]`` not resharded after forward, then the
model). The states' split is :func:`vrammath.compose.rows.state_recipe`'s and the ranks' rows
:func:`vrammath.terms.parallel.dim0_rank_params`' (through
:func:`vrammath.compose.engines.own_share`).

Measured: ``validation/engines.json``, rows ``zero3-fsdp``, ``zero2-fsdp``, ``offload-fsdp`` and
``accel-fsdp*`` (FSDPMemTracker on 8 fake ranks).
"""

from __future__ import annotations

import sympy

from vrammath.compose.rows import Context
from vrammath.compose.setup import Setup
from vrammath.notation.symbols import N_d
from vrammath.terms.parallel import FSDP2_ENGINES, FsdpUnit, dim0_unit_params


def _gathered_bytes(ctx: Context) -> int:
    """Bytes per gathered element: ``MixedPrecisionPolicy.param_dtype`` (the compute dtype)."""
    return 4 if ctx.precision == "fp32" else 2


def _kept_unit(setup: Setup) -> FsdpUnit:
    """The unit not resharded after forward: the root (torchtitan's wrap, where the root holds
    the embeddings, the final norm and the head) or accelerate's tail (the final norm and the
    head, ``fully_shard([norm, lm_head], reshard_after_forward=False)``)."""
    return "root" if setup.engine == "fsdp2" else "tail"


def fsdp2_unsharded(ctx: Context) -> sympy.Expr | None:
    """FSDP2's unsharded parameters alive through forward and backward, in ``param_dtype``:
    the unit not resharded after forward (torchtitan's root, which FSDP2 does not reshard since
    the backward would gather it at once; accelerate's tail, which it asks not to); with
    ``reshard_after_forward=False`` every parameter's, until the post-backward reshards them.
    Each is ``N_d`` padded shards (:func:`vrammath.terms.parallel.dim0_unit_params`).

    Source: ``torch/distributed/fsdp/_fully_shard/_fsdp_state.py``, ``FSDPState._lazy_init``
    (the root's ``post_forward_mesh_info = None``), ``_fsdp_param_group.py``,
    ``FSDPParamGroup.post_backward`` (``reshard``), and accelerate 1.15's
    ``accelerate/utils/fsdp_utils.py``, ``fsdp2_prepare_model``. Measured:
    ``validation/engines.json``, rows ``zero3-fsdp``, ``zero2-fsdp``, ``offload-fsdp``,
    ``accel-fsdp*``.
    """
    s = ctx.setup
    if s.engine not in FSDP2_ENGINES:
        return None
    unit: FsdpUnit = "all" if s.no_reshard else _kept_unit(s)
    return _gathered_bytes(ctx) * dim0_unit_params(s.model, unit)


def _last_all_gather(ctx: Context) -> sympy.Expr | None:
    """The forward's last all-gather output, in ``param_dtype``: FSDP2 keeps the last
    all-gather's result (``AllGatherState``) until the next one is waited on. Under torchtitan's
    wrap the last is a decoder layer's; under accelerate's, the tail's, gathered at the end.

    Source: ``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py``,
    ``FSDPParamGroup.wait_for_unshard`` (``self.comm_ctx.all_gather_state``).
    """
    s = ctx.setup
    if s.engine not in FSDP2_ENGINES:
        return None
    unit: FsdpUnit = "layer" if s.engine == "fsdp2" else "tail"
    return _gathered_bytes(ctx) * dim0_unit_params(s.model, unit)


def fsdp2_unsharded_note(ctx: Context) -> str:
    """The note of :func:`fsdp2_unsharded`: which unit it holds."""
    if ctx.setup.no_reshard:
        return "every module's (reshard_after_forward=False), param_dtype"
    if ctx.setup.engine == "fsdp2":
        return "the root module's (embeddings, final norm, head), param_dtype"
    return "accelerate's tail unit (final norm, head), param_dtype"


def last_all_gather_label(ctx: Context) -> str:
    """The label of the kept all-gather output: a layer's, or accelerate's tail's."""
    unit = "one layer" if ctx.setup.engine == "fsdp2" else "the tail unit"
    return f"all-gather output, {unit} (FSDP2)"


def fsdp2_all_gather_resharded(ctx: Context) -> sympy.Expr | None:
    """The last all-gather output through forward and backward: torchtitan's wrap with its
    layers resharded, where after the forward's last layer the backward's prefetch gathers one
    in its turn (measured at the backward's start)."""
    s = ctx.setup
    return _last_all_gather(ctx) if s.engine == "fsdp2" and not s.no_reshard else None


def fsdp2_all_gather_kept(ctx: Context) -> sympy.Expr | None:
    """The last all-gather output through the forward alone: accelerate's tail (the backward
    starts with none in flight), or torchtitan's last layer when nothing reshards (the
    backward gathers nothing)."""
    s = ctx.setup
    return _last_all_gather(ctx) if s.engine != "fsdp2" or s.no_reshard else None


def fsdp2_layer_unshard(ctx: Context) -> sympy.Expr | None:
    """Everything gathered while a decoder layer is gathered in the forward: the previous
    layer's kept all-gather output, the new one and the layer's unsharded parameters copied out
    of it -- three layers' ``param_dtype`` bytes -- beside torchtitan's root (accelerate's tail
    is gathered only at the end), before that layer's activations exist (the forward's peak at
    7B).

    Source: ``FSDPParamGroup.unshard`` and ``wait_for_unshard``
    (``foreach_all_gather_copy_out``, ``init_unsharded_param``). Measured:
    ``validation/engines.json``, rows ``zero3-fsdp/llama-7b`` and ``accel-fsdp/llama-7b``.
    """
    s = ctx.setup
    if s.engine not in FSDP2_ENGINES or s.no_reshard:
        return None
    root = dim0_unit_params(s.model, "root") if s.engine == "fsdp2" else 0
    return _gathered_bytes(ctx) * (3 * dim0_unit_params(s.model, "layer") + root)


def fsdp2_reduce(ctx: Context) -> sympy.Expr | None:
    """FSDP2's reduce-scatter of one unit in the backward: the unit's unsharded gradients in
    ``param_dtype`` and the padded reduce-scatter input they are copied into in
    ``reduce_dtype`` (torchtitan's: the gradient shards' dtype; accelerate's: ``param_dtype``),
    for the larger unit (a layer or the root).

    Source: ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``, ``foreach_reduce``
    (``reduce_scatter_input = torch.empty(...)``, ``foreach_reduce_scatter_copy_in``).
    """
    s = ctx.setup
    if s.engine not in FSDP2_ENGINES:
        return None
    unit = sympy.Max(dim0_unit_params(s.model, "layer"), dim0_unit_params(s.model, "root"))
    reduce = ctx.recipe.gradients if s.engine == "fsdp2" else _gathered_bytes(ctx)
    return (_gathered_bytes(ctx) + reduce) * unit


def fsdp2_bottom_layers(ctx: Context) -> sympy.Expr | None:
    """accelerate's FSDP2 wrap at the backward of the second-lowest decoder layer, as a change
    to the end of the backward: that layer's unsharded parameters, the lowest layer's prefetched
    all-gather output, the layer's unsharded gradients and their reduce-scatter input (four
    layers' ``param_dtype`` bytes, accelerate reducing in ``param_dtype``) are alive where the
    gradient shards of the input embedding (its own unit, reduced last) and of the two lowest
    layers are not yet. The phase model adds the lowest layer's activations; the moment outweighs
    the backward's end where a layer is large against the head (0.19 GB at 7B).

    Source: ``FSDPParamGroup.pre_backward`` (the backward prefetch), ``post_backward``
    (``foreach_reduce``), accelerate 1.15's ``fsdp2_prepare_model`` (the embedding's own
    ``fully_shard``). Measured: ``validation/engines.json``, row ``accel-fsdp/llama-7b``.
    """
    s = ctx.setup
    if s.engine != "accelerate-fsdp2" or s.no_reshard:
        return None
    layer = dim0_unit_params(s.model, "layer")
    pending = s.model.vocab * s.model.hidden + 2 * layer  # their gradient shards, not yet made
    return 4 * _gathered_bytes(ctx) * layer - ctx.recipe.gradients * pending / N_d


__all__ = [
    "fsdp2_all_gather_kept",
    "fsdp2_all_gather_resharded",
    "fsdp2_bottom_layers",
    "fsdp2_layer_unshard",
    "fsdp2_reduce",
    "fsdp2_unsharded",
    "fsdp2_unsharded_note",
    "last_all_gather_label",
]
