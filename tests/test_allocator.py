"""The caching-allocator model: its rules on single requests, and properties of any log."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vrammath.model.presets import gpu
from vrammath.notation.errors import InputError
from vrammath.terms.allocator import (
    K_LARGE_BUFFER,
    K_SMALL_BUFFER,
    Event,
    predict,
    replay,
    round_size,
    segment_size,
    with_workspaces,
)

MiB = 2**20

# sizes spread over the small pool, the 20 MiB band and large requests
SIZES = st.one_of(
    st.integers(0, 4096),
    st.integers(4096, MiB + 4096),
    st.integers(MiB, 12 * MiB),
    st.integers(10 * MiB, 64 * MiB),
)


@st.composite
def logs(draw: st.DrawFn, sizes: st.SearchStrategy[int] = SIZES) -> list[Event]:
    """A valid log: allocations, and frees of live storages only; some left live at the end."""
    live: list[int] = []
    events: list[Event] = []
    for op in range(draw(st.integers(1, 40))):
        if live and draw(st.booleans()):
            sid = live.pop(draw(st.integers(0, len(live) - 1)))
            events.append(Event(op, "free", 0, sid))
        else:
            events.append(Event(op, "alloc", draw(sizes), op))
            live.append(op)
    return events


def free_all(events: list[Event], start: int) -> list[Event]:
    freed = {e.storage for e in events if e.kind == "free"}
    live = [e.storage for e in events if e.kind == "alloc" and e.storage not in freed]
    return [Event(start + i, "free", 0, sid) for i, sid in enumerate(live)]


def renamed(events: list[Event], offset: int) -> list[Event]:
    return [Event(e.op + offset, e.kind, e.nbytes, e.storage + offset) for e in events]


def test_constants_are_pytorchs() -> None:
    assert (round_size(1), round_size(512), round_size(513)) == (512, 512, 1024)
    assert segment_size(MiB) == K_SMALL_BUFFER == 2 * MiB
    assert segment_size(MiB + 512) == K_LARGE_BUFFER == 20 * MiB
    assert segment_size(10 * MiB - 512) == 20 * MiB
    assert segment_size(10 * MiB) == 10 * MiB
    assert segment_size(10 * MiB + 512) == 12 * MiB


@pytest.mark.parametrize(
    ("nbytes", "allocated", "reserved"),
    [
        (1, 512, 2 * MiB),  # small pool: 512-byte block in a 2 MiB segment
        (MiB, MiB, 2 * MiB),  # the largest small request
        (MiB + 1, MiB + 512, 20 * MiB),  # 1-10 MiB: split from a 20 MiB segment
        (19 * MiB + 1, 20 * MiB, 20 * MiB),  # remainder < 1 MiB: the whole segment is allocated
        (21 * MiB, 22 * MiB, 22 * MiB),  # 22 MiB segment, remainder 1 MiB is not > 1 MiB
    ],
)
def test_single_request(nbytes: int, allocated: int, reserved: int) -> None:
    r = replay([Event(0, "alloc", nbytes, 1)])
    assert (r.requested_peak, r.allocated_peak, r.reserved_peak) == (nbytes, allocated, reserved)


@given(SIZES.filter(lambda n: n > 0))
def test_single_allocation_rounding(nbytes: int) -> None:
    r = replay([Event(0, "alloc", nbytes, 1)])
    size = round_size(nbytes)
    assert size % 512 == 0
    assert nbytes <= size < nbytes + 512
    segment = segment_size(size)
    assert r.reserved_peak == segment
    assert r.segments == 1
    # split unless the remainder is too small: then the block is the whole segment
    split = segment - size >= 512 if size <= MiB else segment - size > MiB
    assert r.allocated_peak == (size if split else segment)


@settings(max_examples=200, deadline=None)
@given(logs())
def test_reserved_at_least_allocated_at_least_requested(events: list[Event]) -> None:
    for n in range(1, len(events) + 1):
        r = replay(events[:n])
        assert r.reserved_end >= r.allocated_end >= r.requested_end >= 0
    assert r.reserved_peak >= r.allocated_peak >= r.requested_peak
    assert r.allocated_end - r.requested_end < 512 * len(events) + 20 * MiB * r.segments


@settings(max_examples=200, deadline=None)
@given(logs(st.integers(0, MiB)))
def test_replaying_after_freeing_everything_reuses_segments(events: list[Event]) -> None:
    # in the small pool every segment is 2 MiB, so a second pass meets whole free segments in the
    # order the first pass created them and best fit makes the same choices
    first = events + free_all(events, len(events))
    twice = first + renamed(first, 10**6)
    once, again = replay(first), replay(twice)
    assert once.allocated_end == once.requested_end == 0
    assert again.reserved_peak == once.reserved_peak
    assert again.segments == once.segments


def test_a_second_pass_can_need_a_new_large_segment() -> None:
    # Large segments differ in size, and best fit is not order-stable: after everything is freed,
    # the small request takes the 10 MiB segment the third request had, and the third request no
    # longer fits anywhere. The real allocator does this too (a step's second iteration can
    # reserve more than the first), so reserved may grow across identical iterations.
    sizes = [MiB + 1, 10 * MiB + 1, 10 * MiB - 511]
    events = [Event(i, "alloc", n, i) for i, n in enumerate(sizes)]
    first = events + free_all(events, 3)
    once, again = replay(first), replay(first + renamed(first, 100))
    assert (once.reserved_peak, once.segments) == (30 * MiB, 2)
    assert (again.reserved_peak, again.segments) == (40 * MiB, 3)


def test_coalescing_gives_the_segment_back_whole() -> None:
    events = [Event(i, "alloc", 3 * MiB, i) for i in range(6)]  # 18 MiB of one 20 MiB segment
    events += [Event(10 + i, "free", 0, i) for i in (0, 2, 4, 1, 3, 5)]  # holes, then merges
    events.append(Event(20, "alloc", 19 * MiB, 99))  # fits only if the holes merged
    r = replay(events)
    assert r.segments == 1
    assert r.reserved_peak == 20 * MiB


def test_best_fit_takes_the_smallest_free_block() -> None:
    events = [
        Event(0, "alloc", 12 * MiB, 1),  # 12 MiB segment
        Event(1, "alloc", 16 * MiB, 2),  # 16 MiB segment
        Event(2, "free", 0, 1),
        Event(3, "free", 0, 2),
        Event(4, "alloc", 11 * MiB, 3),  # best fit: the 12 MiB block
        Event(5, "alloc", 15 * MiB, 4),  # the 16 MiB block is still there
    ]
    assert replay(events).segments == 2


def test_streams_do_not_share_blocks() -> None:
    events = [Event(0, "alloc", 100, 1, 0), Event(1, "free", 0, 1, 0)]
    events.append(Event(2, "alloc", 100, 2, 1))
    assert replay(events).reserved_peak == 2 * K_SMALL_BUFFER


def test_phase_peaks_restart_at_each_phase() -> None:
    events = [
        Event(0, "alloc", 10 * MiB, 1, phase="forward"),
        Event(1, "free", 0, 1, phase="forward"),
        Event(2, "alloc", MiB, 2, phase="backward"),
    ]
    peaks = {p.phase: p.requested for p in replay(events).phases}
    assert peaks == {"forward": 10 * MiB, "backward": MiB}


def test_bad_logs_are_refused() -> None:
    with pytest.raises(InputError, match="events"):
        replay([Event(0, "free", 0, 1)])
    with pytest.raises(InputError, match="events"):
        replay([Event(0, "alloc", 8, 1), Event(1, "alloc", 8, 1)])
    with pytest.raises(InputError, match="kind"):
        replay([Event(0, "malloc", 8, 1)])
    with pytest.raises(InputError, match="handles"):
        predict([], handles=3)


def test_workspaces_and_context_from_the_gpu_preset() -> None:
    events = [
        Event(0, "alloc", 4 * MiB, 1, phase="forward"),
        Event(1, "alloc", 4 * MiB, 2, phase="backward"),
    ]
    h100, a100 = gpu("H100-80GB"), gpu("A100-80GB")
    assert h100.cublas_workspace_bytes == 32 * MiB  # Hopper default, 4096 KiB x 8
    assert a100.cublas_workspace_bytes == 4096 * 1024 * 2 + 16 * 1024 * 8
    p = predict(events, h100)
    assert p.workspace_bytes == 2 * (32 * MiB + MiB)
    assert p.tensor_peak == 8 * MiB
    assert p.allocated_peak == 8 * MiB + 2 * (32 * MiB + MiB)
    assert p.allocated_overhead == p.workspace_bytes
    # each 32 MiB workspace is a segment; the two 1 MiB ones share one 2 MiB small segment
    assert p.reserved_peak == 20 * MiB + 2 * 32 * MiB + 2 * MiB
    assert p.device_peak == p.reserved_peak + h100.context_bytes
    one = predict(events, h100, handles=1)
    assert one.workspace_bytes == 33 * MiB
    placed = with_workspaces(events, [5, 7], first_in=["backward", "forward"])
    assert [(e.nbytes, e.phase) for e in placed] == [
        (7, "forward"),
        (4 * MiB, "forward"),
        (5, "backward"),
        (4 * MiB, "backward"),
    ]
