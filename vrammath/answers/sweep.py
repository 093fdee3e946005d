"""Which knob buys memory back, and the total over arrays of settings.

:func:`sensitivities` differentiates each GPU component (and the total, the largest phase) by the
run-size symbols; :func:`ranking` orders the knobs by the bytes one step of each saves.
:func:`sweep` evaluates the total over numpy arrays of settings, compiled once per shape of
expression with :func:`sympy.lambdify` (needs numpy, the ``numpy`` extra).

Examples
========

>>> from vrammath.compose.estimate import estimate
>>> from vrammath.compose.setup import Setup
>>> from vrammath.model.presets import load_model
>>> est = estimate(Setup(load_model("llama-7b"), zero=3, gpus=8))
>>> top = ranking(est)[0]
>>> str(top.knob), top.step_saving > 0
('s', True)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import sympy

from vrammath.answers.budget import active_branch, branches, exact_bytes, gpu_terms, symbol_named
from vrammath.compose.engines import RANKED_ENGINES
from vrammath.compose.estimate import Estimate
from vrammath.notation.errors import InputError
from vrammath.notation.symbols import N_d, P_r, b, p, s, t

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

# --- sensitivities ---------------------------------------------------------------------------

KNOBS: tuple[sympy.Symbol, ...] = (b, s, N_d, t, p)
"""The run-size symbols :func:`sensitivities` differentiates by default."""

_HALVE = {b, s}  # knobs that save memory when made smaller; the others when made larger


@dataclass(frozen=True)
class Sensitivity:
    """How one component's bytes respond to one knob.

    ``derivative`` is d(bytes)/d(knob) as an expression; ``rate`` its value at the estimate's
    settings (bytes per unit of the knob); ``elasticity`` = knob / bytes * rate, the percent change
    in bytes per percent change in the knob (comparable across knobs); ``step_saving`` the exact
    bytes saved by the memory-saving step -- halving ``b`` or ``s``, doubling ``N_d``, ``t``, ``p``
    (0 when the step is impossible, e.g. halving ``b = 1``).
    """

    component: str
    knob: sympy.Symbol
    derivative: sympy.Expr
    rate: float
    elasticity: float
    step_saving: int


def _step(knob: sympy.Symbol, value: int) -> int | None:
    if knob in _HALVE:
        return value // 2 if value >= 2 else None
    return value * 2


_STEPWISE = (sympy.KroneckerDelta, sympy.ceiling, sympy.floor)


def _derivative(expr: sympy.Expr, knob: sympy.Symbol) -> sympy.Expr:
    """d(expr)/d(knob), with the steps of piecewise-constant parts (``KroneckerDelta``,
    ``ceiling``, ``floor``) counted as 0: the rate between steps (``step_saving`` is exact)."""
    deriv = sympy.diff(expr, knob)
    return deriv.replace(
        lambda e: isinstance(e, sympy.Derivative) and isinstance(e.expr, _STEPWISE),
        lambda e: sympy.Integer(0),
    )


def sensitivities(
    est: Estimate, knobs: Sequence[sympy.Symbol | str] = KNOBS
) -> tuple[Sensitivity, ...]:
    """d(bytes)/d(knob) for every estimated GPU component and for the ``"total"``.

    >>> from vrammath.compose.estimate import estimate
    >>> from vrammath.compose.setup import Setup
    >>> from vrammath.model.presets import load_model
    >>> est = estimate(Setup(load_model("llama-7b"), zero=2, gpus=4))
    >>> opt = [x for x in sensitivities(est, ["N_d"]) if x.component == "optimizer"][0]
    >>> opt.derivative, opt.elasticity
    (-8*P/N_d**2, -1.0)
    """
    est = _estimate(est)
    syms = _knobs(est, knobs)
    rows = [(c.key, c.expr) for c in est.components if c.device == "gpu" and c.expr is not None]
    rows.append(("total", est.gpu_expr()))
    out = []
    for key, expr in rows:
        here = exact_bytes([expr], est.values)
        active = active_branch(expr, est.values)  # the total is the largest phase
        for knob in syms:
            deriv = _derivative(active, knob)
            rate = float(deriv.subs(est.values))
            current = est.values[knob]
            elasticity = 0.0 if here == 0 else rate * current / here
            stepped = _step(knob, current)
            saving = (
                0 if stepped is None else here - exact_bytes([expr], {**est.values, knob: stepped})
            )
            out.append(Sensitivity(key, knob, deriv, rate, elasticity, saving))
    return tuple(out)


def ranking(est: Estimate, knobs: Sequence[sympy.Symbol | str] = KNOBS) -> tuple[Sensitivity, ...]:
    """The total's sensitivities, the knob whose step saves the most bytes first.

    >>> from vrammath.compose.estimate import estimate
    >>> from vrammath.compose.setup import Setup
    >>> from vrammath.model.presets import load_model
    >>> est = estimate(Setup(load_model("llama-7b"), zero=3, gpus=8))
    >>> [str(x.knob) for x in ranking(est)][:1]
    ['s']
    """
    total = [x for x in sensitivities(est, knobs) if x.component == "total"]
    return tuple(sorted(total, key=lambda x: (-x.step_saving, -abs(x.elasticity))))


# --- sweeps ----------------------------------------------------------------------------------


_DIV = sympy.Function("vrammath_div")
_EQ = sympy.Function("vrammath_eq")


def _exact_quotient(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` as one integer-coefficient numerator over one denominator, divided once.

    lambdify would otherwise multiply by a rounded reciprocal (``x * N_d**-1.0``), which can land
    a whole number of bytes one ulp above an integer and so one byte high after rounding up; a
    single correctly rounded division of two exact integers cannot.
    """
    num, den = sympy.fraction(sympy.together(expr))
    num = num.replace(sympy.ceiling, lambda arg: sympy.ceiling(_exact_quotient(arg)))
    return num if den == 1 else _DIV(num, den)


def _kronecker(i: Any, j: Any) -> Any:
    import numpy as np

    return np.equal(i, j).astype(np.float64)


@lru_cache(maxsize=256)
def _compiled(terms: tuple[sympy.Expr, ...], args: tuple[sympy.Symbol, ...]) -> Callable[..., Any]:
    """One numpy function for the rounded-up sum of ``terms`` (cached per expression shape).

    Each term's ``Max`` is split into :func:`branches`, each branch rounded up and compiled, and
    the branches combined with ``numpy.maximum`` element by element.
    """
    import numpy as np

    modules = [{"vrammath_div": np.true_divide, "vrammath_eq": _kronecker}, "numpy"]
    # lambdify prints KroneckerDelta as a scalar ``if``: route it through an elementwise equal
    funcs = [
        [
            sympy.lambdify(
                args,
                sympy.ceiling(_exact_quotient(br.replace(sympy.KroneckerDelta, _EQ))),
                modules=modules,
                cse=True,
            )
            for br in branches(term)
        ]
        for term in terms
    ]

    def total(*params: Any) -> Any:
        out: Any = 0.0
        for term_funcs in funcs:
            values = [np.asarray(f(*params), dtype=np.float64) for f in term_funcs]
            out = out + (
                values[0] if len(values) == 1 else np.maximum.reduce(np.broadcast_arrays(*values))
            )
        return out

    return total


def compiled_cache_info() -> Any:
    """Hits and misses of the cache of compiled sweep functions."""
    return _compiled.cache_info()


SWEEP_MAX = 2**53
"""The bound on swept values and totals (float64 holds every integer below it exactly)."""


def _estimate(est: object) -> Estimate:
    if not isinstance(est, Estimate):
        raise InputError("est", "must be an Estimate (vrammath.estimate(setup))", got=est)
    return est


def _knobs(est: Estimate, knobs: object) -> list[sympy.Symbol]:
    """The knobs as symbols of the estimate (names are looked up, never parsed)."""
    if knobs is KNOBS:  # the default: the knobs this estimate can vary
        knobs = [k for k in KNOBS if k in est.values and not _partitioned(est, k)]
    items = [knobs] if isinstance(knobs, str | sympy.Symbol) else knobs
    if not isinstance(items, list | tuple):
        raise InputError("knobs", "must be a sequence of symbols or symbol names", got=knobs)
    return _named(est, "knobs", items)


def _partitioned(est: Estimate, symbol: sympy.Symbol) -> bool:
    # under zero1-torch and deepspeed the rank's share P_r is made of whole tensors, fixed by N_d
    return est.setup.engine in RANKED_ENGINES and symbol in (N_d, P_r)


def _named(est: Estimate, field: str, items: Iterable[object]) -> list[sympy.Symbol]:
    allowed = sorted(est.values, key=str)
    out = [symbol_named(field, k, allowed) for k in items]
    for sym in out:
        if _partitioned(est, sym):
            raise InputError(
                field,
                f"{sym} cannot vary under --engine {est.setup.engine} (the rank's share P_r is "
                "made of whole tensors, no expression in N_d): estimate each --gpus",
                got=str(sym),
            )
    return out


def _axis(name: str, values: object) -> Any:
    """One axis as a float64 array of whole numbers >= 1 (>= 0 for a byte width) below 2**53."""
    import numpy as np

    arr = np.asarray(values)
    field = f"axes[{name}]"
    if arr.dtype.kind not in "iuf":
        raise InputError(field, "must be numbers", got=str(arr.dtype))
    arr = arr.astype(np.float64)
    least = 0 if name.startswith("B_") else 1
    if arr.size and not (
        np.isfinite(arr).all()
        and (arr == np.floor(arr)).all()
        and arr.min() >= least
        and arr.max() < SWEEP_MAX
    ):
        bad = arr[~(np.isfinite(arr) & (arr == np.floor(arr)) & (arr >= least) & (arr < SWEEP_MAX))]
        raise InputError(
            field, f"must be whole numbers from {least} to below 2**53", got=float(bad.flat[0])
        )
    return arr


def sweep(
    est: Estimate,
    axes: Mapping[sympy.Symbol | str, npt.ArrayLike],
) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The estimate's GPU total at every setting in ``axes`` (numpy broadcasting), in bytes.

    The expression is compiled with :func:`sympy.lambdify` once per shape of expression -- the
    model's sizes are arguments, so every model with the same recipe, stage and structure shares
    one compiled function -- and each component is rounded up like :func:`exact_bytes`.
    Values are exact while every numerator stays below 2**53 (float64 holds such integers
    exactly and divides them with one correct rounding).

    >>> import numpy as np
    >>> from vrammath.compose.estimate import estimate
    >>> from vrammath.compose.setup import Setup
    >>> from vrammath.model.presets import load_model
    >>> est = estimate(Setup(load_model("llama-7b"), zero=3, gpus=8))
    >>> out = sweep(est, {"N_d": np.array([1, 8, 64])})
    >>> int(out[1]) == est.gpu_bytes
    True
    """
    try:
        import numpy as np
    except ImportError:
        raise InputError(
            "axes", "sweep() needs the 'numpy' extra (pip install 'vrammath[numpy]')"
        ) from None

    est = _estimate(est)
    terms = gpu_terms(est)
    if not isinstance(axes, Mapping):
        raise InputError("axes", "must map symbols of the estimate to arrays", got=axes)
    names = list(axes)
    swept = {
        sym: _axis(str(k), axes[k])
        for sym, k in zip(_named(est, "axes", names), names, strict=True)
    }
    args = tuple(sorted(set().union(*(term.free_symbols for term in terms)), key=str))
    func = _compiled(terms, args)
    arrays = swept
    shape = np.broadcast_shapes(*(arr.shape for arr in arrays.values())) if arrays else ()
    params = [arrays.get(sym, float(est.values[sym])) for sym in args]
    out = np.broadcast_to(np.asarray(func(*params), dtype=np.float64), shape)
    if out.size and not (np.isfinite(out).all() and out.max() < SWEEP_MAX):
        raise InputError("axes", "give totals of 2**53 bytes or more, beyond float64's exact range")
    return out.astype(np.int64)


__all__ = [
    "KNOBS",
    "SWEEP_MAX",
    "Sensitivity",
    "compiled_cache_info",
    "ranking",
    "sensitivities",
    "sweep",
]
