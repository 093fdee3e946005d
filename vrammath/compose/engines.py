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
(:func:`main_grad_copies`).

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

from vrammath.compose.rows import Context, Group, Term
from vrammath.compose.setup import Setup
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError
from vrammath.notation.symbols import P
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


def ddp_note(ctx: Context) -> str:
    """The DDP row's note: whether the gradients are views of the buckets."""
    if ctx.setup.bucket_view:
        return "gradient_as_bucket_view: the gradients are views of these buckets"
    return "resident; the gradients are copied in (gradient_as_bucket_view=False, DDP's default)"


#: The recipes ``--engine megatron`` reads: the buffer's dtype is the recipe's gradient dtype.
MEGATRON_RECIPES = ("bf16-megatron", "bf16-mixed", "fp16-mixed", "fp32")

#: A refusal: the field, whether the setup trips it, the value it has, what the engine needs.
Refusal = tuple[str, bool, object, str]


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
            ("optimizer", s.optimizer in ("adam8bit", "adafactor"), s.optimizer,
             "adamw, adam, sgd or sgd-momentum (Megatron-Core's optimizers)"),
            ("offload_optimizer", s.offload_optimizer or s.offload_params, True,
             "false (Megatron offloads only with its distributed optimizer, not modelled)"),
        )  # fmt: skip
    else:  # zero1-torch: its step runs the inner optimizer on whole tensors
        refusals += (
            ("optimizer", s.optimizer in ("adam8bit", "adafactor"), s.optimizer,
             "adamw, adam, sgd or sgd-momentum (states shaped by the tensors it gets)"),
            ("implementation", s.implementation == "for-loop" and s.optimizer in ("adamw", "adam"),
             s.implementation, "foreach or fused (a for-loop step follows the largest tensor)"),
            ("offload_optimizer", s.offload_optimizer, True, "false (it does not offload)"),
            ("shard", s.shard != "flat", s.shard, "flat (the engine assigns whole tensors)"),
        )  # fmt: skip
    for field, refused, got, allowed in refusals:
        if refused:
            raise InputError(field, f"with --engine {s.engine} must be {allowed}", got=got)


__all__ = [
    "MEGATRON_RECIPES",
    "ZRO_GROUPS",
    "check_engine",
    "counted_rank",
    "ddp_buckets",
    "ddp_note",
    "main_grad_buffer",
    "main_grad_copies",
    "sharded_stage",
]
