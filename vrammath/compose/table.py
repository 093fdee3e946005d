"""The table of memory terms: every term of a training setup is one row.

A row (:class:`~vrammath.compose.rows.Term`) says what a term is -- key, label, device, the function that builds its
whole-model expression, the ZeRO stage from which it is sharded over ``N_d``, the offload that
moves it off the GPU, its phase group and when it is live -- and nothing about how terms combine.
:func:`vrammath.compose.estimate.estimate` is the one composition: it builds every row of
:data:`TERMS` for a :class:`~vrammath.compose.setup.Setup`, shards and offloads it by the row's
columns, sums the rows by phase group and hands the sums to a phase model of
:mod:`vrammath.compose.peak`. The table plays the part ``sympy/physics/units/definitions/
unit_definitions.py`` plays for units: definitions as data, composed elsewhere.

A builder returns ``None`` when its term does not exist for the setup (no master copy in a pure
16-bit recipe, no adapters in a full fine-tune); the term is then absent from the estimate.

Examples
========

>>> [t.key for t in TERMS if t.group == "optimizer"]
['optimizer', 'cpu_optimizer', 'adapter_optimizer']
>>> TERMS_BY_KEY["gradients"].sharded_from, TERMS_BY_KEY["gradients"].live
(2, 'backward+step')

.. rubric:: How to add a term

Write its builder (a function of a :class:`~vrammath.compose.rows.Context`, returning the whole-model bytes as a sympy
expression in the symbols of :mod:`vrammath.notation.symbols`, or ``None`` where the term does not
exist), give it a row, and append the row to the table -- :data:`TERMS` in this module, or a table
of your own passed to ``estimate(..., terms=...)``. Its group decides which phases it enters, its
``sharded_from`` how ZeRO divides it; nothing else changes. A term most runs do not have is an
opt-in row (``opt_in=True``): a setup adds it by naming its key in ``Setup.extra_terms`` (the
CLI's ``--with``), and every other setup's numbers stay as they were. Here, an exponential moving
average of the weights (``torch_ema``'s shadow copy: one fp32 tensor per parameter, ``4 P``),
resident through the whole iteration, so in the weights group:

>>> from vrammath.compose.estimate import estimate
>>> from vrammath.model.presets import load_model
>>> from vrammath.compose.setup import Setup
>>> from vrammath.notation.symbols import P
>>> ema = Term(
...     key="ema",
...     label="EMA of the weights (fp32)",
...     device="gpu",
...     builder=lambda ctx: 4 * P,
...     group="weights",
...     live="resident",
...     opt_in=True,
... )
>>> table = TERMS + (ema,)
>>> setup = Setup(load_model("gpt2"), seq_len=1024, extra_terms=("ema",))
>>> with_ema = estimate(setup, terms=table)
>>> with_ema.component("ema").expr, with_ema.component("ema").bytes
(4*P, 497759232)
>>> plain = Setup(load_model("gpt2"), seq_len=1024)
>>> with_ema.gpu_bytes - estimate(plain, terms=table).gpu_bytes
497759232
>>> estimate(setup)  # the default table has no such row
Traceback (most recent call last):
...
vrammath.notation.errors.InputError: extra_terms: must name opt-in rows of the table (none in this table) (got 'ema')

Add a test that pins its value on one real model (``tests/test_terms.py``), a docstring in
sympy's order with the source of the formula, and run ``python tools/golden.py``: it lists the
golden numbers the row moved (none, for an opt-in row no golden setup names).
"""

from __future__ import annotations

from vrammath.compose.builders import (
    activations,
    activations_label,
    activations_note,
    adapter,
    adapter_activations,
    adapter_activations_label,
    adapter_activations_note,
    adapter_note,
    dequant_buffer,
    gathered,
    groups_note,
    kept_outputs,
    logits_loss,
    logits_loss_note,
    offloaded_state,
    quant_constants,
    reduce_buffer,
    state,
    step_note,
    step_temporaries,
    weights,
    weights_label,
)
from vrammath.compose.deepspeed3 import (
    STAGE3_HOST_TERMS,
    STAGE3_PHASE_TERMS,
    STAGE3_STATE_TERMS,
)
from vrammath.compose.engines import (
    bucket_flush,
    ddp_buckets,
    ddp_note,
    deepspeed_epilogue,
    deepspeed_step,
    main_grad_buffer,
    main_grad_copies,
    master_grad_copies,
    reduce_bucket,
)
from vrammath.compose.fsdp2 import (
    fsdp2_all_gather_kept,
    fsdp2_all_gather_resharded,
    fsdp2_bottom_layers,
    fsdp2_layer_unshard,
    fsdp2_reduce,
    fsdp2_unsharded,
    fsdp2_unsharded_note,
    last_all_gather_label,
)
from vrammath.compose.rows import (
    ShardGroup,
    Term,
)

# the model states: dense parts over the data-parallel group, routed experts over expert
# parallelism and the expert-data-parallel group (vrammath.terms.moe.params)
EDP: ShardGroup = "dp+edp"

#: Every memory term of a training setup, in the order an estimate lists them.
TERMS: tuple[Term, ...] = (
    Term(
        key="weights",
        label=weights_label,
        device="gpu",
        builder=weights,
        group="weights",
        live="resident",
        sharded_from=3,
        offload="params",
        note=lambda ctx: (
            "no gradients, master copy or optimizer states" if ctx.lora else groups_note(ctx)
        ),
        shard_group=EDP,
    ),
    Term(
        key="gradients",
        label="gradients",
        device="gpu",
        builder=state("gradients"),
        group="gradients",
        live="backward+step",
        sharded_from=2,
        offload="optimizer",
        note=groups_note,
        shard_group=EDP,
    ),
    Term(
        key="ddp_buckets",
        label="DDP gradient buckets",
        device="gpu",
        builder=ddp_buckets,
        group="weights",  # resident from construction: with the weights in every phase
        live="resident",
        note=ddp_note,
    ),
    Term(
        key="main_grads",
        label="Megatron main_grad buffer",
        device="gpu",
        builder=main_grad_buffer,
        group="weights",  # resident from construction: with the weights in every phase
        live="resident",
        note="the gradients: zeroed, not freed, between iterations",
    ),
    *STAGE3_STATE_TERMS,
    Term(
        key="master",
        label="master weights (fp32)",
        device="gpu",
        builder=state("master"),
        group="weights",
        live="resident",
        sharded_from=1,
        offload="optimizer",
        note=groups_note,
        shard_group=EDP,
    ),
    Term(
        key="optimizer",
        label="optimizer states",
        device="gpu",
        builder=state("optimizer"),
        group="optimizer",
        live="resident",
        sharded_from=1,
        offload="optimizer",
        note=groups_note,
        shard_group=EDP,
    ),
    Term(
        key="cpu_master",
        label="master weights (fp32) (offloaded)",
        device="cpu",
        builder=offloaded_state("master"),
        group="weights",
        live="resident",
        sharded_from=1,
        offload="optimizer",
        shard_group=EDP,
    ),
    Term(
        key="cpu_optimizer",
        label="optimizer states (offloaded)",
        device="cpu",
        builder=offloaded_state("optimizer"),
        group="optimizer",
        live="resident",
        sharded_from=1,
        offload="optimizer",
        shard_group=EDP,
    ),
    Term(
        key="cpu_gradients",
        label="gradients (offloaded)",
        device="cpu",
        builder=offloaded_state("gradients"),
        group="gradients",
        live="backward+step",
        sharded_from=1,
        offload="optimizer",
        shard_group=EDP,
    ),
    *STAGE3_HOST_TERMS,
    Term(
        key="cpu_weights",
        label="weights (offloaded)",
        device="cpu",
        builder=offloaded_state("weights"),
        group="weights",
        live="resident",
        sharded_from=3,
        offload="params",
        shard_group=EDP,
    ),
    Term(
        key="quant_constants",
        label=lambda ctx: f"quantization constants ({ctx.setup.quant})",
        device="gpu",
        builder=quant_constants,
        group="weights",
        live="resident",
        sharded_from=3,
        note=lambda ctx: (
            "uint8 absmax per 64 + fp32 per 256 + offset" if ctx.setup.quant == "nf4" else ""
        ),
    ),
    Term(
        key="adapter_weights",
        label="adapter weights (fp32)",
        device="gpu",
        builder=adapter("weights"),
        group="weights",
        live="resident",
        sharded_from=3,
        note=adapter_note,
    ),
    Term(
        key="adapter_gradients",
        label="adapter gradients (fp32)",
        device="gpu",
        builder=adapter("gradients"),
        group="gradients",
        live="backward+step",
        sharded_from=2,
        note=adapter_note,
    ),
    Term(
        key="adapter_master",
        label="adapter master weights",
        device="gpu",
        builder=adapter("master"),
        group="weights",
        live="resident",
        sharded_from=1,
        note=adapter_note,
    ),
    Term(
        key="adapter_optimizer",
        label=lambda ctx: f"adapter optimizer states ({ctx.setup.optimizer})",
        device="gpu",
        builder=adapter("optimizer"),
        group="optimizer",
        live="resident",
        sharded_from=1,
        note=adapter_note,
    ),
    Term(
        key="dequant_buffer",
        label="dequantization buffer (transient)",
        device="gpu",
        builder=dequant_buffer,
        group="in-flight",
        live="forward+backward",
        note="one frozen matrix in bf16 per matmul",
    ),
    Term(
        key="adapter_activations",
        label=adapter_activations_label,
        device="gpu",
        builder=adapter_activations,
        group="activations",
        live="forward+backward",
        note=adapter_activations_note,
    ),
    Term(
        key="gathered",
        label="gathered layers (ZeRO-3 in flight)",
        device="gpu",
        builder=gathered,
        group="in-flight",
        live="forward+backward",
        note="current layer + one prefetched, unsharded",
    ),
    Term(
        key="reduce_buffer",
        label="reduce-scatter buffer (ZeRO-3)",
        device="gpu",
        builder=reduce_buffer,
        group="in-flight",
        live="backward",
        note="one layer's unsharded gradients before the reduce-scatter",
        listed=False,
    ),
    Term(
        key="fsdp2_unsharded",
        label="unsharded parameters (FSDP2)",
        device="gpu",
        builder=fsdp2_unsharded,
        group="in-flight",
        live="forward+backward",
        note=fsdp2_unsharded_note,
    ),
    Term(
        key="all_gather",
        label=last_all_gather_label,
        device="gpu",
        builder=fsdp2_all_gather_resharded,
        group="in-flight",
        live="forward+backward",
        note="the last all-gather kept until the next one; the backward's prefetch",
    ),
    Term(
        key="all_gather_kept",
        label=last_all_gather_label,
        device="gpu",
        builder=fsdp2_all_gather_kept,
        group="in-flight",
        live="forward",
        note="the forward's last, kept to its end",
    ),
    Term(
        key="layer_unshard",
        label="a layer being gathered (FSDP2)",
        device="gpu",
        builder=fsdp2_layer_unshard,
        group="in-flight",
        live="forward",
        note="its all-gather output and unsharded parameters, before its activations",
        listed=False,
    ),
    Term(
        key="fsdp2_bottom",
        label="accelerate's FSDP2 at the lowest layers' backward",
        device="gpu",
        builder=fsdp2_bottom_layers,
        group="in-flight",
        live="backward",
        note="four layers' gathered bytes, less the gradient shards not yet made",
        listed=False,
    ),
    Term(
        key="fsdp2_reduce",
        label="reduce-scatter of one unit (FSDP2)",
        device="gpu",
        builder=fsdp2_reduce,
        group="in-flight",
        live="backward",
        note="unsharded gradients and the reduce_dtype reduce-scatter input",
        listed=False,
    ),
    Term(
        key="reduce_bucket",
        label="DeepSpeed reduce bucket",
        device="gpu",
        builder=reduce_bucket,
        group="in-flight",
        live="backward",
        note="reduce_bucket_size elements, from the first gradient hook to the end of backward",
    ),
    Term(
        key="bucket_flush",
        label="DeepSpeed bucket flush (ZeRO-2)",
        device="gpu",
        builder=bucket_flush,
        group="in-flight",
        live="backward",
        note="the flat copy a full bucket is reduced from, during the backward",
    ),
    Term(
        key="deepspeed_epilogue",
        label="DeepSpeed gradients at the backward's epilogue",
        device="gpu",
        builder=deepspeed_epilogue,
        group="in-flight",
        live="backward",
        note="at the end of the backward, in place of the kept gradients where it is more",
    ),
    Term(
        key="activations",
        label=activations_label,
        device="gpu",
        builder=activations,
        group="activations",
        live="forward+backward",
        note=activations_note,
    ),
    Term(
        key="logits_loss",
        label="logits and loss buffers kept",
        device="gpu",
        builder=logits_loss,
        group="activations",
        live="forward+backward",
        note=logits_loss_note,
    ),
    Term(
        key="outputs",
        label="model output kept by the loop",
        device="gpu",
        builder=kept_outputs,
        group="outputs",
        live="resident",
        note="logits + loss, until the next forward rebinds the output",
    ),
    Term(
        key="main_grad_copies",
        label="fp32 copies of the 16-bit main_grads",
        device="gpu",
        builder=main_grad_copies,
        group="temporaries",
        live="step",
        note="the step's master gradients, main_grad.float()",
    ),
    Term(
        key="master_grad_copies",
        label="fp32 gradients on the masters, less the 16-bit ones",
        device="gpu",
        builder=master_grad_copies,
        group="temporaries",
        live="step",
        note="the step's main_param.grad = grad.float(), which frees the 16-bit gradient",
    ),
    *STAGE3_PHASE_TERMS,
    Term(
        key="deepspeed_step",
        label="DeepSpeed step transients",
        device="gpu",
        builder=deepspeed_step,
        group="temporaries",
        live="step",
        note="largest of: fp64 norm of a gradient slice, flat + fp32 gradient partition, "
        "fp32 gradient + optimizer temporaries less the freed gradients",
    ),
    Term(
        key="step_temporaries",
        label=lambda ctx: f"optimizer step temporaries ({ctx.setup.implementation})",
        device="gpu",
        builder=step_temporaries,
        group="temporaries",
        live="step",
        sharded_from=1,
        offload="optimizer",
        note=step_note,
        shard_group=EDP,
    ),
)

#: The rows by key.
TERMS_BY_KEY: dict[str, Term] = {t.key: t for t in TERMS}


__all__ = [
    "TERMS",
    "TERMS_BY_KEY",
]
