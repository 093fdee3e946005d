"""Results as text and JSON: one place renders an :class:`~vrammath.compose.estimate.Estimate` and a
:class:`~vrammath.serve.estimate.ServeEstimate`, for the CLI, the docs and tests alike.

Examples
========

>>> from vrammath.compose.estimate import estimate
>>> from vrammath.model.presets import load_model
>>> from vrammath.compose.setup import Setup
>>> data = estimate_dict(estimate(Setup(load_model("gpt2"), seq_len=1024)))
>>> data["setup"]["activation_model"], data["totals"]["peak_phase"]
('hf', 'backward_peak')
"""

from __future__ import annotations

import functools
import textwrap

import sympy

from vrammath.compose.engines import DEEPSPEED_REDUCE_BUCKET, RANKED_ENGINES, counted_rank
from vrammath.compose.estimate import Estimate
from vrammath.compose.setup import Setup
from vrammath.model.params import param_count
from vrammath.notation.fields import field_values
from vrammath.notation.units import fmt_gb, fmt_gib
from vrammath.serve.estimate import Serve, ServeEstimate
from vrammath.serve.hf import HF_ASSUMPTIONS, HfServeEstimate
from vrammath.serve.sglang import SglangBudget
from vrammath.serve.vllm import VllmBudget
from vrammath.terms.deepspeed3 import stage3_partition
from vrammath.terms.moe.params import param_summary


@functools.lru_cache(maxsize=4096)
def _text(expr: sympy.Basic) -> str:
    # printing is most of an estimate's time, and a changed number keeps every expression
    return str(expr)


def estimate_dict(est: Estimate) -> dict[str, object]:
    """Machine-readable form with stable keys; bytes are integers (None = not estimated)."""
    spec = est.gpu_spec
    setup = est.setup
    out: dict[str, object] = {
        "model": setup.model.name,
        "params": param_count(setup.model),
        "setup": {**field_values(setup), "activation_model": setup.activation_formula},
        "phases": est.phases,
        "components": [
            {
                "key": c.key,
                "label": c.label,
                "device": c.device,
                "bytes": c.bytes,
                "expr": None if c.expr is None else _text(c.expr),
                "note": c.note,
            }
            for c in est.components
        ],
        "totals": {
            "gpu_bytes": est.gpu_bytes,
            "cpu_bytes": est.cpu_bytes,
            "model_state_bytes": est.model_state_bytes,
            "peak_phase": est.peak_phase,
        },
        "unestimated": list(est.unestimated),
        "gpu": None
        if spec is None
        else {"name": spec.name, "bytes": spec.bytes, "fits": est.fits()},
    }
    if setup.model.experts is not None:
        out["moe"] = moe_dict(est)
    out["engine"] = engine_line(est)
    if setup.engine in RANKED_ENGINES and not (setup.engine == "deepspeed" and setup.zero == 3):
        index, owned = counted_rank(setup)
        what = {"zero1-torch": "optimizer_params", "deepspeed": "gradient_params"}.get(
            setup.engine, "owned_rows_params"
        )
        out["rank"] = {"index": index, "of": setup.gpus, "busiest": setup.rank is None, what: owned}
    return out


def engine_name(setup: Setup) -> str:
    """The engine a setup assumes, in a few words that read after "fits under" (the handbook's
    verdicts; :func:`engine_line` is the CLI's full line).

    >>> from vrammath.compose.setup import Setup
    >>> from vrammath.model.presets import load_model
    >>> engine_name(Setup(load_model("gpt2"), zero=2, gpus=4))
    'ZeRO-2 as a flat partition (the plain loop)'
    >>> engine_name(Setup(load_model("gpt2"), engine="deepspeed", zero=2, gpus=4))
    'DeepSpeed ZeRO-2'
    """
    named = {
        "zero1-torch": "ZeroRedundancyOptimizer",
        "ddp": "DistributedDataParallel",
        "megatron": "Megatron-Core's DistributedDataParallel",
        "deepspeed": f"DeepSpeed ZeRO-{setup.zero}",
        "fsdp2": "FSDP2" + (" (reshard_after_forward=False)" if setup.no_reshard else ""),
        "accelerate-fsdp2": "accelerate's FSDP2"
        + (" (reshard_after_forward=False)" if setup.no_reshard else ""),
    }
    if setup.engine in named:
        return named[setup.engine]
    megatron = setup.tp > 1 or setup.pp > 1
    parts = [f"Megatron's TP {setup.tp} x PP {setup.pp}"] if megatron else []
    if setup.ep > 1:
        parts.append(f"expert parallelism over {setup.ep}")
    if setup.zero:
        layout = "FSDP2's dim-0 shards" if setup.shard == "dim0" else "a flat partition"
        parts.append(f"ZeRO-{setup.zero} as {layout}")
    if parts:
        return ", ".join(parts) + ("" if megatron else " (the plain loop)")
    return "the plain loop on one GPU" if setup.gpus == 1 else "the plain loop on each GPU"


def engine_line(est: Estimate) -> str | None:
    """What the setup's engine means, where it shards or adds tensors: ``--zero`` and
    ``--shard`` are shorthands of the plain loop, ``--engine`` names an engine's own rules;
    under ``zero1-torch`` also which rank is counted.

    >>> from vrammath.compose.estimate import estimate
    >>> from vrammath.compose.setup import Setup
    >>> from vrammath.model.presets import load_model
    >>> print(engine_line(estimate(Setup(load_model("gpt2"), zero=2, gpus=4, seq_len=1024))))
    engine: the plain loop, ZeRO-2 as a flat partition (ceil(P/N) per rank: DeepSpeed's layout, not its buffers)
    """
    setup = est.setup
    if setup.engine == "zero1-torch":
        index, owned = counted_rank(setup)
        which = "the busiest" if setup.rank is None else "--rank"
        return (
            f"engine: ZeroRedundancyOptimizer; rank {index} of {setup.gpus} ({which}) owns the "
            f"optimizer states of {owned:,} of {param_count(setup.model):,} parameters "
            "(whole tensors)"
        )
    if setup.engine == "deepspeed" and setup.zero == 3:
        k = setup.stage3
        part = stage3_partition(setup.model, setup.gpus)
        return (
            f"engine: DeepSpeed ZeRO-3; every rank holds {part:,} of "
            f"{param_count(setup.model):,} parameters (ceil(numel/N) of every tensor); reduce "
            f"bucket {setup.reduce_bucket_size or DEEPSPEED_REDUCE_BUCKET:,} elements; prefetch "
            f"{k.prefetch_bucket_size:,}, max live {k.max_live_parameters:,}, max reuse distance "
            f"{k.max_reuse_distance:,}, persistence threshold {k.param_persistence_threshold:,}, "
            f"sub-group {k.sub_group_size:,} elements"
        )
    if setup.engine == "deepspeed":
        index, kept = counted_rank(setup)
        which = "the busiest" if setup.rank is None else "--rank"
        size = setup.reduce_bucket_size or DEEPSPEED_REDUCE_BUCKET
        return (
            f"engine: DeepSpeed ZeRO-{setup.zero}; rank {index} of {setup.gpus} ({which}) keeps "
            f"the whole gradients of {kept:,} of {param_count(setup.model):,} parameters (the "
            f"tensors overlapping its flat range); reduce bucket {size:,} elements"
        )
    if setup.engine in ("fsdp2", "accelerate-fsdp2"):
        index, owned = counted_rank(setup)
        which = "the busiest" if setup.rank is None else "--rank"
        reshard = "False" if setup.no_reshard else "True"
        units = (
            "FSDP2 (fully_shard per decoder layer and the root"
            if setup.engine == "fsdp2"
            else "accelerate's FSDP2 (fully_shard per decoder layer, the input embedding, "
            "[final norm, head] kept gathered, the root"
        )
        return (
            f"engine: {units}, reshard_after_forward={reshard}, "
            f"{_fsdp2_policy(setup)}); rank {index} of {setup.gpus} ({which}) owns {owned:,} of "
            f"{param_count(setup.model):,} parameters' rows (its padded shards hold "
            "ceil(dim0/N) rows of every tensor)"
        )
    if setup.engine == "ddp":
        view = ", the gradients are views of them" if setup.bucket_view else ""
        return f"engine: DistributedDataParallel; its gradient buckets are counted{view}"
    if setup.zero == 0:
        return None
    if setup.shard == "dim0":
        layout = "FSDP2's dim-0 shards (ceil(dim0/N) rows per rank; not FSDP2's buffers)"
    else:
        layout = "a flat partition (ceil(P/N) per rank: DeepSpeed's layout, not its buffers)"
    return f"engine: the plain loop, ZeRO-{setup.zero} as {layout}"


def _fsdp2_policy(setup: Setup) -> str:
    """The ``MixedPrecisionPolicy`` an FSDP2 engine's recipe stands for."""
    reduce = "fp32" if setup.engine == "fsdp2" else "bf16"
    return {
        "bf16-mixed": f"MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype={reduce}) on fp32 "
        "shards",
        "bf16-pure": "a bf16 model, no policy",
    }.get(setup.recipe, "fp32, no policy")


def moe_dict(est: Estimate) -> dict[str, object]:
    """A mixture-of-experts estimate's parameters (total, active per token, routed experts)
    and the groups its states are sharded over (:mod:`vrammath.terms.moe.params`)."""

    setup = est.setup
    summary = param_summary(setup.model)
    return {
        "total_params": summary["total"],
        "active_params": summary["active"],
        "routed_expert_params": summary["routed_experts"],
        "ep": setup.ep,
        "groups": {
            "data_parallel": setup.gpus,
            "expert_parallel": setup.ep,
            "expert_data_parallel": setup.gpus // setup.ep,
        },
    }


def estimate_table(est: Estimate) -> str:
    """A plain-text breakdown table, GB (1e9 bytes) and GiB (2**30 bytes) side by side."""
    rows = [("component", "device", "GB (1e9 B)", "GiB (2^30 B)", "formula")]
    for c in est.components:
        if c.bytes is None:
            rows.append((c.label, c.device, "not estimated", "", c.note))
        else:
            expr = "" if c.expr is None else _text(c.expr)
            rows.append((c.label, c.device, fmt_gb(c.bytes), fmt_gib(c.bytes), expr))
    for phase, value in est.phases.items():
        rows.append((f"phase: {phase}", "gpu", fmt_gb(value), fmt_gib(value), ""))
    rows.append(
        (
            f"peak per GPU ({est.peak_phase})",
            "gpu",
            fmt_gb(est.gpu_bytes),
            fmt_gib(est.gpu_bytes),
            "",
        )
    )
    if est.cpu_bytes:
        rows.append(
            ("total CPU per rank", "cpu", fmt_gb(est.cpu_bytes), fmt_gib(est.cpu_bytes), "")
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    spec = est.gpu_spec
    if spec is not None:
        verdict = "fits" if est.fits() else "does NOT fit"
        free = spec.bytes - est.gpu_bytes
        # a shortfall is said as such, never as a negative size
        room = "headroom" if free >= 0 else "short by"
        lines.append(
            f"{spec.name} ({fmt_gb(spec.bytes)} / {fmt_gib(spec.bytes)}): {verdict}, "
            f"{room} {fmt_gb(abs(free))} / {fmt_gib(abs(free))}"
        )
    engine = engine_line(est)
    if engine is not None:
        lines.append(engine)
    if est.unestimated:
        lines.append("not estimated: " + ", ".join(est.unestimated) + " (totals exclude them)")
    lines.append(
        "not counted: CUDA context, cuBLAS/NCCL workspaces, allocator rounding and "
        "fragmentation (reserve them: vrammath fit --reserve-gib, budget.DEFAULT_RESERVE_BYTES)"
    )
    return "\n".join(lines)


def serve_dict(est: ServeEstimate) -> dict[str, object]:
    """Machine-readable form (bytes as integers)."""
    s = est.setup
    spec = est.gpu_spec
    return {
        "model": s.model.name,
        "setup": field_values(s),
        "weights_bytes": est.weights_bytes,
        "quant_constants_bytes": est.quant_constants_bytes,
        "kv_cache_bytes": est.kv_bytes,
        "kv_cache_expr": _text(est.kv_expr),
        "kv_bytes_per_token": est.per_token_bytes,
        "reserve_bytes": est.reserve_bytes,
        "total_bytes": est.total_bytes,
        "gpu": None
        if spec is None
        else {
            "name": spec.name,
            "bytes": spec.bytes,
            "fits": est.fits(),
            "kv_budget_bytes": est.kv_budget_bytes,
            "max_batch_at_context": est.max_batch(),
            "max_context_at_batch": est.max_context(),
        },
    }


def serve_table(est: ServeEstimate) -> str:
    """Plain-text breakdown, GB (1e9) and GiB (2**30) side by side."""
    s = est.setup
    rows = [
        (f"weights ({s.weights}, per GPU)", est.weights_bytes, ""),
        ("quantization constants", est.quant_constants_bytes, ""),
        (
            f"KV cache ({s.batch} x {s.context} tokens, {s.kv_dtype})",
            est.kv_bytes,
            str(est.kv_expr),
        ),
    ]
    if est.gpu_spec is not None:
        rows.append(
            (
                f"runtime reserve ({1 - s.gpu_util:.0%} of the GPU)",
                est.reserve_bytes,
                "not for weights or KV",
            )
        )
    lines = [f"{'component':44} {'GB (1e9 B)':>12} {'GiB (2^30 B)':>13}  formula"]
    for label, value, formula in rows:
        lines.append(f"{label:44} {fmt_gb(value):>12} {fmt_gib(value):>13}  {formula}".rstrip())
    total = est.total_bytes
    lines.append(f"{'weights + KV cache per GPU':44} {fmt_gb(total):>12} {fmt_gib(total):>13}")
    if est.gpu_spec is not None:
        total = est.total_with_reserve_bytes
        label = "total per GPU with the runtime reserve"
        lines.append(f"{label:44} {fmt_gb(total):>12} {fmt_gib(total):>13}")
    lines.append(
        f"KV cache per token per GPU: {est.per_token_bytes:,} bytes"
        + (
            ""
            if est.block_bytes is None
            else f"; block of {s.block} tokens: {est.block_bytes:,} bytes"
        )
    )
    spec = est.gpu_spec
    if spec is not None:
        verdict = "fits" if est.fits() else "does NOT fit"
        budget = est.kv_budget_bytes or 0
        # a shortfall is said as such, never as a negative size
        left = (
            f"KV budget after weights and reserve {fmt_gb(budget)} / {fmt_gib(budget)}"
            if budget >= 0
            else f"weights and reserve exceed it by {fmt_gb(-budget)} / {fmt_gib(-budget)}"
        )
        lines.append(
            f"{spec.name} ({fmt_gb(spec.bytes)} / {fmt_gib(spec.bytes)}): {verdict}; {left}"
        )
        lines.append(
            f"largest batch at {s.context} tokens: {est.max_batch()}; "
            f"longest context at batch {s.batch}: {est.max_context():,} tokens"
        )
    return "\n".join(lines)


#: the words for each constant of memory outside torch (``conf/serving.toml``)
_NON_TORCH = {
    "non_torch": "one GPU",
    "non_torch_tp": "tensor parallel with vLLM's custom all-reduce",
    "non_torch_tp_plain": "tensor parallel without the custom all-reduce",
    "non_torch_whole_gpu": "0.6.4 counts all of it, the CUDA context too",
}
#: the words for each sampler path of the profile run
_SAMPLER = {
    "v0": "V0's sort",
    "pytorch": "the PyTorch sort of the logits",
    "flashinfer": "FlashInfer's kernel",
    "triton": "the Triton kernel",
}


def _blocks(b: VllmBudget) -> str:
    """The blocks and tokens of vLLM's cache in words, its KV-cache groups named."""
    lay = b.layout
    if lay.groups == 1:
        return f"{b.num_blocks:,} blocks = {b.kv_tokens:,} tokens"
    return (
        f"{lay.groups} KV-cache groups of {lay.group_size} layers ({lay.window_groups} of "
        f"{lay.window_layers} sliding layers, window {lay.window:,}; {lay.full_groups} of "
        f"{lay.full_layers} full), {b.num_blocks:,} blocks per group's share = "
        f"{b.kv_tokens:,} tokens"
    )


def vllm_table(setup: Serve, b: VllmBudget) -> str:
    """vLLM's startup budget as a subtraction, GB (1e9) and GiB (2**30) side by side, then the
    lines vLLM would print."""
    head = (
        f"{_on_gpu(setup, b.total_bytes, b.total_measured)}, vLLM {b.version} (the rule of "
        f"{b.rule}), tensor parallel {setup.tp}, max_model_len {b.max_model_len:,}, KV cache "
        f"{setup.kv_dtype}, blocks of {b.block_size} tokens"
    )
    peak = "sampler" if b.sampler_peak_bytes >= b.forward_peak_bytes else "forward"
    rows = [
        (f"total x gpu_memory_utilization {b.utilization:.2f}", b.requested_bytes),
        (f"- weights ({setup.weights}) and the rotary cache", b.weights_bytes),
        (
            f"- profile run's peak ({b.profile_tokens:,} tokens, {b.profile_seqs:,} requests: "
            f"{peak})",
            b.activation_peak_bytes,
        ),
        ("- memory outside torch (measured constant)", b.non_torch_bytes),
    ]
    if b.cuda_graph_bytes:
        rows.append(("- CUDA graphs (estimated from 0.20; measured constant)", b.cuda_graph_bytes))
    rows.append(("= available for the KV cache", b.available_bytes))
    verdict = "starts" if b.starts else "does NOT start"
    notes = [
        f"profile run: sampler {fmt_gib(b.sampler_peak_bytes)} ({_SAMPLER[b.sampler]}), "
        f"forward {fmt_gib(b.forward_peak_bytes)}; memory outside torch: "
        f"{_NON_TORCH[b.non_torch_key]}",
        f"KV cache: {b.page_bytes * b.layers // b.block_size:,} bytes per token on each GPU "
        f"({b.layers} layers); {_blocks(b)}; one request of {b.max_model_len:,} tokens takes "
        f"{b.blocks_per_request:,} blocks",
        f"vLLM {verdict}: at most {b.max_concurrency:.2f} requests of {b.max_model_len:,} "
        f"tokens at once; the longest max_model_len that starts: {b.largest_max_model_len:,}",
    ]
    return _engine_table(head, rows, notes, "vLLM", b.lines())


def sglang_table(setup: Serve, b: SglangBudget) -> str:
    """SGLang's startup budget, GB (1e9) and GiB (2**30) side by side, then the lines SGLang
    would print."""
    head = (
        f"{_on_gpu(setup, b.total_bytes, b.total_measured)}, SGLang {b.version}, tensor "
        f"parallel {setup.tp}, context_len {b.context_len:,}, KV cache {setup.kv_dtype}"
    )
    rows = [
        ("free before the weights load (after context and init)", b.free_before_bytes),
        (
            f"x mem_fraction_static {b.mem_fraction_static:g}",
            b.mem_fraction_static * b.free_before_bytes,
        ),
        (f"- weights ({setup.weights}) and the rotary cache", b.weights_bytes),
        ("= the KV cache's share", max(b.rest_bytes, 0)),
    ]
    note = (
        f"KV cache: {b.cell_bytes:,} bytes per token on each GPU; {b.tokens:,} tokens in pages of "
        f"{b.page_size}; the rest of the GPU is SGLang's headroom (CUDA graphs, activations)"
    )
    return _engine_table(head, rows, [note], "SGLang", b.lines())


def hf_table(est: HfServeEstimate) -> str:
    """transformers' generate(): weights, the two peaks and what they hold, GB (1e9) and GiB
    (2**30) side by side, then the fit on the GPU."""
    s, p = est.setup, est.peaks
    head = (
        f"{s.model.name}: generate(), {s.batch} x ({est.prompt:,} prompt + "
        f"{est.new_tokens:,} new) tokens, {s.weights}, greedy, DynamicCache"
    )
    rows: list[tuple[str, float]] = [
        (f"weights ({s.weights}) and RoPE's buffers", est.weights_bytes + est.buffer_bytes),
        (f"prefill's peak (at the {p.prefill_point}), cache included", p.prefill_bytes),
    ]
    if est.new_tokens > 1:
        rows.append((f"last decode step's peak (at the {p.decode_point})", p.decode_bytes))
    rows += [
        (f"  KV cache at the end ({s.batch} x {est.prompt + est.new_tokens - 1:,} tokens)",
         p.cache_bytes),
        ("= peak tensor bytes (weights + the larger peak)", est.total_bytes),
    ]  # fmt: skip
    card = est.gpu_spec
    notes = []
    if card is not None:
        rows.append(("+ CUDA context and cuBLAS/cuBLASLt workspaces", est.outside_bytes))
        verdict = "fits" if est.fits() else "does NOT fit"
        notes.append(
            f"{card.name} ({fmt_gib(card.usable)} usable): {verdict}; the most sequences of "
            f"this prompt that fit: {est.max_batch():,}"
        )
    lines = [head, f"{'per GPU':61} {'GB (1e9 B)':>11} {'GiB (2^30 B)':>13}"]
    lines += [f"{label:61} {fmt_gb(value):>11} {fmt_gib(value):>13}" for label, value in rows]
    assumed = [textwrap.fill(f"assumed: {a}", 88, subsequent_indent="  ") for a in HF_ASSUMPTIONS]
    return "\n".join([*lines, *notes, *assumed])


def _on_gpu(setup: Serve, total: int, measured: bool) -> str:
    seen = "as torch reports it" if measured else "nvidia-smi's figure: unmeasured"
    return f"{setup.model.name} on {setup.gpu} ({fmt_gib(total)}, {seen})"


def _engine_table(
    head: str, rows: list[tuple[str, float]], notes: list[str], engine: str, printed: list[str]
) -> str:
    """An engine's budget: its head line, the subtraction in GB and GiB, notes, and the lines
    the engine prints."""
    lines = [head, f"{'per GPU':61} {'GB (1e9 B)':>11} {'GiB (2^30 B)':>13}"]
    lines += [f"{label:61} {fmt_gb(value):>11} {fmt_gib(value):>13}" for label, value in rows]
    lines += [*notes, f"{engine} would print:", *(f"  {line}" for line in printed)]
    return "\n".join(lines)


__all__ = [
    "engine_line",
    "engine_name",
    "estimate_dict",
    "estimate_table",
    "hf_table",
    "serve_dict",
    "serve_table",
    "sglang_table",
    "vllm_table",
]
