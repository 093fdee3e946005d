"""Run real training engines on rank 0 of a fake process group and count its memory per phase.

:func:`measure_engine` builds a Hugging Face model from its config inside ``FakeTensorMode`` on the CPU, wraps
it the way a real engine does, runs two training iterations under PyTorch's ``MemTracker`` (or
``FSDPMemTracker``), and counts rank 0's bytes per phase; the model states (parameters, master
copies, gradients, optimizer states) are summed from the tensors themselves (local shards, each
storage once). The engines:

* ``megatron-copy``: bf16 weights and gradients, an fp32 master copy inside the optimizer,
  following Megatron-LM's ``Float16OptimizerWithFloat16Params``
  (``megatron/core/optimizer/optimizer.py``): masters are ``param.detach().clone().float()``, the
  step makes ``main_param.grad = model_param.grad.float()`` and frees the bf16 gradient, runs AdamW
  on the masters and copies them back into the bf16 weights.
* ``megatron-main-grad``: the same optimizer with Megatron's fp32 gradient buffer
  (``megatron/core/distributed/param_and_grad_buffer.py``; ``--bf16`` forces
  ``accumulate_allreduce_grads_in_fp32``): a persistent fp32 ``main_grad`` per parameter, filled by
  a post-accumulate-grad hook (``main_grad.add_(grad); grad = None``) and zeroed, not freed.
* ``megatron-bf16-grad``: the same with a bf16 buffer (Megatron's ``--grad-reduce-in-bf16``): the
  step's ``main_param.grad = model_param.main_grad.float()`` is then an fp32 copy.
* ``zero1-zro``: fp32 model, ``torch.distributed.optim.ZeroRedundancyOptimizer`` (AdamW, foreach).
* ``zero1-zro-master``: ``megatron-copy`` whose inner optimizer is a ZeroRedundancyOptimizer.
* ``zero3-fsdp``: FSDP2 (``fully_shard`` per decoder layer, then the model), ``--engine fsdp2``:
  ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` over fp32 shards.
* ``zero2-fsdp``: the same with ``reshard_after_forward=False`` (``--no-reshard-after-forward``).
* ``offload-fsdp``: ``zero3-fsdp`` with ``CPUOffloadPolicy(pin_memory=False)``.
* ``accel-fsdp(-keep)``: FSDP2 as accelerate 1.15 wraps it (:mod:`vrammath.measure.fsdp_runs`).
* ``deepspeed-zero*``: DeepSpeed's ZeRO engine on real CPU tensors
  (:func:`vrammath.measure.deepspeed_runs.measure_deepspeed`).
* ``plain-bf16``: a bf16 model and AdamW, the control.

Loop shapes (issue 13, ``--keep-outputs``): ``loop="loss"`` keeps only the loss (Trainer);
``loop="outputs"`` keeps the model output object as a plain loop does (``out = model(...)``,
``out.loss.backward()``, ``out`` rebound by the next iteration's forward).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import KW_ONLY, dataclass
from typing import Any

from vrammath.measure.build import as_spec, build_model, check_choice, real_training_masks
from vrammath.measure.fsdp_runs import Wrap, wrap_fsdp2
from vrammath.measure.step import (
    PHASES,
    _distinct_bytes,
    _fake_process_group,
    _lean_tracker,
    _mem_tracker,
    _Phases,
)
from vrammath.notation.signatures import after

PHASE_NAMES = PHASES
STATES = ("parameters", "gradients", "optimizer")
LOOPS = ("loss", "outputs")

TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 704,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 2048,
}
"""A 2-layer LLaMA whose every dim-0 divides by 8 (FSDP shards without padding)."""

TINY_QWEN_TIED = {
    "model_type": "qwen2",
    "hidden_size": 192,
    "intermediate_size": 512,
    "num_hidden_layers": 3,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "vocab_size": 3001,
    "tie_word_embeddings": True,
}
"""A 3-layer Qwen2 (QKV biases), tied embeddings, an odd vocabulary: shards that do not divide."""

TINY_ODD_HEAD = {
    "model_type": "llama",
    "hidden_size": 200,
    "intermediate_size": 536,
    "num_hidden_layers": 2,
    "num_attention_heads": 5,
    "num_key_value_heads": 1,
    "head_dim": 48,
    "vocab_size": 2051,
}
"""A 2-layer LLaMA with one KV head (MQA) and head_dim 48, not hidden/heads (40)."""

CONFIGS: dict[str, Any] = {
    "tiny-llama": TINY_LLAMA,
    "tiny-qwen-tied": TINY_QWEN_TIED,
    "tiny-odd-head": TINY_ODD_HEAD,
}


#: DeepSpeed ZeRO-3's gathering keys of the ``deepspeed-zero3-live`` rows, in elements.
STAGE3_SMALL = {
    "stage3_prefetch_bucket_size": 200_000,
    "stage3_max_live_parameters": 600_000,
    "stage3_max_reuse_distance": 300_000,
    "stage3_param_persistence_threshold": 40_000,
}


def _engine(recipe: str, zero: int, dtype: str, **extra: Any) -> dict[str, Any]:
    return {"recipe": recipe, "zero": zero, "dtype": dtype, **extra}


ENGINES: dict[str, dict[str, Any]] = {
    "megatron-copy": _engine("bf16-mixed", 0, "bf16"),
    "megatron-main-grad": _engine("bf16-megatron", 0, "bf16", profile="megatron"),
    "megatron-bf16-grad": _engine("bf16-mixed", 0, "bf16", profile="megatron"),
    "zero1-zro": _engine("fp32", 1, "fp32", profile="zero1-torch"),
    "zero1-zro-master": _engine("bf16-mixed", 1, "bf16", profile="zero1-torch"),
    "zero2-fsdp": _engine("bf16-mixed", 3, "fp32", profile="fsdp2", reshard=False),
    "zero3-fsdp": _engine("bf16-mixed", 3, "fp32", profile="fsdp2"),
    "offload-fsdp": _engine("bf16-mixed", 3, "fp32", profile="fsdp2", offload=True),
    "accel-fsdp": _engine("bf16-mixed", 3, "fp32", profile="accelerate-fsdp2"),
    "accel-fsdp-keep": _engine("bf16-mixed", 3, "fp32", profile="accelerate-fsdp2", reshard=False),
    "plain-bf16": _engine("bf16-pure", 0, "bf16"),
    "ddp": _engine("bf16-pure", 0, "bf16", profile="ddp"),
    "ddp-view": _engine("bf16-pure", 0, "bf16", profile="ddp", bucket_view=True),
    "ddp-fp32": _engine("fp32", 0, "fp32", profile="ddp"),
    "ddp-master": _engine("bf16-mixed", 0, "bf16", profile="ddp"),
    "ddp-view-master": _engine("bf16-mixed", 0, "bf16", profile="ddp", bucket_view=True),
    "deepspeed-zero1": _engine("bf16-mixed", 1, "bf16", profile="deepspeed"),
    "deepspeed-zero2": _engine("bf16-mixed", 2, "bf16", profile="deepspeed"),
    # a bucket smaller than the model: ZeRO-2 flushes it mid-backward, ZeRO-1 at the epilogue
    "deepspeed-zero1-bucket1m": _engine("bf16-mixed", 1, "bf16", profile="deepspeed", bucket=10**6),
    "deepspeed-zero2-bucket1m": _engine("bf16-mixed", 2, "bf16", profile="deepspeed", bucket=10**6),
    "deepspeed-zero3": _engine("bf16-mixed", 3, "bf16", profile="deepspeed"),
    # stage 3 with its gathering keys small against the model: the prefetcher stops at
    # max_live_parameters, the reuse distance releases the lower layers, q and o are gathered
    # and released where k and v persist
    "deepspeed-zero3-live": _engine(
        "bf16-mixed", 3, "bf16", profile="deepspeed", stage3=STAGE3_SMALL
    ),
    # every layer checkpointed: the backward's trace recomputes each layer's modules
    "deepspeed-zero3-recompute": _engine(
        "bf16-mixed", 3, "bf16", profile="deepspeed", recompute="full"
    ),
    # ZeRO-Offload at stage 3: the optimizer's side on the host
    "deepspeed-zero3-offload": _engine(
        "bf16-mixed",
        3,
        "bf16",
        profile="deepspeed",
        offload=True,
        stage3={"offload_optimizer": {"device": "cpu"}},
    ),
    # with ZeRO-Infinity's parameter offload to the CPU as well: the 16-bit partitions too
    "deepspeed-zero3-offload-params": _engine(
        "bf16-mixed",
        3,
        "bf16",
        profile="deepspeed",
        offload=True,
        stage3={"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}},
    ),
}
"""Engine -> the vrammath recipe/ZeRO stage it is compared with, the dtype it builds in and,
where it is not ``hf``, the ``Setup.engine`` whose per-rank rules apply (``profile``)."""


def _storage_bytes(tensors: Any) -> int:
    """Bytes of the distinct storages behind ``tensors`` (local shards of DTensors)."""
    from torch.distributed.tensor import DTensor

    local = (t.to_local() if isinstance(t, DTensor) else t for t in tensors if t is not None)
    return _distinct_bytes((t.untyped_storage() for t in local), lambda st: st._cdata)


class Float16MasterOptimizer:
    """bf16 model, fp32 masters in the optimizer: Megatron's ``Float16OptimizerWithFloat16Params``.

    Explanation
    ===========

    Follows ``megatron/core/optimizer/optimizer.py`` (``Float16OptimizerWithFloat16Params``,
    ``_copy_model_grads_to_main_grads``, ``_copy_main_params_to_model_params``) with one rank and
    no loss scaling (bf16). With ``grad_buffer`` ("fp32" or "bf16") each parameter gets a
    persistent ``main_grad`` view of one flat buffer of that dtype, as Megatron's DDP grad buffer
    (``param_and_grad_buffer.py``; fp32 with ``accumulate_allreduce_grads_in_fp32``); the
    backward hook adds the bf16 gradient into it and frees it. ``make_inner`` builds the optimizer over the
    masters (AdamW, or a ZeroRedundancyOptimizer for ZeRO-1).
    """

    def __init__(
        self,
        params: list[Any],
        make_inner: Callable[[list[Any]], Any],
        *,
        grad_buffer: str | None = None,
    ) -> None:
        import torch

        self.params = [p for p in params if p.requires_grad]
        self.masters = [
            torch.nn.Parameter(p.detach().clone().float()) for p in self.params
        ]  # Megatron: main_param = param.detach().clone().float()
        self.main_grad = grad_buffer is not None
        self.buffer = None
        if grad_buffer is not None:
            numel = sum(p.numel() for p in self.params)
            dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[grad_buffer]
            self.buffer = torch.zeros(numel, dtype=dtype)
            offset = 0
            for p in self.params:
                p.main_grad = self.buffer[offset : offset + p.numel()].view(p.shape)
                offset += p.numel()
                p.register_post_accumulate_grad_hook(_accumulate_main_grad)
        self.inner = make_inner(self.masters)

    def step(self) -> None:
        for p, m in zip(self.params, self.masters, strict=True):
            if self.main_grad:
                m.grad = p.main_grad.float()  # an fp32 buffer: an alias; bf16: a copy
            elif p.grad is not None:
                m.grad = p.grad.float()
            p.grad = None  # Megatron: safe to deallocate the model's grad after copying
        self.inner.step()
        import torch

        with torch.no_grad():
            for p, m in zip(self.params, self.masters, strict=True):
                p.copy_(m)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None
        for m in self.masters:
            m.grad = None
        if self.buffer is not None:
            self.buffer.zero_()  # Megatron zero_grad_buffer: zeroed, kept

    def state_tensors(self) -> list[Any]:
        return _optimizer_state_tensors(self.inner)


def _accumulate_main_grad(p: Any) -> None:
    p.main_grad.add_(p.grad)
    p.grad = None


def _optimizer_state_tensors(opt: Any) -> list[Any]:
    import torch

    local = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer keeps its shard's optimizer here
    return [v for st in local.state.values() for v in st.values() if isinstance(v, torch.Tensor)]


def _adamw(params: list[Any]) -> Any:
    import torch

    return torch.optim.AdamW(params, lr=1e-4, foreach=True)


def _zro(params: list[Any]) -> Any:
    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=1e-4, foreach=True)


@contextlib.contextmanager
def _maybe_group(ranks: int | None, rank: int = 0) -> Iterator[Any]:
    if ranks is None:
        yield None
    else:
        with _fake_process_group(ranks, rank) as mesh:
            yield mesh


def _build(engine: str, spec: Any, attention: str, mesh: Any) -> dict[str, Any]:
    """The model and optimizer of ``engine`` (call inside FakeTensorMode)."""

    cfg = ENGINES[engine]
    precision = "bf16" if cfg["dtype"] == "bf16" else "fp32"
    net = build_model(spec, precision=precision, attention=attention)
    if "fsdp" in engine:
        wrap: Wrap = "accelerate" if engine.startswith("accel") else "torchtitan"
        reshard, offload = cfg.get("reshard", True), bool(cfg.get("offload"))
        wrap_fsdp2(net, mesh, wrap=wrap, reshard=reshard, offload=offload)
    params = list(net.parameters())
    inner = _zro if engine.startswith("zero1") else _adamw
    if engine.startswith("megatron") or engine == "zero1-zro-master":
        buffers = {"megatron-main-grad": "fp32", "megatron-bf16-grad": "bf16"}
        opt: Any = Float16MasterOptimizer(params, inner, grad_buffer=buffers.get(engine))
        return {
            "net": net,
            "params": params,
            "opt": opt,
            "inner": opt.inner,
            "masters": opt.masters,
            "main_grads": [] if opt.buffer is None else [opt.buffer],
        }
    opt = inner(params)
    return {
        "net": net,
        "params": params,
        "opt": opt,
        "inner": opt,
        "masters": [],
        "main_grads": [],
    }


def _counted(built: dict[str, Any], *, after_backward: bool) -> dict[str, int]:
    """Rank 0's model states, summed from the tensors (each storage once, local shards)."""
    opt_t = _optimizer_state_tensors(built["inner"])
    out = {
        "parameters": _storage_bytes(built["params"] + built["masters"]),
        "optimizer": _storage_bytes(t for t in opt_t if t.dim() > 0),
        "step_counters": _storage_bytes(t for t in opt_t if t.dim() == 0),
    }
    if after_backward:
        grads = [p.grad for p in built["params"] + built["masters"]] + built["main_grads"]
        out["gradients"] = _storage_bytes(grads)
    return out


@dataclass(frozen=True)
class EngineRun:
    """What :func:`measure_engine` runs: ``engine`` (a key of :data:`ENGINES`) on ``model``, with
    (keyword-only) the batch shape, the attention kernel, the fake world of ``ranks`` and the one
    ``rank`` measured, ``steps`` iterations of the ``loop``."""

    engine: str
    model: Any
    _: KW_ONLY
    batch: int = 1
    seq: int = 256
    attention: str = "sdpa"
    ranks: int = 8
    steps: int = 2
    loop: str = "loss"
    rank: int = 0


@after(EngineRun)
def measure_engine(run: EngineRun) -> dict[str, Any]:
    """Run ``steps`` iterations of ``engine`` on rank ``rank`` of ``ranks`` and count its memory.

    Returns per iteration the phases' end and peak snapshots (MemTracker categories and
    ``Total``), and the model states counted from the tensors: ``parameters`` (weights and
    masters), ``gradients`` (after backward: model gradients and fp32 main gradients),
    ``optimizer`` (exp_avg and exp_avg_sq), ``step_counters`` (AdamW's scalar ``step``) and, for
    offload, ``host`` (the shards on the host).

    FSDP rows first run one untracked iteration of the same engine and shapes: the first time
    DTensor propagates an op's sharding for given shapes, ``FSDPMemTracker`` counts the
    propagation's full-size fake outputs (34 MB of "OptState" for a 2.5 MB state on the tiny
    model), so without the warm-up the first step's peak depends on what ran before in the process.
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    engine, batch, seq, attention = run.engine, run.batch, run.seq, run.attention
    ranks, steps, loop, rank = run.ranks, run.steps, run.loop, run.rank
    check_choice("engine", engine, list(ENGINES))
    check_choice("loop", loop, LOOPS)
    spec = as_spec(run.model)
    if rank and ENGINES[engine].get("profile") in (None, "ddp", "megatron"):
        raise ValueError(f"rank: {engine} is measured on rank 0 only (its estimate is rank 0's)")
    if engine.startswith("deepspeed"):
        raise ValueError(f"engine: {engine} runs in vrammath.measure.deepspeed_runs")
    fsdp = "fsdp" in engine
    needs_group = fsdp or engine.startswith("zero1")
    with (
        _maybe_group(ranks if needs_group else None, rank) as mesh,
        real_training_masks(),
        FakeTensorMode(),
    ):
        torch.manual_seed(0)
        ids = torch.randint(0, spec.vocab, (batch, seq))
        if fsdp:
            warm = _build(engine, spec, attention, mesh)
            warm["net"](input_ids=ids, labels=ids).loss.backward()
            warm["opt"].step()
            del warm
        built = _build(engine, spec, attention, mesh)
        net, opt = built["net"], built["opt"]
        if fsdp:
            from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

            tracker = _lean_tracker(FSDPMemTracker)(net, built["inner"])
        else:
            tracker = _mem_tracker(net, built["inner"], *built["masters"], *built["main_grads"])
        phases = _Phases(tracker, cuda=False)
        iterations = []
        with tracker:
            out = None
            for _ in range(steps):
                tracker.reset_mod_stats()
                record: dict[str, Any] = {"start": phases._snapshot("current")}
                with phases.phase(record, "forward", "Activation"):
                    if loop == "outputs":  # rebound only once the next forward has returned
                        out = net(input_ids=ids, labels=ids)
                        loss = out.loss
                    else:
                        loss = net(input_ids=ids, labels=ids).loss
                with phases.phase(record, "backward", "Temp"):
                    loss.backward()
                    del loss
                record["states"] = _counted(built, after_backward=True)
                with phases.phase(record, "step", "Temp"):
                    opt.step()
                with phases.phase(record, "zero_grad", "Temp"):
                    opt.zero_grad(set_to_none=True)
                record["states_after_step"] = _counted(built, after_backward=False)
                iterations.append(record)
            del out
        partition = None
        if engine.startswith("zero1"):
            partition = [
                sum(p.numel() for g in groups for p in g["params"])
                for groups in built["inner"]._partition_parameters()
            ]
    return {
        "engine": engine,
        "loop": loop,
        "iterations": iterations,
        "first": iterations[0],
        "steady": iterations[-1],
        "zro_partition_numel": partition,
    }
