"""Collects the benchmark means and prints the figures the issue asks for, in one run:
configurations per second of a 10**6-point sweep, its speed-up over sympy's exact evaluation of one configuration (``xreplace``), and the
cold-start times of ``import sympy``, ``import vrammath`` and of the CLI's estimate and fit."""

from __future__ import annotations

from typing import Any

import pytest

RESULTS: dict[str, float] = {}


@pytest.fixture
def record() -> dict[str, float]:
    """Where each benchmark leaves its figure (seconds, or a count)."""
    return RESULTS


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not RESULTS:
        return
    tr = terminalreporter
    tr.section("vrammath speed")
    points = RESULTS.get("sweep_points")
    sweep = RESULTS.get("sweep_s")
    subs = RESULTS.get("subs_per_config_s")
    if points and sweep:
        tr.write_line(
            f"sweep: {points:,.0f} configurations in {sweep * 1e3:.1f} ms "
            f"= {points / sweep:,.0f} configurations/s (target >= 1,000,000)"
        )
    if "compile_s" in RESULTS:
        tr.write_line(f"sweep: first call (lambdify + compile) {RESULTS['compile_s'] * 1e3:.0f} ms")
    if subs:
        tr.write_line(
            f"sympy xreplace: {1 / subs:,.0f} configurations/s ({subs * 1e3:.2f} ms each)"
        )
    if points and sweep and subs:
        tr.write_line(f"ratio sweep / xreplace: {subs / (sweep / points):,.0f}x (target >= 1000x)")
    base = RESULTS.get("python_s", 0.0)
    labels = (
        ("sympy_s", "import sympy"),
        ("import_s", "import vrammath"),
        ("cli_s", "CLI `vrammath estimate` (target <= 500 ms)"),
        ("fit_s", "CLI `vrammath fit` Qwen2-72B (target <= 1000 ms)"),
    )
    for key, label in labels:
        if key in RESULTS:
            tr.write_line(
                f"cold start, {label}: {RESULTS[key] * 1e3:.0f} ms "
                f"({(RESULTS[key] - base) * 1e3:.0f} ms over a bare `python -c pass` of "
                f"{base * 1e3:.0f} ms)"
            )
    if "formula_slowest_s" in RESULTS:
        tr.write_line(
            f"formula --latex, every term of every preset ({RESULTS['formula_count']:.0f} "
            f"calls): slowest {RESULTS['formula_slowest_s'] * 1e3:.0f} ms (target < 2000 ms)"
        )
