"""PyTorch's CUDA caching allocator, modelled: from tensor bytes to what a GPU reports.

Explanation
===========

vrammath counts tensor bytes. A CUDA GPU under PyTorch reports more: ``max_memory_allocated``
counts the allocator's *blocks* (every request rounded up to 512 bytes, and a large request
served whole from a block whose remainder is too small to split), and ``max_memory_reserved``
counts the *segments* obtained from ``cudaMalloc`` (2 MiB for small requests, 20 MiB for
requests between 1 and 10 MiB, larger ones rounded up to 2 MiB), free space inside them
included. :func:`replay` runs a log of allocations and frees (:class:`Event`, recorded from a fake
training step by ``vrammath.measure.allocator_events``) through the documented rules of
``c10/cuda/CUDACachingAllocator.cpp``:

* sizes rounded up to ``K_MIN_BLOCK_SIZE`` (512 B);
* requests up to ``K_SMALL_SIZE`` (1 MiB) use the small pool, whose segments are
  ``K_SMALL_BUFFER`` (2 MiB); larger ones the large pool, whose segments are ``K_LARGE_BUFFER``
  (20 MiB) for requests under ``K_MIN_LARGE_ALLOC`` (10 MiB) and the request rounded up to
  ``K_ROUND_LARGE`` (2 MiB) otherwise;
* best fit: the smallest cached free block of the pool on the same stream that is large enough
  (ties by address);
* a block is split when the remainder is at least 512 B (small pool) or more than 1 MiB (large
  pool); a freed block merges with free neighbours of its segment;
* the defaults are modelled: no ``max_split_size_mb``, no ``expandable_segments``, no
  ``roundup_power2_divisions``, no ``garbage_collection_threshold``, no ``empty_cache`` and no
  memory limit (segments are never returned to the driver).

:func:`predict` adds the cuBLAS / cuBLASLt workspaces (allocated *through* the caching allocator,
one per handle and stream) and the CUDA context (outside it), both read from the GPU preset.

The prediction is unvalidated on a real GPU until ``tools/gpu_measure.sh`` has been run on one.

Examples
========

>>> round_size(1), round_size(513), segment_size(round_size(3 * 2**20)) // 2**20
(512, 1024, 20)
>>> events = [Event(0, "alloc", 3 * 2**20, 1), Event(1, "alloc", 100, 2), Event(2, "free", 0, 1)]
>>> r = replay(events)
>>> r.requested_peak, r.allocated_peak, r.reserved_peak // 2**20
(3145828, 3146240, 22)

References
==========

.. [1] PyTorch, "CUDA semantics: memory management",
   https://pytorch.org/docs/stable/notes/cuda.html#memory-management
.. [2] pytorch/pytorch, ``c10/cuda/CUDACachingAllocator.cpp`` at commit
   001074d25084fdb87a799823e395a50f5ec044d3: ``kMinBlockSize``, ``kSmallSize``, ``kSmallBuffer``,
   ``kMinLargeAlloc``, ``kRoundLarge`` near the top of the file, ``kLargeBuffer`` in the
   ``cuda::CUDACachingAllocator`` namespace; ``round_size``, ``get_allocation_size``,
   ``should_split``, ``get_free_block``, ``free_block``, ``try_merge_blocks`` in
   ``DeviceCachingAllocator``.
.. [3] pytorch/pytorch, ``aten/src/ATen/cuda/CublasHandlePool.cpp`` at commit
   26a39059ec580351411f180816c47e2ef5134ae1: ``parseChosenWorkspaceSize`` (cuBLAS workspace per
   handle and stream, through the caching allocator), ``parseCUDABlasLtWorkspaceSize``.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vrammath.model.presets import GPU
from vrammath.notation.errors import InputError, one_of

#: all sizes are rounded up to a multiple of 512 bytes (``kMinBlockSize``)
K_MIN_BLOCK_SIZE = 512
#: the largest "small" request, 1 MiB (``kSmallSize``)
K_SMALL_SIZE = 1_048_576
#: small requests are packed in 2 MiB segments (``kSmallBuffer``)
K_SMALL_BUFFER = 2_097_152
#: requests between 1 and 10 MiB get 20 MiB segments (``kLargeBuffer``)
K_LARGE_BUFFER = 20_971_520
#: from 10 MiB on, a segment is the request rounded up to ``K_ROUND_LARGE`` (``kMinLargeAlloc``)
K_MIN_LARGE_ALLOC = 10_485_760
#: large segments are rounded up to 2 MiB (``kRoundLarge``)
K_ROUND_LARGE = 2_097_152

KINDS = ("alloc", "free")


@dataclass(frozen=True)
class Event:
    """One allocation or free of a storage: op index, ``"alloc"`` / ``"free"``, bytes asked for
    (ignored on a free), a storage id unique while it lives, the CUDA stream, and the phase of
    the training step it happened in."""

    op: int
    kind: str
    nbytes: int
    storage: int
    stream: int = 0
    phase: str = ""


@dataclass(frozen=True)
class PhasePeak:
    """Peaks within one phase, as ``reset_peak_memory_stats`` at the phase's start would give."""

    phase: str
    requested: int
    allocated: int
    reserved: int


@dataclass(frozen=True)
class Replay:
    """What replaying an event log gives: peak requested (tensor bytes), allocated (rounded
    blocks in use) and reserved (segments) bytes, their values at the end, the number of
    segments, and the peaks per phase in order of first appearance."""

    requested_peak: int
    allocated_peak: int
    reserved_peak: int
    requested_end: int
    allocated_end: int
    reserved_end: int
    segments: int
    phases: tuple[PhasePeak, ...]


def round_size(nbytes: int) -> int:
    """The block size a request of ``nbytes`` takes: at least 512, a multiple of 512.

    >>> [round_size(n) for n in (0, 512, 1000, 2**20 + 1)]
    [512, 512, 1024, 1049088]
    """
    if nbytes < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    return K_MIN_BLOCK_SIZE * -(-nbytes // K_MIN_BLOCK_SIZE)


def segment_size(size: int) -> int:
    """The ``cudaMalloc`` size for a rounded request that finds no cached block
    (``get_allocation_size``).

    >>> [segment_size(s) // 2**20 for s in (512, 2**20, 2**20 + 512, 10 * 2**20 + 512)]
    [2, 2, 20, 12]
    """
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * -(-size // K_ROUND_LARGE)


def _should_split(small: bool, block_size: int, size: int) -> bool:
    remaining = block_size - size
    return remaining >= K_MIN_BLOCK_SIZE if small else remaining > K_SMALL_SIZE


class _Block:
    """A block of a segment (mutable simulator state, private to :func:`replay`)."""

    __slots__ = ("addr", "allocated", "next", "prev", "size", "small", "stream")

    def __init__(self, addr: int, size: int, small: bool, stream: int) -> None:
        self.addr = addr
        self.size = size
        self.small = small
        self.stream = stream
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None

    def key(self) -> tuple[int, int, int]:
        # the pools' order (BlockComparatorSize): stream, then size, then address
        return (self.stream, self.size, self.addr)


class _Allocator:
    """The caching allocator's state while one log is replayed."""

    def __init__(self) -> None:
        self.pools: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}
        self.free_blocks: dict[tuple[int, int, int], _Block] = {}
        self.live: dict[int, tuple[_Block, int]] = {}
        self.next_addr = 0
        self.requested = 0
        self.allocated = 0
        self.reserved = 0
        self.segments = 0

    def _insert(self, block: _Block) -> None:
        key = block.key()
        bisect.insort(self.pools[block.small], key)
        self.free_blocks[key] = block

    def _remove(self, block: _Block) -> None:
        key = block.key()
        pool = self.pools[block.small]
        del pool[bisect.bisect_left(pool, key)]
        del self.free_blocks[key]

    def _best_fit(self, small: bool, size: int, stream: int) -> _Block | None:
        pool = self.pools[small]
        i = bisect.bisect_left(pool, (stream, size, -1))
        if i == len(pool) or pool[i][0] != stream:
            return None
        block = self.free_blocks[pool[i]]
        self._remove(block)
        return block

    def malloc(self, storage: int, nbytes: int, stream: int) -> None:
        if storage in self.live:
            raise InputError("events", "a storage was allocated twice without a free", storage)
        size = round_size(nbytes)
        small = size <= K_SMALL_SIZE
        block = self._best_fit(small, size, stream)
        if block is None:
            grant = segment_size(size)
            block = _Block(self.next_addr, grant, small, stream)
            self.next_addr += grant
            self.reserved += grant
            self.segments += 1
        if _should_split(small, block.size, size):
            rest = _Block(block.addr + size, block.size - size, small, stream)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._insert(rest)
        block.allocated = True
        self.live[storage] = (block, nbytes)
        self.allocated += block.size
        self.requested += nbytes

    def free(self, storage: int) -> None:
        if storage not in self.live:
            raise InputError("events", "a free of a storage that is not allocated", storage)
        block, nbytes = self.live.pop(storage)
        block.allocated = False
        self.allocated -= block.size
        self.requested -= nbytes
        prev, nxt = block.prev, block.next
        if prev is not None and not prev.allocated:
            self._remove(prev)
            block.addr, block.size = prev.addr, block.size + prev.size
            block.prev = prev.prev
            if block.prev is not None:
                block.prev.next = block
        if nxt is not None and not nxt.allocated:
            self._remove(nxt)
            block.size += nxt.size
            block.next = nxt.next
            if block.next is not None:
                block.next.prev = block
        self._insert(block)


def replay(events: Iterable[Event]) -> Replay:
    """Replay an event log through the caching allocator's rules; peaks and end state.

    Explanation
    ===========

    A zero-byte request allocates nothing on CUDA (the allocator hands out a null pointer), so
    it is counted in no pool; its free is ignored too. Phase peaks restart at the current values
    when the phase changes, as ``torch.cuda.reset_peak_memory_stats()`` at a phase boundary does.

    Examples
    ========

    Freeing everything and asking again reuses the cached segment:

    >>> once = [Event(0, "alloc", 4096, 1), Event(1, "free", 0, 1)]
    >>> again = once + [Event(2, "alloc", 4096, 2), Event(3, "free", 0, 2)]
    >>> replay(once).reserved_peak == replay(again).reserved_peak == 2**21
    True

    Parameters
    ==========

    events : iterable of Event
        The log, in order; a free names a storage allocated earlier and not yet freed.
    """
    state = _Allocator()
    peak = [0, 0, 0]
    phases: dict[str, list[int]] = {}
    current = None
    zero: set[int] = set()
    for event in events:
        if event.kind not in KINDS:
            raise one_of("kind", event.kind, KINDS)
        if event.phase != current:
            current = event.phase
            phases.setdefault(current, [0, 0, 0])
            row = phases[current]
            now = (state.requested, state.allocated, state.reserved)
            phases[current] = [max(a, b) for a, b in zip(row, now, strict=True)]
        if event.kind == "alloc":
            if event.nbytes < 0:
                raise InputError("nbytes", "must be a non-negative integer", event.nbytes)
            if event.nbytes == 0:
                zero.add(event.storage)
                continue
            state.malloc(event.storage, event.nbytes, event.stream)
        elif event.storage in zero:
            zero.discard(event.storage)
            continue
        else:
            state.free(event.storage)
        now = (state.requested, state.allocated, state.reserved)
        peak = [max(a, b) for a, b in zip(peak, now, strict=True)]
        row = phases[current]
        phases[current] = [max(a, b) for a, b in zip(row, now, strict=True)]
    return Replay(
        requested_peak=peak[0],
        allocated_peak=peak[1],
        reserved_peak=peak[2],
        requested_end=state.requested,
        allocated_end=state.allocated,
        reserved_end=state.reserved,
        segments=state.segments,
        phases=tuple(PhasePeak(name, *values) for name, values in phases.items()),
    )


@dataclass(frozen=True)
class AllocatorPrediction:
    """What a CUDA GPU would report for a recorded step, and the overheads over tensor bytes.

    ``tensor_peak`` is the peak of the tensor bytes alone (what vrammath's terms count);
    ``allocated_peak`` / ``reserved_peak`` are the predicted ``max_memory_allocated`` /
    ``max_memory_reserved`` (library workspaces included); ``device_peak`` adds the CUDA context,
    which lies outside the allocator (what ``nvidia-smi`` would show at the peak).
    """

    gpu: str | None
    tensor_peak: int
    allocated_peak: int
    reserved_peak: int
    workspace_bytes: int
    context_bytes: int
    replay: Replay

    @property
    def device_peak(self) -> int:
        """Reserved bytes plus the CUDA context."""
        return self.reserved_peak + self.context_bytes

    @property
    def allocated_overhead(self) -> int:
        """Predicted ``max_memory_allocated`` minus the tensor-byte peak."""
        return self.allocated_peak - self.tensor_peak

    @property
    def reserved_overhead(self) -> int:
        """Predicted ``max_memory_reserved`` minus the tensor-byte peak."""
        return self.reserved_peak - self.tensor_peak


def with_workspaces(
    events: Sequence[Event], workspaces: Sequence[int], *, first_in: Sequence[str]
) -> list[Event]:
    """The log with library workspaces allocated (never freed) where each handle first runs.

    ``workspaces[i]`` bytes are allocated just before the first event of phase ``first_in[i]``
    (PyTorch allocates a cuBLAS workspace per handle and stream on first use, and keeps it).
    Storage ids for them are negative, so they never collide with recorded ones.

    >>> log = [Event(0, "alloc", 8, 1, phase="forward")]
    >>> [(e.nbytes, e.storage) for e in with_workspaces(log, [64], first_in=["forward"])]
    [(64, -1), (8, 1)]
    """
    if len(workspaces) != len(first_in):
        raise InputError("workspaces", "needs one phase per workspace", len(workspaces))
    out: list[Event] = []
    pending = list(zip(workspaces, first_in, strict=True))
    sid = 0
    for event in events:
        keep = []
        for size, phase in pending:
            if phase == event.phase:
                sid -= 1
                out.append(Event(event.op, "alloc", size, sid, event.stream, event.phase))
            else:
                keep.append((size, phase))
        pending = keep
        out.append(event)
    return out


def predict(
    events: Sequence[Event], gpu: GPU | None = None, *, handles: int = 2
) -> AllocatorPrediction:
    """Predicted ``max_memory_allocated`` / ``max_memory_reserved`` of a recorded training step.

    Explanation
    ===========

    The input is an event log (``vrammath.measure.allocator_events.record_training_step``),
    not an :class:`~vrammath.compose.estimate.Estimate`: fragmentation depends on the order of
    allocations and frees, which a per-phase sum of terms does not hold.

    With a GPU preset, each of ``handles`` cuBLAS handles gets the preset's cuBLAS and cuBLASLt
    workspaces through the caching allocator: the first when the forward starts (the main
    thread), the second when the backward starts (autograd runs CUDA backward on its own device
    thread, which reserves its own handle). The CUDA context is added to ``device_peak`` only.

    Examples
    ========

    >>> log = [Event(0, "alloc", 1000, 1, phase="forward"), Event(1, "free", 0, 1, "forward")]
    >>> p = predict(log)
    >>> p.tensor_peak, p.allocated_peak, p.reserved_peak
    (1000, 1024, 2097152)

    Parameters
    ==========

    events : sequence of Event
        The recorded log (its phases ``forward`` and ``backward`` place the workspaces).
    gpu : GPU or None
        A :class:`~vrammath.model.presets.GPU` preset; ``None`` leaves workspaces and context out.
    handles : int
        The cuBLAS handles that run, 1 or 2 (1: the forward's thread only, 2: and autograd's
        thread).
    """
    if handles not in (1, 2):
        raise InputError("handles", "must be 1 or 2", got=handles)
    workspace = 0
    log: Sequence[Event] = events
    if gpu is not None:
        sizes = [gpu.cublas_workspace_bytes, gpu.cublaslt_workspace_bytes]
        phases = ["forward", "backward"][:handles]
        per = [s for s in sizes if s > 0]
        log = with_workspaces(
            events, [s for _ in phases for s in per], first_in=[p for p in phases for _ in per]
        )
        workspace = handles * sum(per)
    tensors = replay(events)
    result = replay(log)
    return AllocatorPrediction(
        gpu=None if gpu is None else gpu.name,
        tensor_peak=tensors.requested_peak,
        allocated_peak=result.allocated_peak,
        reserved_peak=result.reserved_peak,
        workspace_bytes=workspace,
        context_bytes=0 if gpu is None else gpu.context_bytes,
        replay=result,
    )


__all__ = [
    "K_LARGE_BUFFER",
    "K_MIN_BLOCK_SIZE",
    "K_MIN_LARGE_ALLOC",
    "K_ROUND_LARGE",
    "K_SMALL_BUFFER",
    "K_SMALL_SIZE",
    "AllocatorPrediction",
    "Event",
    "PhasePeak",
    "Replay",
    "predict",
    "replay",
    "round_size",
    "segment_size",
    "with_workspaces",
]
