"""The calculator's serving tab: :func:`vrammath.inference.serve`'s expressions, compiled.

:func:`serve_data` prints, per preset, the weights and quantization constants of
:func:`vrammath.serving_weights.serving_weight_exprs` (per weight format, with and without tensor
parallelism), the KV cache of :func:`vrammath.kv_cache.kv_cache_expr` (paged or not) and the
per-token cache :func:`vrammath.kv_cache.kv_bytes_per_token` evaluates, each with
:func:`calculator_printer.exact_js`. Which symbol each of the run's numbers fills is read
from :func:`vrammath.kv_cache.kv_values` itself (the window is the context for a model without
one), and the refusals are the library's own messages.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

import sympy
from calculator_printer import Pool, js_function

from vrammath.errors import InputError
from vrammath.fields import options
from vrammath.inference import Serve, ServeEstimate
from vrammath.kv_cache import kv_cache_expr, kv_dtype_bytes, kv_values
from vrammath.params import param_count, size_values
from vrammath.presets import load_model, model_names
from vrammath.serving_weights import serving_weight_exprs
from vrammath.symbols import P
from vrammath.vocab import KV_DTYPES, SERVE_WEIGHTS

#: the run's fields kv_values reads, and two values of each (to see which symbol moves)
_PROBE: dict[str, tuple[Any, Any]] = {
    "batch": (3, 5),
    "context": (7, 11),
    "tp": (1, 2),
    "block": (13, 17),
    "kv_dtype": ("fp32", "int8"),
}


def _run_symbols(spec: Any) -> dict[str, str]:
    """Symbol name -> the Serve field whose value it takes (kv_dtype: through its width), read
    from kv_values itself."""
    base = {k: v[0] for k, v in _PROBE.items()}
    ref = kv_values(spec, **base)
    out: dict[str, str] = {}
    for name, (_, other) in _PROBE.items():
        moved = kv_values(spec, **{**base, name: other})
        want = kv_dtype_bytes(other) if name == "kv_dtype" else other
        for sym, value in moved.items():
            if value != ref[sym]:
                if value != want:
                    raise ValueError(f"kv_values: {sym} is not the {name} itself")
                out[str(sym)] = name
    return out


def _refusal(make: Callable[[], object]) -> str | None:
    """The library's message where ``make()`` raises InputError, else None."""
    try:
        make()
    except InputError as err:
        return str(err)
    return None


def tp_messages(make: Callable[[int], object], heads: int) -> dict[str, Any]:
    """The library's refusals of tensor-parallel sizes: ``templates`` (``{got}`` for the
    value), per refused size up to the heads the index of its template in ``refused``, and
    ``big`` the template of a size past the heads."""
    templates = Pool()
    refused: dict[int, int] = {}
    for tp in [*range(1, heads + 1), heads + 1]:
        msg = _refusal(functools.partial(make, tp))
        if msg is not None:
            refused[tp] = templates.add(msg.replace(f"(got {tp})", "(got {got})"))
    big = refused.pop(heads + 1)
    return {"templates": templates.items, "refused": refused, "big": big}


def _serve_tp(spec: Any, tp: int) -> Serve:
    return Serve(spec, tp=tp)


def serve_data(funcs: Pool, texs: Pool) -> dict[str, Any]:
    """The serving tab's data: compiled functions (indices into ``funcs``), per-preset values,
    the dtype widths and the fields' declarations."""
    presets: dict[str, Any] = {}
    for name in model_names():
        spec = load_model(name)

        def fn(expr: sympy.Expr) -> int:
            return funcs.add(js_function(expr))

        weights = {
            fmt: [
                [fn(e) for e in serving_weight_exprs(spec, fmt, tp=tp).values()]
                for tp in (False, True)
            ]
            for fmt in SERVE_WEIGHTS
        }
        kv = [
            [kv_cache_expr(spec, tp=tp, paged=paged) for paged in (False, True)]
            for tp in (False, True)
        ]
        per_token = [kv_cache_expr(spec, tp=tp, window_layers=0) for tp in (False, True)]
        values = {str(k): v for k, v in size_values(spec).items()}
        values[str(P)] = param_count(spec)
        run = _run_symbols(spec)
        for sym in run:
            values.pop(sym, None)
        presets[name] = {
            "weights": weights,
            "kv": [[fn(e) for e in row] for row in kv],
            "kvTex": [[texs.add(sympy.latex(e)) for e in row] for row in kv],
            "perToken": [fn(e) for e in per_token],
            "values": values,
            "run": run,
            "tp": tp_messages(functools.partial(_serve_tp, spec), spec.heads),
            "heads": spec.heads,
        }
    defaults = {f.name: f.default for f in dataclasses.fields(Serve) if f.name != "model"}
    fields = [
        {"name": o.name, "flag": o.flag, "choices": list(o.choices), "low": o.low,
         "high": o.high, "kind": o.kind, "help": o.help}
        for o in options(Serve)
    ]  # fmt: skip
    limit = inspect.signature(ServeEstimate.max_context).parameters["limit"].default
    return {
        "presets": presets,
        "defaults": defaults,
        "fields": fields,
        "kvBytes": {k: kv_dtype_bytes(k) for k in KV_DTYPES},
        "contextLimit": limit,
    }
