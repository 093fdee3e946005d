"""Count the memory of real training steps with PyTorch: fake tensors on a CPU, or a CUDA GPU.

``measure_training_step`` builds the Hugging Face model of a ModelSpec, runs ``steps`` training
iterations (forward with HF's own causal-LM loss, backward, ``optimizer.step()``,
``optimizer.zero_grad()``), and reports bytes per category and per phase for every iteration.

* ``device="cpu"`` (default): inside ``FakeTensorMode`` under PyTorch's ``MemTracker`` --
  exact bytes of every tensor, nothing allocated. Categories are MemTracker's: Parameter, Buffer,
  Gradient, Activation (created in forward), Temp (created in backward), Optstate (optimizer
  states and the temporaries of ``step()``).
* ``device="cuda"``: real tensors on the GPU, counted by the CUDA caching allocator
  (``memory_allocated`` at phase ends, ``max_memory_allocated`` per phase after
  ``reset_peak_memory_stats``). Parameters, gradients and optimizer states are summed from the
  tensors themselves; the rest of the allocator's total is reported as "Activation" (forward) or
  "Temp" (backward, step).

ZeRO-3 is FSDP2 (``fully_shard`` per decoder layer and on the root) over a fake process group of
``zero3_ranks`` ranks, counted with ``FSDPMemTracker`` on the CPU path.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from vrammath.measure.build import (
    ATTENTIONS,
    PRECISIONS,
    as_spec,
    autocast_dtype,
    build_model,
    check_choice,
    check_positive,
    gelu_of,
    real_training_masks,
)
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError
from vrammath.notation.signatures import after

OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum")
IMPLEMENTATIONS = ("for-loop", "foreach", "fused")
RECOMPUTE = ("none", "full")
CATEGORIES = ("Parameter", "Buffer", "Gradient", "Activation", "Temp", "Optstate", "Other")
PHASES = ("forward", "backward", "step", "zero_grad")


@dataclass(frozen=True, kw_only=True)
class _Setup:
    """What a measured step runs with (recorded in this order with each measurement)."""

    batch: int = 1
    seq: int = 512
    precision: str = "bf16"
    attention: str = "sdpa"
    recompute: str = "none"
    optimizer: str = "adamw"
    implementation: str = "foreach"

    def recorded(self) -> dict[str, Any]:
        """The setup's fields and values, as a measurement records them."""
        return {key: getattr(self, key) for key in SETUP_KEYS}


SETUP_KEYS = tuple(f.name for f in fields(_Setup))
"""The setup's names: a matrix row's keys of the same names are the step's arguments."""


@dataclass(frozen=True, kw_only=True)
class StepRun(_Setup):
    """A training step to run: the ``model`` (positional), the setup (keyword-only), ``steps``
    iterations and, when given, only the first ``layers`` layers. What
    ``allocator_events.record_training_step`` takes."""

    model: ModelSpec | str | Mapping[str, object] = field(kw_only=False)
    steps: int = 2
    layers: int | None = None


@dataclass(frozen=True, kw_only=True)
class MeasuredRun(StepRun):
    """A :class:`StepRun` with the ranks ZeRO-3 shards over (None: no sharding) and the device.
    What :func:`measure_training_step` takes."""

    zero3_ranks: int | None = None
    device: str = "cpu"


def _lean_tracker(base: Any) -> Any:
    """A MemTracker (or FSDPMemTracker) subclass that keeps only the global peak.

    MemTracker updates the peak of every active module after every op, which makes a step cost
    O(L^2) in the number of layers (minutes for 80 layers); the phase peaks need only the global
    one.
    """
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY

    class Lean(base):  # type: ignore[misc]
        def _update_peak_stats(self, peak_state: Any) -> None:
            for dev, dev_snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < dev_snap[_TOTAL_KEY]:
                    self._peak_mem[dev] = dev_snap[_TOTAL_KEY]
                    self._peak_mem_snap[dev] = dict(dev_snap)

    return Lean


def _enable_checkpointing(model: Any) -> None:
    """transformers' per-layer activation checkpointing, non-reentrant (what training uses)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:  # transformers before 5.x
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _make_optimizer(params: Any, optimizer: str, implementation: str) -> Any:
    import torch

    check_choice("optimizer", optimizer, OPTIMIZERS)
    check_choice("implementation", implementation, IMPLEMENTATIONS)
    impl = {
        "for-loop": {"foreach": False, "fused": False},
        "foreach": {"foreach": True, "fused": False},
        "fused": {"foreach": False, "fused": True},
    }[implementation]
    if optimizer in ("adamw", "adam"):
        cls = torch.optim.AdamW if optimizer == "adamw" else torch.optim.Adam
        return cls(params, lr=1e-4, **impl)
    if implementation == "fused":
        raise InputError("implementation", "SGD has no fused variant here", got=implementation)
    momentum = 0.9 if optimizer == "sgd-momentum" else 0.0
    return torch.optim.SGD(params, lr=1e-3, momentum=momentum, foreach=impl["foreach"])


class _Phases:
    """Per-phase current and peak snapshots out of a MemTracker (or the CUDA allocator)."""

    def __init__(self, tracker: Any, cuda: bool, states: Any = None) -> None:
        self.tracker = tracker
        self.cuda = cuda
        self.states = states  # callable giving {category: bytes} of model states (CUDA path)

    def _snapshot(self, kind: str) -> dict[str, int]:
        if self.cuda:
            import torch

            total = (
                torch.cuda.max_memory_allocated()
                if kind == "peak"
                else torch.cuda.memory_allocated()
            )
            return {"Total": int(total)}
        return _by_category(self.tracker.get_tracker_snapshot(kind))

    def _reset_peak(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return
        # MemTracker has no public reset of its peak: restart it at the current snapshot.
        current = self.tracker.get_tracker_snapshot("current")
        self.tracker._peak_mem_snap = copy.deepcopy(current)
        self.tracker._peak_mem = {dev: snap["Total"] for dev, snap in current.items()}

    @contextlib.contextmanager
    def phase(self, record: dict[str, Any], name: str, fill: str) -> Iterator[None]:
        self._reset_peak()
        start = time.perf_counter()
        yield
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        end = self._snapshot("current")
        peak = self._snapshot("peak")
        if self.cuda:
            states = self.states()
            end = _split_cuda(end["Total"], states, fill)
            peak = _split_cuda(peak["Total"], states, fill)
        record[name] = {"end": end, "peak": peak, "seconds": round(time.perf_counter() - start, 3)}


class _DevicePhases(_Phases):
    """Phase snapshots of the CPU device only (MemTracker also counts meta tensors)."""

    def _snapshot(self, kind: str) -> dict[str, int]:
        snap = self.tracker.get_tracker_snapshot(kind)
        return _by_category(
            {dev: s for dev, s in snap.items() if getattr(dev, "type", str(dev)) != "meta"}
        )


def _forward_backward(
    tracker: Any,
    phases: _Phases,
    steps: int,
    forward: Callable[[], Any],
    backward: Callable[[Any], None],
) -> Iterator[dict[str, Any]]:
    """Each iteration's record after its forward (``forward()`` returns the loss) and backward
    phases, the tracker's module statistics reset first; the caller adds its step."""
    for _ in range(steps):
        tracker.reset_mod_stats()
        record: dict[str, Any] = {"start": phases._snapshot("current")}
        with phases.phase(record, "forward", "Activation"):
            loss = forward()
        with phases.phase(record, "backward", "Temp"):
            backward(loss)
            del loss
        yield record


def _by_category(snap: Mapping[Any, Mapping[Any, Any]]) -> dict[str, int]:
    """Bytes per category (and ``Total``) of a MemTracker snapshot, summed over its devices."""
    out = dict.fromkeys(CATEGORIES, 0)
    out["Total"] = 0
    for dev_snap in snap.values():
        for key, value in dev_snap.items():
            name = str(getattr(key, "value", key))  # MemTracker's keys are enums
            out[name] = out.get(name, 0) + int(value)
    return out


def _split_cuda(total: int, states: dict[str, int], fill: str) -> dict[str, int]:
    out = dict.fromkeys(CATEGORIES, 0)
    out.update(states)
    out[fill] = total - sum(states.values())
    out["Total"] = total
    return out


def _distinct_bytes(storages: Iterable[Any], key: Callable[[Any], int]) -> int:
    """Bytes of ``storages``, each storage (as ``key`` tells them apart) counted once."""
    seen: set[int] = set()
    total = 0
    for st in storages:
        if key(st) not in seen:
            seen.add(key(st))
            total += st.nbytes()
    return total


def _tensor_bytes(tensors: Any) -> int:
    storages = (t.untyped_storage() for t in tensors if t is not None)
    return _distinct_bytes(storages, lambda st: st.data_ptr())


@after(MeasuredRun)
def measure_training_step(run: MeasuredRun) -> dict[str, Any]:
    """Run ``steps`` training iterations of the real HF model and count their memory.

    Returns a dict with the setup, the torch/transformers versions, and ``iterations``: one
    record per iteration, each phase (forward, backward, step, zero_grad) with ``end`` and
    ``peak`` snapshots ({category: bytes, "Total": bytes}); ``first`` is iteration 1 and
    ``steady`` the last one (optimizer states already exist, gradients were freed by
    ``zero_grad(set_to_none=True)``). Under ZeRO-3 the numbers are per rank.
    """
    import torch
    import transformers

    zero3_ranks, steps, layers, device = run.zero3_ranks, run.steps, run.layers, run.device
    spec, gelu = _checked(run.model, run, steps, device)
    if zero3_ranks is not None:
        check_positive("zero3_ranks", zero3_ranks)
        if device == "cuda":
            raise InputError(
                "zero3_ranks", "ZeRO-3 is measured on the CPU path only", got=zero3_ranks
            )

    started = time.perf_counter()
    result: dict[str, Any] = {
        "model": spec.name,
        "setup": {
            **run.recorded(),
            "zero3_ranks": zero3_ranks,
            "steps": steps,
            "layers": spec.layers if layers is None else layers,
            "device": device,
            "gelu": None if spec.mlp.gated else gelu,
        },
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    if device == "cuda":
        iterations = _run_cuda(spec, run, steps, layers, gelu)
    else:
        iterations = _run_fake(spec, run, zero3_ranks, steps, layers, gelu)
    result["iterations"] = iterations
    result["first"] = iterations[0]
    result["steady"] = iterations[-1]
    result["seconds"] = round(time.perf_counter() - started, 2)
    return result


def _checked(
    model: ModelSpec | str | Mapping[str, object], setup: _Setup, steps: int, device: str = "cpu"
) -> tuple[ModelSpec, str]:
    """The spec and GeLU of ``model``, once the setup is checked (the optimizer is checked as
    it is made)."""
    spec = as_spec(model)
    gelu = gelu_of(model)
    check_choice("precision", setup.precision, PRECISIONS)
    check_choice("attention", setup.attention, ATTENTIONS)
    check_choice("recompute", setup.recompute, RECOMPUTE)
    check_choice("device", device, ("cpu", "cuda"))
    check_positive("batch", setup.batch)
    check_positive("seq", setup.seq)
    check_positive("steps", steps)
    return spec, gelu


def _loop(
    model: Any,
    opt: Any,
    phases: _Phases,
    ids: Any,
    precision: str,
    device_type: str,
    steps: int,
    start_snapshot: Any,
) -> list[dict[str, Any]]:
    import torch

    cast = autocast_dtype(precision)
    iterations = []
    for _ in range(steps):
        if phases.tracker is not None:
            phases.tracker.reset_mod_stats()  # MemTracker refuses a second call otherwise
        record: dict[str, Any] = {"start": start_snapshot()}
        with phases.phase(record, "forward", "Activation"):
            ctx = (
                torch.autocast(device_type=device_type, dtype=cast)
                if cast is not None
                else contextlib.nullcontext()
            )
            with ctx:
                loss = model(input_ids=ids, labels=ids).loss
        with phases.phase(record, "backward", "Temp"):
            loss.backward()
            del loss
        with phases.phase(record, "step", "Temp"):
            opt.step()
        with phases.phase(record, "zero_grad", "Temp"):
            opt.zero_grad(set_to_none=True)
        iterations.append(record)
    return iterations


def _training_model(spec: ModelSpec, setup: _Setup, layers: int | None, gelu: str) -> Any:
    """The seeded model of a measured step, checkpointed under full recomputation (call it
    inside ``FakeTensorMode`` or a ``torch.device`` context)."""
    import torch

    torch.manual_seed(0)
    model = build_model(
        spec, precision=setup.precision, attention=setup.attention, layers=layers, gelu=gelu
    )
    if setup.recompute == "full":
        _enable_checkpointing(model)
    return model


def _mem_tracker(*tracked: Any) -> Any:
    """A lean MemTracker that counts ``tracked`` (modules, optimizers, tensors) by category."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = _lean_tracker(MemTracker)()
    tracker.track_external(*tracked)
    return tracker


def _tracked_loop(
    tracker: Any, model: Any, opt: Any, ids: Any, precision: str, steps: int
) -> list[dict[str, Any]]:
    """:func:`_loop` on the CPU under ``tracker``, each phase's snapshots taken from it."""
    phases = _Phases(tracker, cuda=False)
    with tracker:
        return _loop(
            model, opt, phases, ids, precision, "cpu", steps, lambda: phases._snapshot("current")
        )


def _run_fake(
    spec: ModelSpec,
    setup: _Setup,
    zero3_ranks: int | None,
    steps: int,
    layers: int | None,
    gelu: str = "gelu_new",
) -> list[dict[str, Any]]:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    group = contextlib.ExitStack()
    with group:
        mesh = None
        if zero3_ranks is not None:
            mesh = group.enter_context(_fake_process_group(zero3_ranks))
        with real_training_masks(), FakeTensorMode():
            model = _training_model(spec, setup, layers, gelu)
            if mesh is not None:
                from torch.distributed.fsdp import fully_shard

                for block in _decoder_layers(model):
                    fully_shard(block, mesh=mesh)
                fully_shard(model, mesh=mesh)
            opt = _make_optimizer(model.parameters(), setup.optimizer, setup.implementation)
            ids = torch.randint(0, spec.vocab, (setup.batch, setup.seq))
            if mesh is not None:
                from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

                tracker = _lean_tracker(FSDPMemTracker)(model, opt)
            else:
                tracker = _mem_tracker(model, opt)
            return _tracked_loop(tracker, model, opt, ids, setup.precision, steps)
    raise AssertionError("unreachable")  # pragma: no cover


def _decoder_layers(model: Any) -> list[Any]:
    inner = getattr(model, "model", None) or getattr(model, "transformer", None)
    if inner is None:
        raise TypeError(f"{type(model).__name__}: no decoder (neither .model nor .transformer)")
    blocks = getattr(inner, "layers", None)
    if blocks is None:
        blocks = inner.h
    return list(blocks)


@contextlib.contextmanager
def _fake_process_group(world: int, rank: int = 0) -> Iterator[Any]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), world_size=world, rank=rank)
    try:
        yield init_device_mesh("cpu", (world,))
    finally:
        dist.destroy_process_group()


def _run_cuda(
    spec: ModelSpec, setup: _Setup, steps: int, layers: int | None, gelu: str = "gelu_new"
) -> list[dict[str, Any]]:
    import torch

    if not torch.cuda.is_available():
        raise InputError("device", "cuda was asked for and no CUDA GPU is visible", got="cuda")
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    with real_training_masks(), torch.device("cuda"):
        model = _training_model(spec, setup, layers, gelu)
        opt = _make_optimizer(model.parameters(), setup.optimizer, setup.implementation)
        ids = torch.randint(0, spec.vocab, (setup.batch, setup.seq))
    params = list(model.parameters())
    buffers = list(model.buffers())

    def states() -> dict[str, int]:
        opt_tensors = [
            v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)
        ]
        return {
            "Parameter": _tensor_bytes(params),
            "Buffer": _tensor_bytes(buffers),
            "Gradient": _tensor_bytes(p.grad for p in params),
            "Optstate": _tensor_bytes(t for t in opt_tensors if t.is_cuda),
            "Other": _tensor_bytes([ids]) + base,
        }

    phases = _Phases(None, cuda=True, states=states)

    def start() -> dict[str, int]:
        return _split_cuda(torch.cuda.memory_allocated(), states(), "Activation")

    iterations = _loop(model, opt, phases, ids, setup.precision, "cuda", steps, start)
    stats = torch.cuda.memory_stats()
    iterations[-1]["allocator"] = {
        k: int(v)
        for k, v in stats.items()
        if k.startswith(("reserved_bytes.all", "allocated_bytes.all", "num_alloc_retries"))
    }
    return iterations


__all__ = ["CATEGORIES", "IMPLEMENTATIONS", "OPTIMIZERS", "PHASES", "measure_training_step"]
