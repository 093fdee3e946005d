"""DeepSpeed's ZeRO engine measured on real CPU tensors (rows ``deepspeed-zero*`` of
:data:`vrammath.measure.engine_runs.ENGINES`): its stage from the row's name, its bucket, stage
3's ``zero_optimization`` keys (offload among them) and recomputation from the row.
"""

from __future__ import annotations

import importlib
from typing import Any

from vrammath.measure.build import build_model, real_training_masks
from vrammath.measure.engine_runs import (
    ENGINES,
    _optimizer_state_tensors,
    _storage_bytes,
)
from vrammath.measure.step import (
    _DevicePhases,
    _fake_process_group,
    _forward_backward,
    _mem_tracker,
)


def measure_deepspeed_row(engine: str, spec: Any, **shape: Any) -> dict[str, Any]:
    """Measure an ``ENGINES`` row ``deepspeed-zero<stage>[-variant]``."""
    cfg = ENGINES[engine]
    return measure_deepspeed(
        int(engine.split("-")[1][-1]),
        spec,
        bucket=cfg.get("bucket"),
        stage3=cfg.get("stage3"),
        recompute=cfg.get("recompute", "none"),
        **shape,
    )


def measure_deepspeed(
    stage: int,
    spec: Any,
    *,
    batch: int,
    seq: int,
    attention: str,
    ranks: int,
    rank: int = 0,
    steps: int = 2,
    bucket: int | None = None,
    stage3: dict[str, Any] | None = None,
    recompute: str = "none",
) -> dict[str, Any]:
    """DeepSpeed's ZeRO engine (bf16, torch AdamW foreach) on ``rank`` of a fake process group,
    with ``reduce_bucket_size`` ``bucket`` (DeepSpeed's default where None) and stage 3's
    ``zero_optimization`` keys ``stage3``; ``recompute="full"`` checkpoints every layer as
    transformers does (non-reentrant).

    DeepSpeed's engine moves the model with ``module.to(device)``, which FakeTensorMode refuses
    ("_apply(): Couldn't swap Embedding.weight"), so this runs on real CPU tensors (small models
    only) under ``MemTracker``, which counts real tensors the same way; the fake process group
    makes the collectives no-ops. Needs ``deepspeed`` (its CPU accelerator) and ``LOCAL_RANK``.
    The model states are summed from DeepSpeed's flat buffers (``bit16_groups_flat`` and
    ``single_partition_of_fp32_groups`` for stages 1-2, ``fp16_partitioned_groups_flat`` and
    ``fp32_partitioned_groups_flat`` for stage 3); ``gradients`` is what the backward leaves
    allocated (total at its end minus total at the iteration's start), or stage 3's
    ``grad_partitions_flat_buffer``, which the optimizer allocates when it is built.
    """
    import os

    import torch

    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # an optional dependency outside the measure extra: imported by name (no stubs either way)
    deepspeed: Any = importlib.import_module("deepspeed")
    ds_comm: Any = importlib.import_module("deepspeed.comm.comm")
    ds_groups: Any = importlib.import_module("deepspeed.utils.groups")

    # DeepSpeed caches the world group of the first run; each row has a fresh fake group
    ds_comm.cdb = None
    for name in ("_WORLD_GROUP", "_DATA_PARALLEL_GROUP", "_ZERO_PARAM_INTRA_PARALLEL_GROUP"):
        setattr(ds_groups, name, None)
    config = {
        "train_micro_batch_size_per_gpu": batch,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage}
        | ({} if bucket is None else {"reduce_bucket_size": bucket})
        | (stage3 or {}),
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 1e-4, "torch_adam": True, "foreach": True},
        },
        # with an offloaded optimizer DeepSpeed asks for its CPU Adam; torch's AdamW is kept
        "zero_force_ds_cpu_optimizer": False,
    }
    with _fake_process_group(ranks, rank), real_training_masks():
        torch.manual_seed(0)
        net = build_model(spec, precision="bf16", attention=attention)
        if recompute == "full":
            net.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        ids = torch.randint(0, spec.vocab, (batch, seq))
        # The parameters are not registered: DeepSpeed copies them into its flat buffers
        # (counted as they are made) and drops them. It also keeps a meta-device copy of each
        # parameter (round_robin_bit16_meta), which MemTracker counts under device "meta":
        # _DevicePhases counts the CPU only.
        tracker = _mem_tracker(*net.buffers())
        phases = _DevicePhases(tracker, cuda=False)
        iterations = []
        with tracker:
            engine, opt, _, _ = deepspeed.initialize(
                model=net, config=config, dist_init_required=False
            )
            flat = [
                *getattr(opt, "bit16_groups_flat", []),
                *getattr(opt, "single_partition_of_fp32_groups", []),
                *getattr(opt, "fp16_partitioned_groups_flat", []),
                *getattr(opt, "fp32_partitioned_groups_flat", []),
            ]
            passes = _forward_backward(
                tracker,
                phases,
                steps,
                lambda: engine(input_ids=ids, labels=ids).loss,
                engine.backward,
            )
            for record in passes:
                opt_t = _optimizer_state_tensors(opt.optimizer)
                record["states"] = {
                    "parameters": _storage_bytes(flat),
                    "optimizer": _storage_bytes(t for t in opt_t if t.dim() > 0),
                    "step_counters": _storage_bytes(t for t in opt_t if t.dim() == 0),
                    # stage 3 reduces into a flat buffer made with the optimizer: that is
                    # its gradients; stages 1-2 allocate theirs in the backward
                    "gradients": _storage_bytes([opt.grad_partitions_flat_buffer])
                    if stage == 3
                    else record["backward"]["end"]["Total"] - record["start"]["Total"],
                }
                host = []
                if getattr(opt, "offload_optimizer", False):
                    # the host's side: fp32 partitions, their fp32 gradients, the optimizer's
                    # states and the gradient partitions (device "cpu" in DeepSpeed's terms)
                    fp32 = list(opt.fp32_partitioned_groups_flat)
                    grads = [t.grad for t in fp32 if t.grad is not None]
                    host += [*fp32, *grads, *opt_t, opt.grad_partitions_flat_buffer]
                if getattr(opt, "offload_param", False):  # the 16-bit partitions too
                    host += list(opt.fp16_partitioned_groups_flat)
                if host:
                    record["host"] = _storage_bytes(t for t in host if t.dim() > 0)
                    counters = record["states"]["step_counters"]
                    record["host_counters"] = counters if opt.offload_optimizer else 0
                with phases.phase(record, "step", "Temp"):
                    engine.step()  # DeepSpeed's step also zeroes the gradients
                record["zero_grad"] = {"end": record["step"]["end"], "peak": record["step"]["end"]}
                record["states_after_step"] = record["states"]
                iterations.append(record)
    return {
        "engine": f"deepspeed-zero{stage}",
        "loop": "loss",
        "iterations": iterations,
        "first": iterations[0],
        "steady": iterations[-1],
        "zro_partition_numel": None,
        "deepspeed": deepspeed.__version__,
    }


__all__ = ["measure_deepspeed", "measure_deepspeed_row"]
