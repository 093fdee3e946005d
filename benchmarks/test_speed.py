"""Speed: a 10**6-point sweep against sympy's per-configuration evaluation, and cold starts (``nox -s bench``).

The figures and their ratios are printed together at the end of the run (see conftest.py).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time

import numpy as np
import pytest
import sympy

from vrammath.answers.sweep import sweep
from vrammath.compose.estimate import Component, Estimate, estimate
from vrammath.compose.setup import Setup
from vrammath.model.presets import load_model
from vrammath.notation.symbols import N_d, b, s

POINTS = 10**6
SUBS_SAMPLE = 200


def _setup_estimate() -> Estimate:
    """LLaMA-7B, ZeRO-3 over 8 GPUs, with activation terms in b and s.

    Until activations are wired into :func:`estimate`, the activation expressions of
    :mod:`vrammath.terms.activations.model` are attached as components so the sweep has b and s to vary.
    """
    spec = load_model("llama-7b")
    est = estimate(Setup(spec, zero=3, gpus=8))
    if {b, s} <= est.gpu_expr().free_symbols:
        return est
    from vrammath.terms.activations.model import activation_exprs

    extra = tuple(
        Component(f"bench_{key}", key, "gpu", expr, None)
        for key, expr in activation_exprs(spec).items()
    )
    return dataclasses.replace(est, components=(*est.components, *extra))


@pytest.fixture(scope="module")
def est() -> Estimate:
    return _setup_estimate()


@pytest.fixture(scope="module")
def axes() -> dict[sympy.Symbol, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        b: rng.integers(1, 65, POINTS),
        s: rng.integers(1, 32769, POINTS),
        N_d: rng.integers(1, 1025, POINTS),
    }


def test_sweep_million(benchmark, est, axes, record) -> None:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    first = sweep(est, axes)  # compiles once; later calls hit the cache
    record["compile_s"] = time.perf_counter() - start
    out = benchmark(sweep, est, axes)
    assert out.shape == (POINTS,)
    assert (out == first).all()
    record["sweep_points"] = POINTS
    record["sweep_s"] = benchmark.stats.stats.mean
    assert POINTS / record["sweep_s"] >= 1e6


def test_subs_baseline(benchmark, est, axes, record) -> None:  # type: ignore[no-untyped-def]
    expr = est.gpu_expr()
    settings = [
        {**est.values, b: int(axes[b][i]), s: int(axes[s][i]), N_d: int(axes[N_d][i])}
        for i in range(SUBS_SAMPLE)
    ]

    def run() -> list[int]:
        # sympy's exact per-configuration evaluation, as estimate() does it (xreplace: subs
        # re-evaluates the peak's Max at every partial step and is another 1000x slower)
        numbers = [{k: sympy.Integer(x) for k, x in v.items()} for v in settings]
        return [int(sympy.ceiling(expr.xreplace(n))) for n in numbers]

    values = benchmark.pedantic(run, rounds=3, iterations=1)
    record["subs_per_config_s"] = benchmark.stats.stats.mean / SUBS_SAMPLE
    fast = sweep(est, {k: v[:SUBS_SAMPLE] for k, v in axes.items()})
    # the sweep rounds each component up; subs rounds the sum: within a byte per component
    assert all(0 <= f - v < len(est.components) for f, v in zip(fast, values, strict=True))
    if "sweep_s" in record:
        assert record["subs_per_config_s"] / (record["sweep_s"] / POINTS) >= 1000


def _cold(args: list[str]) -> None:
    subprocess.run([sys.executable, *args], check=True, capture_output=True)


def test_cold_python(benchmark, record) -> None:  # type: ignore[no-untyped-def]
    benchmark.pedantic(_cold, args=(["-c", "pass"],), rounds=5, iterations=1)
    record["python_s"] = benchmark.stats.stats.mean


def test_cold_sympy(benchmark, record) -> None:  # type: ignore[no-untyped-def]
    benchmark.pedantic(_cold, args=(["-c", "import sympy"],), rounds=5, iterations=1)
    record["sympy_s"] = benchmark.stats.stats.mean


def test_cold_import(benchmark, record) -> None:  # type: ignore[no-untyped-def]
    benchmark.pedantic(_cold, args=(["-c", "import vrammath"],), rounds=5, iterations=1)
    record["import_s"] = benchmark.stats.stats.mean


def test_cold_cli(benchmark, record) -> None:  # type: ignore[no-untyped-def]
    cmd = ["-m", "vrammath", "estimate", "llama-7b", "--zero", "3", "--gpus", "8"]
    benchmark.pedantic(_cold, args=(cmd,), rounds=5, iterations=1)
    record["cli_s"] = benchmark.stats.stats.mean


def test_cold_fit(benchmark, record) -> None:  # type: ignore[no-untyped-def]
    cmd = ["-m", "vrammath", "fit", "qwen2-72b", "--gpu", "A100-80GB", "--gpus", "8"]
    cmd += ["--seq", "4096", "--zero", "3", "--recompute", "full", "--offload-optimizer"]
    benchmark.pedantic(_cold, args=(cmd,), rounds=3, iterations=1)
    record["fit_s"] = benchmark.stats.stats.mean


def _formula_times() -> dict[str, float]:
    """Seconds of `vrammath formula TERM --latex --model PRESET` (in process) for every term of
    every preset: the slowest is the figure (target under 2 s)."""
    import contextlib
    import io

    from vrammath.cli import FORMULAS, main
    from vrammath.model.presets import model_names

    times: dict[str, float] = {}
    for preset in model_names():
        for term in FORMULAS:
            started = time.perf_counter()
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                main(["formula", term, "--latex", "--model", preset])
            times[f"{term} {preset}"] = time.perf_counter() - started
    return times


def test_formula_latex_every_term_every_preset(benchmark, record) -> None:  # type: ignore[no-untyped-def]
    times = benchmark.pedantic(_formula_times, rounds=1, iterations=1)
    slowest = max(times, key=times.__getitem__)
    record["formula_slowest_s"] = times[slowest]
    record["formula_count"] = len(times)
    assert times[slowest] < 2.0, f"formula {slowest} --latex took {times[slowest]:.1f} s"
