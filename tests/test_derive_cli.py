"""``vrammath derive`` where the measure extra is missing, and the committed derive result.

The measurement itself is tested in ``tests/measure/test_derive.py`` (needs torch).
"""

from __future__ import annotations

import importlib.util
import json
from fractions import Fraction
from pathlib import Path

import pytest
import sympy

from vrammath.cli import main
from vrammath.measure.derive import MONOMIALS, coefficients, solve_exact
from vrammath.notation.symbols import b, s

STORED = Path(__file__).resolve().parents[1] / "validation" / "derive.json"


def test_derive_without_torch_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return None if name == "torch" else real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert main(["derive", "conf/models/llama-7b.json"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "vrammath: error: derive: needs torch and transformers: pip install 'vrammath[measure]'\n"
    )


def test_derive_refuses_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["derive", "x.json", "--precision", "fp16"]) == 2
    assert "precision: must be one of bf16, fp32 (got 'fp16')" in capsys.readouterr().err
    assert main(["derive", "x.json", "--batch", "0"]) == 2
    assert "batch: must be an integer from 1 to" in capsys.readouterr().err


def test_committed_result_is_consistent() -> None:
    """The stored coefficients give the stored bytes, and re-solving the polynomial from its own
    values at the fit points returns the same coefficients."""
    result = json.loads(STORED.read_text(encoding="utf-8"))["result"]
    at = {b: result["batch"], s: result["seq"]}
    named = {str(m): m for m in MONOMIALS}
    pts = [(bb, ss) for bb in (2, 3) for ss in (256, 512, 768)]
    for q, coeffs in result["coefficients"].items():
        assert sorted(coeffs) == sorted(named)
        expr = sympy.Integer(0)
        for name, text in coeffs.items():
            c = Fraction(text)
            expr += sympy.Rational(c.numerator, c.denominator) * named[name]
        assert expr.subs(at) == result["bytes"][q]
        again = solve_exact(pts, [int(expr.subs({b: x, s: y})) for x, y in pts])
        assert coefficients(again) == coeffs
    assert result["misses"] == []
    assert result["bytes"]["activations"] == 15768 * 4 * 512 + 96 * 512 + 8
