"""The allocations and frees of a training step, recorded on a CPU, for the allocator model.

:func:`record_training_step` builds the same Hugging Face model and runs the same loop as
:func:`vrammath.measure.step.measure_training_step` (forward with HF's loss, backward,
``optimizer.step()``, ``zero_grad(set_to_none=True)``), inside ``FakeTensorMode`` on ``cpu``, under
a ``TorchDispatchMode`` that logs every storage an op creates (its bytes) and the moment the
storage dies (a weak reference on the storage, as PyTorch's ``MemTracker`` does). Parameters,
buffers and the input ids are logged first, in the order the model holds them, as phase
``setup``; a zero-byte allocation marks the start of every phase. The log
(:class:`vrammath.terms.allocator.Event`, stream 0) replays through
:func:`vrammath.terms.allocator.predict`.

What a CPU log cannot match on CUDA: CPU kernels stand in for CUDA ones (attention kernels keep
differently shaped statistics, a GEMM may use a workspace), and the model's construction on a GPU
may create and free temporaries that the fake build does not. Adam's ``step`` counters live on the
host for the for-loop and foreach implementations, so they are dropped from the log unless the
implementation is ``fused``.

``python -m vrammath.measure.allocator_events --cuda --out validation/matrix-cuda.json`` (run by
``tools/gpu_measure.sh`` on a GPU machine) measures the matrix's GPU rows, each in a fresh process,
and writes the real ``max_memory_allocated`` / ``max_memory_reserved`` beside the prediction.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from vrammath.measure.build import real_training_masks
from vrammath.measure.documents import write_doc
from vrammath.measure.matrix import GPU_ROWS, _model_arg, row_args, run_cuda_rows
from vrammath.measure.step import StepRun, _checked, _loop, _make_optimizer, _training_model
from vrammath.model.presets import GPU, load_gpus
from vrammath.notation.signatures import after
from vrammath.terms.allocator import Event, predict


@dataclass(frozen=True)
class Recording:
    """An event log and the setup it was recorded for."""

    model: str
    setup: dict[str, Any]
    events: tuple[Event, ...]

    def to_json(self) -> dict[str, Any]:
        """A compact JSON form: events as ``[op, kind, nbytes, storage, stream, phase]`` rows."""
        rows = [[e.op, e.kind, e.nbytes, e.storage, e.stream, e.phase] for e in self.events]
        return {"model": self.model, "setup": self.setup, "events": rows}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Recording:
        """The inverse of :meth:`to_json`."""
        events = tuple(Event(*row) for row in data["events"])
        return cls(model=str(data["model"]), setup=dict(data["setup"]), events=events)


class _PhaseMarks:
    """What ``step._loop`` needs of its phases object: no tracker, a ``phase`` context."""

    tracker = None

    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder

    @contextlib.contextmanager
    def phase(self, record: dict[str, Any], name: str, fill: str) -> Iterator[None]:
        self.recorder.phase = name
        self.recorder.mark()
        yield
        record[name] = {}


def _recorder_class() -> Any:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    from torch.utils.weak import WeakIdKeyDictionary

    class Recorder(TorchDispatchMode):  # type: ignore[misc]
        """Logs the first sight of every storage an op returns, and the storage's death."""

        def __init__(self) -> None:
            super().__init__()
            self.events: list[Event] = []
            self.ids: WeakIdKeyDictionary = WeakIdKeyDictionary()
            self.op = 0
            self.phase = "setup"
            self.active = True
            self.next_id = 0

        def track(self, tensor: Any) -> None:
            storage = tensor.untyped_storage()
            if storage in self.ids:
                return
            sid = self.next_id
            self.next_id += 1
            self.ids[storage] = sid
            self.events.append(Event(self.op, "alloc", int(storage.nbytes()), sid, 0, self.phase))
            weakref.finalize(storage, self._freed, sid).atexit = False

        def mark(self) -> None:
            # a zero-byte allocation (CUDA hands out no memory for it) marks the phase's start,
            # so that a phase without allocations still starts its peaks in the replay
            self.events.append(Event(self.op, "alloc", 0, self.next_id, 0, self.phase))
            self.next_id += 1

        def _freed(self, sid: int) -> None:
            if self.active:
                self.events.append(Event(self.op, "free", 0, sid, 0, self.phase))

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            out = func(*args, **(kwargs or {}))
            self.op += 1
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    self.track(leaf)
            return out

    return Recorder


@after(StepRun)
def record_training_step(run: StepRun) -> Recording:
    """The allocation/free log of ``steps`` fake training iterations of the real HF model."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    steps, layers, implementation = run.steps, run.layers, run.implementation
    spec, gelu = _checked(run.model, run, steps)
    recorder = _recorder_class()()
    with real_training_masks(), FakeTensorMode():
        net = _training_model(spec, run, layers, gelu)
        opt = _make_optimizer(net.parameters(), run.optimizer, implementation)
        ids = torch.randint(0, spec.vocab, (run.batch, run.seq))
        for tensor in [*net.parameters(), *net.buffers(), ids]:
            recorder.track(tensor)
        with recorder:
            _loop(net, opt, _PhaseMarks(recorder), ids, run.precision, "cpu", steps, dict)
        recorder.active = False
        host = set()
        if implementation != "fused":
            for state in opt.state.values():
                step = state.get("step")
                if isinstance(step, torch.Tensor) and step.untyped_storage() in recorder.ids:
                    host.add(recorder.ids[step.untyped_storage()])
    events = tuple(e for e in recorder.events if e.storage not in host)
    recorded = {
        **run.recorded(),
        "steps": steps,
        "layers": spec.layers if layers is None else layers,
    }
    return Recording(model=spec.name, setup=recorded, events=events)


def gpu_for(name: str, capability: tuple[int, int]) -> GPU:
    """The preset whose label is the device's name, else one built from its compute capability
    (cuBLAS workspace 32 MiB on sm_90, 8 MiB + 128 KiB otherwise; context from the presets)."""
    presets = load_gpus()
    for preset in presets.values():
        if preset.label == name:
            return preset
    base = presets["H100-80GB" if capability == (9, 0) else "A100-80GB"]
    return replace(base, name=name, label=name, source="not a preset: built from the device")


def _measure_cuda_row(index: int) -> dict[str, Any]:
    """One GPU row on CUDA in this (fresh) process: the matrix's comparison of components
    (:func:`vrammath.measure.matrix.run_cuda_rows`), the allocator's peaks and the context."""
    import torch

    torch.cuda.init()
    entry = run_cuda_rows([GPU_ROWS[index]])[0]
    if "error" in entry:
        raise RuntimeError(entry["error"])
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    peaks = [int(peak["Total"]) for phases in entry["phases"].values() for peak in phases.values()]
    return {
        "device": torch.cuda.get_device_name(0),
        "capability": list(torch.cuda.get_device_capability(0)),
        "max_memory_allocated": max(peaks),
        # no empty_cache during the run: reserved only grows, so its value at the end is its peak
        "max_memory_reserved": int(entry["allocator"]["reserved_bytes.all.current"]),
        "num_alloc_retries": int(entry["allocator"].get("num_alloc_retries", 0)),
        # after run_cuda_rows' empty_cache: what the device holds beyond the allocator's segments
        "context_estimate": int(total - free) - int(torch.cuda.memory_reserved()),
        "components": entry["components"],
        "pass": entry["pass"],
    }


def _cheap_first(item: tuple[int, dict[str, Any]]) -> tuple[int, int]:
    row = item[1]
    rank = {"small-gqa": 0, "gpt2": 1}.get(row["model"], 2)
    return (rank, row["seq"] * row["batch"] + (1 if row["recompute"] != "none" else 0))


def cuda_rows(
    budget_s: float, doc: dict[str, Any], out: Path | None = None, rows: str | None = None
) -> list[dict[str, Any]]:
    """Each GPU row, cheapest first: measured on CUDA in a fresh process while its CPU log is
    recorded here, then predicted; ``doc["rows"]`` is written to ``out`` after every row.

    Rows are started while less than ``budget_s`` seconds have passed.
    """

    started = time.perf_counter()
    out_rows: list[dict[str, Any]] = doc.setdefault("rows", [])
    for index, row in sorted(enumerate(GPU_ROWS), key=_cheap_first):
        if rows and rows not in row["id"]:
            continue
        if time.perf_counter() - started > budget_s:
            out_rows.append({"id": row["id"], "skipped": f"time budget of {budget_s:.0f} s spent"})
            continue
        t0 = time.perf_counter()
        entry: dict[str, Any] = {"id": row["id"]}
        child = subprocess.Popen(
            [sys.executable, "-m", "vrammath.measure.allocator_events", "--row", str(index)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            rec = record_training_step(_model_arg(row["model"]), **row_args(row), steps=2)
            stdout, stderr = child.communicate()
            if child.returncode != 0:
                raise RuntimeError(f"exit {child.returncode}: {stderr[-2000:]}")
            measured = json.loads(stdout.strip().splitlines()[-1])
            gpu = gpu_for(measured["device"], tuple(measured["capability"]))
            pred = predict(rec.events, gpu)
            entry.update(
                measured=measured,
                predicted={
                    "gpu": pred.gpu,
                    "tensor_peak": pred.tensor_peak,
                    "max_memory_allocated": pred.allocated_peak,
                    "max_memory_reserved": pred.reserved_peak,
                    "workspace_bytes": pred.workspace_bytes,
                    "context_bytes": pred.context_bytes,
                },
                rel_error={
                    "allocated": pred.allocated_peak / measured["max_memory_allocated"] - 1,
                    "reserved": pred.reserved_peak / measured["max_memory_reserved"] - 1,
                    "context": pred.context_bytes / max(measured["context_estimate"], 1) - 1,
                },
            )
        except (ValueError, KeyError, RuntimeError) as exc:
            child.kill()
            entry["error"] = f"{type(exc).__name__}: {exc}"
        entry["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"{row['id']}: {entry.get('rel_error', entry.get('error'))}", flush=True)
        out_rows.append(entry)
        write_doc(out, doc)
    return out_rows


DOC_ROWS: list[dict[str, Any]] = [
    {
        "model": "small-gqa",
        "batch": 1,
        "seq": 512,
        "precision": "bf16",
        "attention": "sdpa",
        "implementation": "fused",
    },
    {
        "model": "small-tied-mqa",
        "batch": 4,
        "seq": 512,
        "precision": "bf16",
        "attention": "eager",
        "implementation": "foreach",
    },
]
"""The two small setups whose logs ``docs/validation/allocator.md`` replays (the first is also a
GPU row)."""


def record_docs(path: Path) -> None:
    """Record :data:`DOC_ROWS` (two iterations each) into ``path`` (compact JSON)."""

    logs = []
    for row in DOC_ROWS:
        args = {k: v for k, v in row.items() if k != "model"}
        rec = record_training_step(_model_arg(row["model"]), steps=2, **args)
        logs.append({**rec.to_json(), "model": row["model"]})
    import torch
    import transformers

    doc = {
        "command": "python -m vrammath.measure.allocator_events --record-docs " + str(path),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "event": ["op", "kind", "nbytes", "storage", "stream", "phase"],
        "recordings": logs,
    }
    path.write_text(json.dumps(doc, separators=(",", ":")) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vrammath.measure.allocator_events", description=__doc__
    )
    parser.add_argument("--cuda", action="store_true", help="measure and predict the GPU rows")
    parser.add_argument("--row", type=int, default=None, help="(internal) measure one GPU row")
    parser.add_argument("--rows", default=None, help="only GPU rows whose id contains this")
    parser.add_argument("--budget-s", type=float, default=300.0, help="start no row after this")
    parser.add_argument("--out", type=Path, default=None, help="write the comparison here")
    parser.add_argument("--record-docs", type=Path, default=None, help="write the docs' logs here")
    args = parser.parse_args(argv)
    if args.record_docs is not None:
        record_docs(args.record_docs)
        return 0
    if args.row is not None:
        print(json.dumps(_measure_cuda_row(args.row)))
        return 0
    if not args.cuda:
        parser.error("nothing to do: pass --cuda")
    import torch
    import transformers

    doc: dict[str, Any] = {
        "command": "python -m vrammath.measure.allocator_events --cuda",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "method": "measured: max over phases of max_memory_allocated and reserved_bytes.all.current "
        "at the end (no empty_cache, so its peak), each row in a fresh process; context_estimate: "
        "device memory in use (cudaMemGetInfo) minus memory_reserved after empty_cache; "
        "predicted: vrammath.terms.allocator.predict over the CPU event log of the same row, with the "
        "GPU preset whose label is the device name",
        "rows": [],
    }
    cuda_rows(args.budget_s, doc, args.out, args.rows)
    write_doc(args.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["DOC_ROWS", "Recording", "cuda_rows", "gpu_for", "record_docs", "record_training_step"]
