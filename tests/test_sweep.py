"""Sensitivities and sweeps: rates against finite differences, sweeps against estimate()."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from vrammath.answers.budget import (
    exact_bytes,
)
from vrammath.answers.fit import largest_micro_batch
from vrammath.answers.sweep import compiled_cache_info, ranking, sensitivities, sweep
from vrammath.compose.estimate import estimate
from vrammath.compose.setup import Setup, with_changes
from vrammath.model.presets import load_model
from vrammath.notation.errors import InputError
from vrammath.notation.symbols import N_d, b, s

MODELS = ("gpt2", "llama-7b", "qwen2-7b", "llama-2-70b", "qwen2-72b")

TEXT: Any = "A100-80GB"  # text where an object belongs: the API must refuse it


def test_sensitivities_match_finite_differences() -> None:
    est = estimate(Setup(load_model("llama-7b"), zero=3, gpus=8, seq_len=4096))
    rows = {(x.component, str(x.knob)): x for x in sensitivities(est)}
    total_s = rows[("total", "s")]
    f = sympy.lambdify(s, est.gpu_expr().subs({k: v for k, v in est.values.items() if k != s}))
    fd = (f(4096 + 1) - f(4096 - 1)) / 2
    assert total_s.rate == pytest.approx(fd, rel=1e-9)
    assert rows[("optimizer", "N_d")].elasticity == pytest.approx(-1.0)
    assert rows[("weights", "b")].rate == 0
    # halving s saves what the exact re-evaluation says
    halved = exact_bytes([est.gpu_expr()], {**est.values, s: 2048})
    assert total_s.step_saving == exact_bytes([est.gpu_expr()], est.values) - halved


def test_stepwise_terms() -> None:
    # HF's loss keeps 8 more bytes at b = 1 only: derivative 0, the solve is still exact
    est = estimate(Setup(load_model("llama-7b"), zero=3, gpus=8, gpu="A100-80GB"))
    assert est.gpu_expr().has(sympy.KroneckerDelta)
    rows = {(x.component, str(x.knob)): x for x in sensitivities(est)}
    assert rows[("total", "b")].rate > 0
    sol = largest_micro_batch(est)
    assert sol.method == "closed-form"  # the delta is smoothed away, then checked exactly
    assert sol.verified
    assert sol.value is not None
    out = sweep(est, {"b": np.array([1, 2, sol.value, sol.value + 1])})
    expected = [
        estimate(with_changes(est.setup, micro_batch=n)).gpu_bytes
        for n in (1, 2, sol.value, sol.value + 1)
    ]
    assert out.tolist() == expected


def test_ranking_orders_by_step_saving() -> None:
    est = estimate(Setup(load_model("llama-7b"), zero=3, gpus=8, micro_batch=8))
    order = ranking(est)
    savings = [x.step_saving for x in order]
    assert savings == sorted(savings, reverse=True)
    assert {str(x.knob) for x in order} == {"b", "s", "N_d", "t", "p"}


# --- sweeps -----------------------------------------------------------------------------------


@settings(max_examples=15)  # each example re-runs estimate(): keep the suite inside CI's budget
@given(
    n_d=st.lists(st.integers(1, 4096), min_size=1, max_size=5),
    stage=st.sampled_from([0, 1, 2, 3]),
    model=st.sampled_from(MODELS),
)
def test_sweep_matches_estimate(n_d: list[int], stage: int, model: str) -> None:
    est = estimate(Setup(load_model(model), zero=stage, gpus=8))
    out = sweep(est, {"N_d": np.array(n_d)})
    expected = [estimate(with_changes(est.setup, gpus=n)).gpu_bytes for n in n_d]
    assert out.tolist() == expected


@settings(max_examples=15)  # each example substitutes into sympy: see above
@given(bs=st.lists(st.tuples(st.integers(1, 64), st.integers(1, 32768)), min_size=1, max_size=10))
def test_sweep_matches_exact_with_b_and_s(bs: list[tuple[int, int]]) -> None:
    est = estimate(Setup(load_model("llama-7b"), zero=3, gpus=8))
    arr = np.array(bs)
    out = sweep(est, {b: arr[:, 0], s: arr[:, 1]})
    expected = [exact_bytes([est.gpu_expr()], {**est.values, b: int(x), s: int(y)}) for x, y in bs]
    assert out.tolist() == expected


def test_sweep_broadcasts_and_caches() -> None:
    est = estimate(Setup(load_model("llama-7b"), zero=3, gpus=8))
    grid = sweep(est, {"b": np.arange(1, 5)[:, None], "s": np.array([512, 1024, 2048])[None, :]})
    assert grid.shape == (4, 3)
    assert grid.dtype == np.int64
    before = compiled_cache_info().hits
    # another model with the same structure shares the compiled function
    other = estimate(Setup(load_model("llama-2-7b"), zero=3, gpus=8))
    sweep(other, {"b": np.arange(1, 5)})
    assert compiled_cache_info().hits == before + 1
    with pytest.raises(InputError, match="axes: must be one of I, L, N_d, P, V"):
        sweep(est, {"r": np.arange(3)})


@pytest.mark.parametrize(
    ("axes", "message"),
    [
        ({"zz": [1]}, "axes: must be one of I, L, N_d"),
        ({"r": [8]}, "axes: must be one of"),  # a symbol, but not of this estimate
        ({"N_d": [0]}, "axes[N_d]: must be whole numbers from 1"),
        ({"N_d": [float("nan")]}, "axes[N_d]: must be whole numbers"),
        ({"b": [1e30]}, "axes[b]: must be whole numbers from 1 to below 2**53"),
        ({"b": [0]}, "axes[b]: must be whole numbers from 1"),
        ({"b": [-4]}, "axes[b]: must be whole numbers from 1"),
        ({"s": [2.5]}, "axes[s]: must be whole numbers"),
        ({"s": ["4096"]}, "axes[s]: must be numbers"),
        ({"b": [2**40]}, "axes: give totals of 2**53 bytes or more"),
    ],
)
def test_sweep_bad_input(axes: dict[str, Any], message: str) -> None:
    est = estimate(Setup(load_model("llama-7b"), zero=3, gpus=8))
    with pytest.raises(InputError, match=re.escape(message)):
        sweep(est, axes)


def test_sensitivities_bad_input() -> None:
    est = estimate(Setup(load_model("llama-7b"), zero=3, gpus=8))
    with pytest.raises(InputError, match=re.escape("knobs: must be one of I, L, N_d")):
        sensitivities(est, ["r"])
    with pytest.raises(InputError, match="knobs: must be one of"):
        ranking(est, ["zz"])
    with pytest.raises(InputError, match="est: must be an Estimate"):
        sweep(TEXT, {"b": [1]})
    assert [str(x.knob) for x in sensitivities(est, "N_d")] == ["N_d"] * len(
        sensitivities(est, [N_d])
    )
