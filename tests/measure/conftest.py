"""The measurement suite's quick set: what CI runs unless ``--full`` is given.

Most measurement tests are grids (architecture x dtype x attention kernel x checkpointing ...).
The quick set keeps, per test function, the cases that first show each parameter value: every
architecture, dtype, kernel and recipe is measured at least once, and every unparametrized test
runs. ``nox -s measure -- --full`` (or ``pytest tests/measure --full``) runs every case.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--full",
        action="store_true",
        default=False,
        help="run every measured case, not only the quick set (each parameter value once)",
    )


def quick_cover(cases: list[tuple[str, dict[str, object]]]) -> set[str]:
    """Names of the cases that together show every (parameter, value) pair at least once.

    Greedy in collection order: a case is kept when it shows a pair no kept case shows.

    >>> grid = [(f"{a}-{d}", {"arch": a, "dtype": d}) for a in "xyz" for d in ("bf16", "fp32")]
    >>> sorted(quick_cover(grid))
    ['x-bf16', 'x-fp32', 'y-bf16', 'z-bf16']
    >>> sorted(quick_cover([("only", {})]))
    ['only']
    """
    seen: set[tuple[str, str]] = set()
    kept: set[str] = set()
    for name, params in cases:
        pairs = {(key, repr(value)) for key, value in params.items()}
        if not params or not pairs <= seen:
            kept.add(name)
            seen |= pairs
    return kept


HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--full", default=False):
        return
    by_function: dict[str, list[tuple[str, dict[str, object]]]] = {}
    for item in items:
        if HERE not in item.path.parents:  # the hook sees the whole session's items
            continue
        function = item.nodeid.split("[", 1)[0]
        callspec = getattr(item, "callspec", None)
        params = dict(callspec.params) if callspec is not None else {}
        by_function.setdefault(function, []).append((item.nodeid, params))
    kept: set[str] = set()
    for cases in by_function.values():
        kept |= quick_cover(cases)
    measured = {nodeid for cases in by_function.values() for nodeid, _ in cases}
    selected = [item for item in items if item.nodeid not in measured or item.nodeid in kept]
    deselected = [item for item in items if item.nodeid in measured and item.nodeid not in kept]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected
