"""The engines' own per-rank rules: what a real training engine keeps on one rank where it
differs from ZeRO's textbook partition.

``Setup.engine`` names the engine. ``hf`` (the default) is the single-process Hugging Face loop,
with ``--zero`` read as DeepSpeed's flat partition (``ceil(P / N_d)`` elements per rank).
``zero1-torch`` is PyTorch's ``ZeroRedundancyOptimizer``: every rank keeps every parameter,
gradient and master copy; only the inner optimizer's states and its step are split, by whole
tensors (:func:`vrammath.terms.parallel.zro_partition`), so the optimizer rows of a rank hold
``P_r`` parameters' states -- the rank's own share, which differs between ranks. ``ddp`` is
PyTorch's ``DistributedDataParallel``: the states of one GPU plus the reducer's gradient buckets
(:func:`ddp_buckets`), resident from construction on. ``megatron`` is Megatron-Core's
``DistributedDataParallel`` with its mixed-precision optimizer
(``Float16OptimizerWithFloat16Params``, not the distributed optimizer): the gradients live in a
contiguous buffer kept from construction (:func:`main_grad_buffer`), fp32 under the
``bf16-megatron`` recipe (``--bf16`` sets ``accumulate_allreduce_grads_in_fp32``), 16-bit under
``bf16-mixed`` (``--grad-reduce-in-bf16``), which the step copies to fp32
(:func:`main_grad_copies`). ``fsdp2`` is PyTorch's ``fully_shard`` applied to every decoder
layer and then to the model, as torchtitan wraps it; ``accelerate-fsdp2`` the same engine as
accelerate 1.15 wraps a model (``fsdp2_prepare_model``). Both cut every tensor on its dim 0
(``--shard dim0``, ZeRO stage 3), read ``MixedPrecisionPolicy`` from the recipe
(:func:`vrammath.compose.rows.state_recipe`), and make the optimizer's states like each rank's
unpadded rows (:func:`vrammath.terms.parallel.dim0_rank_params`); what each keeps gathered is
in :mod:`vrammath.compose.fsdp2`.

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

import sympy

from vrammath.compose.deepspeed3 import DEEPSPEED_REDUCE_BUCKET, is_stage3
from vrammath.compose.deepspeed3 import bucket_elements as _bucket_elements
from vrammath.compose.rows import Context, Group, Term
from vrammath.compose.setup import Setup
from vrammath.model.params import param_count
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError
from vrammath.notation.symbols import N_d, P, P_r
from vrammath.terms.deepspeed3 import stage3_partition
from vrammath.terms.parallel import (
    FSDP2_ENGINES,
    dim0_rank_params,
    flat_kept_gradients,
    flat_padded_params,
    flat_rank_slices,
    module_order_numels,
    tensor_numels,
    zro_partition,
)
from vrammath.terms.states import step_temporaries_expr

#: The groups ``ZeroRedundancyOptimizer`` splits: its inner optimizer's states and the step's
#: temporaries (``step`` runs the inner optimizer on the rank's own parameters only).
ZRO_GROUPS: tuple[Group, ...] = ("optimizer", "temporaries")


@functools.lru_cache(maxsize=256)
def _slices(spec: ModelSpec, world: int) -> list[list[tuple[int, int]]]:
    return flat_rank_slices(module_order_numels(spec), world)


@functools.lru_cache(maxsize=256)
def _shares(engine: str, spec: ModelSpec, world: int) -> tuple[int, ...]:
    """Each rank's share ``P_r`` under an engine whose ranks differ (cached: a fit searches)."""
    if engine == "deepspeed":  # whole gradients of the tensors its flat range touches
        return flat_kept_gradients(module_order_numels(spec), world)
    if engine in FSDP2_ENGINES:  # its unpadded dim-0 rows
        return dim0_rank_params(spec, world)
    return zro_partition(tensor_numels(spec), world)  # whole tensors' optimizer states


#: The field of :class:`vrammath.compose.peak.Groups` each row one phase holds apart from the
#: phase groups fills (``bucket`` from the backward's first gradient hook to its end, ``flush``
#: before the backward's end only, ``epilogue`` at that end in place of the gradients,
#: ``forward`` through the forward alone, ``unshard`` while a layer is gathered in the forward).
PHASE_ROWS = {
    "reduce_bucket": "bucket",
    "bucket_flush": "flush",
    "deepspeed_epilogue": "epilogue",
    "all_gather_kept": "forward",
    "layer_unshard": "unshard",
    "stage3_held": "held",
    "stage3_held_backward": "held_backward",
    "fsdp2_bottom": "bottom",
}

#: The engines whose ranks hold different shares (``P_r``): of whole tensors, or of rows.
RANKED_ENGINES = ("zero1-torch", "deepspeed", *FSDP2_ENGINES)


def counted_rank(setup: Setup) -> tuple[int, int]:
    """The rank an estimate counts and its share ``P_r``: the parameters whose optimizer states
    it owns (``zero1-torch``), whose whole gradients it keeps (``deepspeed``) or whose unpadded
    rows it owns (``fsdp2``); the setup's ``rank``, or the busiest (the lowest index among the
    fullest)."""
    world = setup.gpus
    sizes = _shares(setup.engine, setup.model, world)
    rank = sizes.index(max(sizes)) if setup.rank is None else setup.rank
    return rank, sizes[rank]


def sharded_stage(setup: Setup, term: Term) -> int:
    """The ZeRO stage a row is divided by under the setup's engine: the setup's own, except
    under ``zero1-torch``, which splits only :data:`ZRO_GROUPS` (its masters stay whole: they
    are the parameters the optimizer updates, which every rank keeps), and under ``deepspeed``,
    whose stage 1 keeps the gradients of its share as stage 2 does."""
    if setup.engine == "zero1-torch":
        return setup.zero if term.group in ZRO_GROUPS else 0
    if setup.engine == "deepspeed" and term.key == "gradients":
        return 2
    return setup.zero


def own_share(setup: Setup, term: Term) -> sympy.Expr | None:
    """``P_r`` where a row holds a rank's share of whole tensors instead of ``P / N_d``: every
    split row of ``zero1-torch``; DeepSpeed's gradients, kept whole for every tensor that
    overlaps the rank's flat range (:func:`vrammath.terms.parallel.flat_kept_gradients`); and
    DeepSpeed's other split rows, ``2 ceil(P / (2 N_d))``: its flat buffer is padded to a
    multiple of twice the ranks (``nccl_start_alignment_factor``) before it is cut; FSDP2's
    optimizer rows, made by ``torch.zeros_like`` of the unpadded local shard (its weights and
    gradients are the padded shards, :func:`vrammath.compose.rows.dim0_shard_params`)."""
    if setup.engine == "zero1-torch" or (setup.engine == "deepspeed" and term.key == "gradients"):
        return P_r
    if setup.engine in FSDP2_ENGINES:  # states made like the unpadded shard; shards padded
        return P_r if term.group in ZRO_GROUPS else None
    if is_stage3(setup):  # every tensor cut on its own: ceil(numel / N_d) each
        return sympy.Integer(stage3_partition(setup.model, setup.gpus))
    if setup.engine == "deepspeed":  # the flat buffer is padded to a multiple of 2 N_d
        return flat_padded_params() / N_d
    return None


def ddp_buckets(ctx: Context) -> sympy.Expr | None:
    """DDP's gradient buckets: one flat buffer per bucket in the gradients' dtype, ``P``
    elements in all (``bucket_cap_mb`` splits them, it does not add to them), allocated when
    the model is wrapped and never freed -- ``zero_grad(set_to_none=True)`` drops the ``.grad``
    tensors, not the buckets. The backward copies each gradient into its bucket (or, with
    ``gradient_as_bucket_view``, the gradients *are* views of the buckets and the gradients row
    is not counted again).

    Source: ``torch/nn/parallel/distributed.py``, ``DistributedDataParallel._ddp_init_helper``
    (builds ``dist.Reducer``), and ``torch/csrc/distributed/c10d/reducer.cpp``,
    ``Reducer::initialize_buckets`` (``bucket.gradients = at::empty({offset}, options)``).
    Measured: ``validation/engines.json``, rows ``ddp*``.
    """
    return ctx.model_states["gradients"] if ctx.setup.engine == "ddp" else None


def main_grad_buffer(ctx: Context) -> sympy.Expr | None:
    """Megatron-Core's gradient buffer: every parameter's ``main_grad`` is a view of one
    contiguous buffer in the gradient-reduction dtype (the recipe's gradient bytes: fp32 under
    ``bf16-megatron`` and ``fp32``, 16-bit under ``bf16-mixed`` / ``fp16-mixed``), allocated
    when the model is wrapped and zeroed, never freed, by ``zero_grad_buffer``; the backward
    hook adds each ``.grad`` into it and drops the ``.grad``, so the gradients row is this one.

    Source: ``megatron/core/distributed/param_and_grad_buffer.py``,
    ``_ParamAndGradBuffer.__init__`` (``self.grad_data = torch.zeros(...)``, ``param.main_grad``
    views), and ``megatron/core/distributed/distributed_data_parallel.py``,
    ``DistributedDataParallel._make_backward_post_hook`` (``param.main_grad.add_(param.grad)``;
    ``param.grad = None``). Measured: ``validation/engines.json``, rows ``megatron-main-grad``
    and ``megatron-bf16-grad``.
    """
    return ctx.model_states["gradients"] if ctx.setup.engine == "megatron" else None


def main_grad_copies(ctx: Context) -> sympy.Expr | None:
    """The step's fp32 gradients of a 16-bit buffer: the optimizer sets each master's
    ``.grad`` to ``model_param.main_grad.float()`` -- a new fp32 tensor (4 bytes/param) beside
    the buffer, alive from the step to the next ``zero_grad``; with an fp32 buffer ``.float()``
    returns the buffer itself and nothing is copied.

    Source: ``megatron/core/optimizer/optimizer.py``,
    ``Float16OptimizerWithFloat16Params._copy_model_grads_to_main_grads``.
    """
    s = ctx.setup
    if s.engine != "megatron" or ctx.recipe.gradients == 4 or ctx.recipe.master == 0:
        return None
    return 4 * P


def master_grad_copies(ctx: Context) -> sympy.Expr | None:
    """The step's fp32 gradients on the masters where the loop keeps 16-bit gradients in
    ``.grad`` (no gradient buffer): the optimizer sets each master's ``.grad`` to
    ``model_param.grad.float()`` and drops the 16-bit one, so through the step the gradients
    take 4 bytes/param instead of the recipe's 2. The row is the difference, ``(4 - g) P``,
    every rank's whole (ZeroRedundancyOptimizer partitions the states, not these); under DDP
    with ``gradient_as_bucket_view`` the 16-bit gradients are views of the buckets, which stay,
    so the row is the whole ``4 P``.

    Source: ``megatron/core/optimizer/optimizer.py``,
    ``Float16OptimizerWithFloat16Params._copy_model_grads_to_main_grads``
    (``main_param.grad = model_param.grad.float()``; ``model_param.grad = None``), the master
    copy vrammath's 16-bit recipes follow on the plain loop. Measured:
    ``validation/engines.json``, rows ``megatron-copy``, ``zero1-zro-master``, ``ddp-master``
    and ``ddp-view-master``.
    """
    s = ctx.setup
    if ctx.recipe.master == 0 or ctx.recipe.gradients == 4 or ctx.lora or s.offload_optimizer:
        return None  # no 16-bit gradients to copy (LoRA's adapters are fp32), or a host step
    if s.engine == "ddp" and s.bucket_view:
        return 4 * P  # the 16-bit gradients are views of DDP's buckets: nothing is freed
    if not (s.engine in ("zero1-torch", "ddp") or (s.engine == "hf" and s.zero == 0)):
        return None  # Megatron's own buffer, or a partition that steps its own way
    return (4 - ctx.recipe.gradients) * P


def reduce_bucket(ctx: Context) -> sympy.Expr | None:
    """DeepSpeed ZeRO-1/2's reduce bucket: ``reduce_bucket_size`` elements in the gradients'
    dtype, whatever the model's size, allocated at the backward's first gradient hook and
    released at its end; each gradient is copied into it and reduced from it.

    Source: ``deepspeed/runtime/zero/stage_1_and_2.py``, ``DeepSpeedZeroOptimizer``
    (``reduce_independent_p_g_buckets_and_remove_grads`` fills ``self.ipg_buffer``, made of
    ``reduce_bucket_size`` elements; ``_release_ipg_buffers`` drops it). Measured:
    ``validation/engines.json``, rows ``deepspeed-zero1`` and ``deepspeed-zero2``.
    """
    s = ctx.setup
    if s.engine != "deepspeed" or s.zero == 3:  # stage 3: vrammath.compose.deepspeed3
        return None
    return sympy.Integer(_bucket_elements(s) * ctx.recipe.gradients)


def deepspeed_epilogue(ctx: Context) -> sympy.Expr | None:
    """What DeepSpeed holds at the end of the backward, besides the bucket, where it is more than
    the kept gradients (``G = 2 P_r``; ``B`` the bucket's elements, ``P`` the parameters):

    * ``P <= B``: the flat copy of the bucket's contents the epilogue reduces from
      (``allreduce_bucket``: ``self.flatten(bucket)``), ``2 P``, before ``G`` is made;
    * stage 1, ``P > B``: every parameter's 16-bit ``.grad``, ``2 P``: its hooks only set up the
      bucket (``process_gradients`` reduces at the hook only with ``partition_gradients`` or
      ``overlap_comm``), and the epilogue (``reduce_gradients``) moves the gradients through it;
      after the first flush, ``2 (P - B)`` of them beside ``G``;
    * stage 2, ``P > B``: ``G`` beside the last flush's flat copy, ``2 (P mod B)``.

    Measured: ``validation/engines.json``, rows ``deepspeed-zero*`` and, with a bucket smaller
    than the model, ``deepspeed-zero*-bucket1m``.
    """
    s = ctx.setup
    if s.engine != "deepspeed" or s.zero == 3:  # stage 3: vrammath.compose.deepspeed3
        return None
    width, bucket, params = ctx.recipe.gradients, _bucket_elements(s), param_count(s.model)
    kept = width * P_r
    if params <= bucket:
        return width * P
    if s.zero == 1:
        return sympy.Max(width * P, width * (P - bucket) + kept)
    return kept + width * (params % bucket or bucket)


def bucket_flush(ctx: Context) -> sympy.Expr | None:
    """DeepSpeed ZeRO-2 on a model larger than its bucket: each time the bucket fills during
    the backward it is reduced from a flat copy of its contents (``allreduce_bucket``), a second
    bucket's worth of bytes while the forward's tensors are still alive (stage 1 reduces only
    at the epilogue: :func:`deepspeed_epilogue`)."""
    s = ctx.setup
    if s.engine != "deepspeed" or s.zero != 2 or param_count(s.model) <= _bucket_elements(s):
        return None
    return sympy.Integer(_bucket_elements(s) * ctx.recipe.gradients)


def deepspeed_step(ctx: Context) -> sympy.Expr | None:
    """DeepSpeed ZeRO-1/2's step on one rank, beyond the kept gradients: the largest of three
    moments, with ``ps`` the partition (:func:`vrammath.terms.parallel.flat_padded_params` over
    ``N_d``):

    * the gradient norm: each kept gradient's slice of the partition cast to fp64 in turn
      (``get_grad_norm_direct``; ``get_norm_dtype`` is fp64 where the device has it): 8 bytes
      times the largest slice;
    * the flat fp32 gradient of the partition (``single_grad_partition``, 4 ps) made from the
      slices flattened in 16 bits, a copy (2 ps) unless the partition lies inside one tensor;
    * the optimizer's own step on the one fp32 partition tensor (``step_temporaries_expr`` with
      ``ps`` elements, the largest ``ps``) beside the 4 ps fp32 gradient, after
      ``free_grad_in_param_list`` has dropped the kept gradients (minus ``2 P_r``).

    In the first iteration the optimizer's states are made inside that last moment, so the two
    before it stand without them.

    fp16 runs the same optimizer; its loss scaler's overflow check
    (``has_overflow_partitioned_grads_serial``) adds one slice at a time in fp32, under the
    norm's fp64, so the same rule stands, unmeasured: DeepSpeed's CPU accelerator refuses fp16
    ("Type fp16 is not supported on your device"), and the estimate warns.

    Source: ``deepspeed/runtime/zero/stage_1_and_2.py``, ``DeepSpeedZeroOptimizer.step``,
    ``scaled_global_norm`` and ``get_grad_norm_direct``; ``deepspeed/runtime/zero/utils.py``,
    ``get_norm_dtype``. Measured (bf16): ``validation/engines.json``, rows ``deepspeed-zero*``.
    """
    s = ctx.setup
    if s.engine != "deepspeed" or s.zero == 3:  # stage 3: vrammath.compose.deepspeed3
        return None
    rank = counted_rank(s)[0]
    mine = _slices(s.model, s.gpus)[rank]
    ps = flat_padded_params() / N_d
    opt = step_temporaries_expr(
        s.optimizer, s.implementation, ctx.recipe.state, params=ps, largest=ps
    )
    # the pieces flattened: the slices, and the zero pad of a range reaching into the padding
    padded = sum(n for n, _ in mine) != _shares(s.engine, s.model, s.gpus)[rank]
    copy = 2 * ps if len(mine) + padded > 1 else 0
    kept = ctx.recipe.gradients * P_r
    # the first step makes the optimizer's states inside its own step, after the norm and the
    # flattening: those two moments come before the states the step's total counts
    before = ctx.model_states["optimizer"] / P * ps if ctx.iteration == "first" else 0
    norm, flat = 8 * max(inside for _, inside in mine), 4 * ps + copy
    return sympy.Max(norm - before, flat - before, 4 * ps + opt - kept)


def ddp_note(ctx: Context) -> str:
    """The DDP row's note: whether the gradients are views of the buckets."""
    if ctx.setup.bucket_view:
        return "gradient_as_bucket_view: the gradients are views of these buckets"
    return "resident; the gradients are copied in (gradient_as_bucket_view=False, DDP's default)"


#: The recipes ``--engine megatron`` reads: the buffer's dtype is the recipe's gradient dtype.
MEGATRON_RECIPES = ("bf16-megatron", "bf16-mixed", "fp16-mixed", "fp32")

#: The recipes ``--engine fsdp2`` reads: ``bf16-mixed`` is ``MixedPrecisionPolicy(bf16, fp32)``
#: over an fp32 model, ``fp32`` no policy, ``bf16-pure`` a bf16 model.
FSDP2_RECIPES = ("bf16-mixed", "fp32", "bf16-pure")

#: A refusal: the field, whether the setup trips it, the value it has, what the engine needs.
Refusal = tuple[str, bool, object, str]


def _optimizer_refusal(s: Setup, why: str) -> Refusal:
    """The optimizers whose states are not one tensor per parameter tensor, refused."""
    return ("optimizer", s.optimizer in ("adam8bit", "adafactor"), s.optimizer,
            f"adamw, adam, sgd or sgd-momentum ({why})")  # fmt: skip


def _for_loop_refusal(s: Setup, why: str) -> Refusal:
    """A for-loop AdamW step, whose transients follow one tensor at a time, refused."""
    for_loop = s.implementation == "for-loop" and s.optimizer in ("adamw", "adam")
    return ("implementation", for_loop, s.implementation, f"foreach or fused ({why})")


def check_engine(setup: Setup) -> None:
    """Refuse what an engine's rules do not describe yet, naming the field."""
    s = setup
    if s.engine == "hf":
        return
    refusals: tuple[Refusal, ...] = (
        ("lora_rank", s.lora_rank is not None, s.lora_rank, "unset (adapters are not modelled)"),
        ("tp/pp", s.tp > 1 or s.pp > 1, (s.tp, s.pp), "1 (data parallelism only)"),
        ("model", s.model.experts is not None, s.model.name, "a dense model (no experts)"),
    )
    if s.engine == "ddp":
        refusals += (
            ("recipe", s.recipe == "bf16-megatron", s.recipe, "not bf16-megatron (own buffer)"),
        )
    elif s.engine == "megatron":
        refusals += (
            ("recipe", s.recipe not in MEGATRON_RECIPES, s.recipe,
             "one of " + ", ".join(MEGATRON_RECIPES) + " (Megatron's optimizers keep fp32 "
             "masters or run in fp32)"),
            _optimizer_refusal(s, "Megatron-Core's optimizers"),
            ("offload_optimizer", s.offload_optimizer or s.offload_params, True,
             "false (Megatron offloads only with its distributed optimizer, not modelled)"),
        )  # fmt: skip
    elif s.engine == "deepspeed":
        refusals += (
            ("recipe", s.recipe not in ("bf16-mixed", "fp16-mixed"), s.recipe,
             "bf16-mixed or fp16-mixed (16-bit weights and gradients, fp32 masters: its "
             "ZeRO optimizers)"),
            _optimizer_refusal(s, "stepped on one flat fp32 partition"),
            ("offload_optimizer", (s.offload_optimizer or s.offload_params) and s.zero < 3,
             True, "false below stage 3 (ZeRO-Offload's stage 1-2 buffers are not modelled)"),
            ("shard", s.shard != "flat", s.shard, "flat (DeepSpeed's flat buffer)"),
        )  # fmt: skip
    elif s.engine in FSDP2_ENGINES:
        accelerate = s.engine == "accelerate-fsdp2"
        embeddings = s.model.embeddings
        refusals += (
            (
                "model",
                accelerate and (embeddings.tied or embeddings.learned_positions),
                s.model.name,
                "a model with untied embeddings and no learned positions (tied "
                "embeddings in accelerate's tail unit, which torch 2.13 refuses in the wrap "
                "replicated here, and positions left to its root are not modelled)",
            ),
        )
        refusals += (
            ("recipe", s.recipe not in FSDP2_RECIPES, s.recipe,
             "one of " + ", ".join(FSDP2_RECIPES) + " (MixedPrecisionPolicy: bf16 compute over "
             "fp32 shards, fp32 throughout, or a bf16 model)"),
            _optimizer_refusal(s, "states made like each shard"),
            _for_loop_refusal(s, "a for-loop step follows one shard at a time"),
            ("offload_optimizer", s.offload_optimizer != s.offload_params, s.offload_optimizer,
             "the same as offload_params (CPUOffloadPolicy moves every shard, parameters, "
             "gradients and optimizer states, to the host)"),
        )  # fmt: skip
    else:  # zero1-torch: its step runs the inner optimizer on whole tensors
        refusals += (
            _optimizer_refusal(s, "states shaped by the tensors it gets"),
            _for_loop_refusal(s, "a for-loop step follows the largest tensor"),
            ("offload_optimizer", s.offload_optimizer, True, "false (it does not offload)"),
            ("shard", s.shard != "flat", s.shard, "flat (the engine assigns whole tensors)"),
        )  # fmt: skip
    for field, refused, got, allowed in refusals:
        if refused:
            raise InputError(field, f"with --engine {s.engine} must be {allowed}", got=got)


__all__ = [
    "DEEPSPEED_REDUCE_BUCKET",
    "FSDP2_RECIPES",
    "MEGATRON_RECIPES",
    "PHASE_ROWS",
    "RANKED_ENGINES",
    "ZRO_GROUPS",
    "bucket_flush",
    "check_engine",
    "counted_rank",
    "ddp_buckets",
    "ddp_note",
    "deepspeed_epilogue",
    "deepspeed_step",
    "main_grad_buffer",
    "main_grad_copies",
    "master_grad_copies",
    "own_share",
    "reduce_bucket",
    "sharded_stage",
]
