"""The calculator's code generator: sympy expressions printed to JavaScript evaluate, in node on
the page's own exact rationals (docs/_static/calculator.js), to the library's bytes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sympy

from vrammath.errors import InputError
from vrammath.estimate import estimate
from vrammath.presets import load_model
from vrammath.setup import Setup
from vrammath.symbols import N_d, P, b, s

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import calculator_printer  # noqa: E402

ENGINE = ROOT / "docs" / "_static" / "calculator.js"
NODE = shutil.which("node")


def test_printer_emits_exact_calls() -> None:
    js = calculator_printer.js_function(sympy.Max(2 * P / N_d, sympy.Rational(3, 2) * b * s**2))
    assert js.startswith("v=>x(")
    for part in ("q(3,2)", "p(v.s,2)", "v.N_d"):
        assert part in js
    assert "Math" not in js
    assert "/" not in js.removeprefix("v=>")


def test_printer_refuses_what_it_cannot_do_exactly() -> None:
    with pytest.raises(ValueError, match="not exact"):
        calculator_printer.js_function(sympy.sqrt(P))


def _node_values(exprs: list[sympy.Expr], values: dict[sympy.Symbol, int]) -> list[str]:
    """Each expression's ceiling at ``values``, computed by node on calculator.js's rationals."""
    funcs = [calculator_printer.js_function(e) for e in exprs]
    script = f"""
globalThis.window = {{VRAMMATH_DATA: {{funcs: {calculator_printer.funcs_script(funcs)}}}}};
{ENGINE.read_text()}
const vm = window.vrammath, Z = vm.Z;
const v = {json.dumps({str(k): str(x) for k, x in values.items()})};
for (const k in v) v[k] = Z.q(v[k]);
console.log(JSON.stringify(vm.funcs.map((f) => Z.ceil(f(v)).n.toString())));
"""
    out = subprocess.run([NODE or "node"], input=script, capture_output=True, text=True, check=True)
    got: list[str] = json.loads(out.stdout)
    return got


SETUPS = [
    Setup(load_model("llama-7b"), zero=3, gpus=6, lora_rank=8, lora_targets="all-linear"),
    Setup(load_model("gpt2"), attention="eager", recompute="full", micro_batch=3, seq_len=1000),
    Setup(load_model("gpt-175b"), tp=8, pp=12, sp=True, recompute="selective", zero=1, gpus=7),
    Setup(load_model("qwen2-7b"), lora_rank=5, quant="nf4", gpus=3, zero=2, micro_batch=1),
]


@pytest.mark.skipif(NODE is None, reason="node is not installed")
@pytest.mark.parametrize("setup", SETUPS, ids=lambda x: x.model.name)
def test_compiled_expressions_give_the_library_bytes(setup: Setup) -> None:
    est = estimate(setup)
    comps = [c for c in est.components if c.expr is not None]
    phases = list(est.phase_exprs.values())
    got = _node_values([c.expr for c in comps] + phases + [est.gpu_expr()], est.values)
    want = [c.bytes for c in comps] + list(est.phases.values()) + [est.gpu_bytes]
    assert got == [str(x) for x in want]


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_piecewise_takes_the_first_branch_that_holds() -> None:
    w = sympy.Symbol("w_win", positive=True, integer=True)
    expr = sympy.Piecewise((s * w, s >= w), (s**2, True)) / 3
    got = [_node_values([expr], {s: x, w: 4}) for x in (3, 4, 7)]
    assert got == [["3"], ["6"], ["10"]]  # ceil(9/3), ceil(16/3), ceil(28/3)


def test_serving_symbols_are_read_from_kv_values() -> None:
    import calculator_serve

    llama = calculator_serve._run_symbols(load_model("llama-2-7b"))
    mistral = calculator_serve._run_symbols(load_model("mistral-7b"))
    base = {"b": "batch", "T": "context", "t": "tp", "blk": "block", "B_kv": "kv_dtype"}
    assert mistral == base  # its window is its own (4096)
    assert llama == {**base, "w_win": "context"}  # no window: kv_values puts the context in


def test_tp_refusals_are_the_library_messages() -> None:
    import calculator_serve

    from vrammath.inference import Serve

    spec = load_model("llama-2-70b")
    got = calculator_serve.tp_messages(lambda tp: Serve(spec, tp=tp), spec.heads)
    assert got["templates"][got["big"]] == "tp: must divide the attention heads (64) (got {got})"
    assert sorted(set(range(1, 65)) - set(got["refused"])) == [1, 2, 4, 8, 16, 32, 64]
    with pytest.raises(InputError) as refused:
        Serve(spec, tp=3)
    assert got["templates"][got["refused"][3]].format(got=3) == str(refused.value)
