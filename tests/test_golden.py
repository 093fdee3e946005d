"""Every number of a fixed grid of setups is unchanged (tests/data/golden.json, tools/golden.py).

The grid covers every preset under fifteen training setups and four serving setups, and the
validation matrix's rows. A refactor must not move any of them; a change that is meant to move a
number regenerates the file (``python tools/golden.py``) and says which and why in its commit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import golden  # noqa: E402

GOLDEN: dict[str, Any] = json.loads((ROOT / "tests" / "data" / "golden.json").read_text())


@pytest.mark.parametrize("model", sorted(GOLDEN["params"]))
def test_training_and_serving_numbers_unchanged(model: str) -> None:
    import vrammath as vm

    assert vm.param_count(vm.load_model(model)) == GOLDEN["params"][model]
    for i, kw in enumerate(golden.TRAINING):
        assert golden._training(model, kw) == GOLDEN["training"][f"{model}/{i}"], (model, kw)
    for i, kw in enumerate(golden.SERVING):
        assert golden._serving(model, kw) == GOLDEN["serving"][f"{model}/{i}"], (model, kw)


def test_matrix_estimates_unchanged() -> None:
    from vrammath.measure.matrix import ROWS, estimate_row

    assert {r["id"]: estimate_row(r) for r in ROWS} == GOLDEN["matrix"]


def test_moved_lists_every_changed_leaf_with_its_change() -> None:
    old = {"training": {"m/0": {"totals": {"gpu": 200, "cpu": 0}}, "m/1": {"refused": True}}}
    new = {"training": {"m/0": {"totals": {"gpu": 150, "cpu": 0}}, "m/2": {"refused": True}}}
    assert golden.moved(old, new) == [
        "training/m/0/totals/gpu: 200 -> 150 (-25.00 %)",
        "training/m/1: {'refused': True} -> (absent)",
        "training/m/2: (absent) -> {'refused': True}",
    ]
    assert golden.moved(GOLDEN, GOLDEN) == []
