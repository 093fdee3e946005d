"""PyTorch's ``DistributedDataParallel`` on rank 0 of a fake process group, counted per phase.

DDP cannot be built under ``FakeTensorMode`` (its constructor checks the parameters' shapes
across ranks by reading their data: "The tensor has a non-zero number of elements, but its data
is not allocated yet"), so this runs on real CPU tensors of the small models, under the same
``MemTracker`` as the other engines, entered *before* DDP is built so that the reducer's bucket
buffers allocated at construction are counted. The fake process group's ``allreduce`` returns no
tensor, which DDP's default communication hook needs; ``noop_hook`` (PyTorch's own debugging hook,
``torch/distributed/algorithms/ddp_comm_hooks/debugging_hooks.py``) hands the bucket back
unreduced instead -- the default hook all-reduces that same buffer in place, so the memory is the
same. Every rank holds the same bytes under DDP: rank 0 stands for all.
"""

from __future__ import annotations

from typing import Any

from vrammath.measure.build import build_model, real_training_masks
from vrammath.measure.engine_runs import (
    Float16MasterOptimizer,
    _adamw,
    _optimizer_state_tensors,
    _storage_bytes,
)
from vrammath.measure.step import (
    _DevicePhases,
    _fake_process_group,
    _forward_backward,
    _mem_tracker,
)

#: The DDP rows: engine name -> the model's dtype, ``gradient_as_bucket_view`` and whether the
#: optimizer keeps fp32 masters (Megatron's copy, :class:`Float16MasterOptimizer`) or is AdamW.
DDP_RUNS: dict[str, dict[str, Any]] = {
    "ddp": {"dtype": "bf16", "bucket_view": False, "master": False},
    "ddp-view": {"dtype": "bf16", "bucket_view": True, "master": False},
    "ddp-fp32": {"dtype": "fp32", "bucket_view": False, "master": False},
    "ddp-master": {"dtype": "bf16", "bucket_view": False, "master": True},
    "ddp-view-master": {"dtype": "bf16", "bucket_view": True, "master": True},
}


def _backward(loss: Any) -> None:
    loss.backward()


def measure_ddp(
    engine: str, spec: Any, *, batch: int, seq: int, attention: str, ranks: int, steps: int = 2
) -> dict[str, Any]:
    """``steps`` iterations of a DDP-wrapped model (AdamW, foreach) and their phases."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook
    from torch.nn.parallel import DistributedDataParallel

    run = DDP_RUNS[engine]
    with _fake_process_group(ranks), real_training_masks():
        torch.manual_seed(0)
        net = build_model(spec, precision=run["dtype"], attention=attention)
        ids = torch.randint(0, spec.vocab, (batch, seq))
        params = [p for p in net.parameters() if p.requires_grad]
        tracker = _mem_tracker(net)
        phases = _DevicePhases(tracker, cuda=False)
        iterations = []
        with tracker:
            ddp = DistributedDataParallel(net, gradient_as_bucket_view=run["bucket_view"])
            ddp.register_comm_hook(None, noop_hook)
            opt: Any
            masters: list[Any] = []
            if run["master"]:
                opt = Float16MasterOptimizer(params, _adamw)
                masters = opt.masters
                tracker.track_external(opt.inner, *masters)
            else:
                opt = torch.optim.AdamW(params, lr=1e-4, foreach=True)
                tracker.track_external(opt)
            passes = _forward_backward(
                tracker, phases, steps, lambda: ddp(input_ids=ids, labels=ids).loss, _backward
            )
            for record in passes:
                opt_t = _optimizer_state_tensors(opt.inner if masters else opt)
                states = {
                    "parameters": _storage_bytes(params + masters),
                    "optimizer": _storage_bytes(t for t in opt_t if t.dim() > 0),
                    "step_counters": _storage_bytes(t for t in opt_t if t.dim() == 0),
                    # the .grad tensors; as bucket views they share the buckets' storage
                    "gradients": _storage_bytes(p.grad for p in params),
                }
                record["states"] = states
                with phases.phase(record, "step", "Temp"):
                    opt.step()
                with phases.phase(record, "zero_grad", "Temp"):
                    opt.zero_grad(set_to_none=True)
                record["states_after_step"] = {k: v for k, v in states.items() if k != "gradients"}
                iterations.append(record)
    return {
        "engine": engine,
        "loop": "loss",
        "iterations": iterations,
        "first": iterations[0],
        "steady": iterations[-1],
        "zro_partition_numel": None,
    }


__all__ = ["DDP_RUNS", "measure_ddp"]
