"""Inverse problems: the largest ``b`` or ``s``, the fewest GPUs, or any unknown that fits a limit.

The forward direction is :func:`vrammath.compose.estimate.estimate`: a setup in, bytes out. This module
runs it backwards on the same sympy objects -- the GPU total ``est.gpu_expr()`` with the numbers
in ``est.values`` -- with the generic :func:`largest` / :func:`smallest`, which
:mod:`vrammath.answers.fit` applies to the largest micro-batch ``b``, the longest sequence ``s`` and the
fewest data-parallel GPUs ``N_d`` that fit a :class:`~vrammath.answers.budget.Budget`.

Explanation
===========

Every solve first tries a closed form: with the other symbols substituted, the memory becomes a
rational function ``f(n)`` of the unknown. Clearing its (positive) denominator turns
``f(n) <= limit`` into a polynomial inequality; when that polynomial has degree 2 or less
:func:`sympy.solveset` gives its roots exactly and the answer is the floor (or ceiling) of the
boundary root. Otherwise -- or when the rounding of per-component bytes moves the boundary by more
than a step -- an exact integer search (doubling, then bisection) finds it. Either way the answer
is *verified* by substituting it back: ``f(n)`` fits and ``f(n + 1)`` does not (for a smallest
answer: ``f(n - 1)`` does not). The search assumes memory is monotone in the unknown, which holds
for every term vrammath writes (they grow with ``b`` and ``s`` and shrink with ``N_d``).

Values are computed exactly as :func:`~vrammath.compose.estimate.estimate` computes them -- each component
rounded up to a whole byte, then summed -- so ``solution.bytes`` equals
``estimate(setup with the answer).gpu_bytes``.

Examples
========

>>> from vrammath.compose.estimate import estimate
>>> from vrammath.answers.fit import fewest_gpus
>>> from vrammath.compose.setup import Setup, with_changes
>>> from vrammath.model.presets import load_model
>>> est = estimate(Setup(load_model("llama-7b"), zero=3, gpus=8, gpu="A100-40GB"))
>>> sol = fewest_gpus(est)
>>> sol.method, sol.verified
('closed-form', True)
>>> estimate(with_changes(est.setup, gpus=sol.value)).gpu_bytes == sol.bytes <= sol.limit
True
>>> estimate(with_changes(est.setup, gpus=sol.value - 1)).gpu_bytes > sol.limit
True

A generic expression works too -- here a made-up activation term in ``b``:

>>> from vrammath.notation.symbols import P, b
>>> largest([16 * P, 3 * 10**9 * b], {P: 10**9}, b, 80 * 10**9).value
21
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Literal

import sympy

from vrammath.answers.budget import (
    branches,
    expr_terms,
    symbol_named,
    symbol_values,
)
from vrammath.notation.errors import InputError, positive_int
from vrammath.notation.signatures import after
from vrammath.notation.units import fmt_bytes

SEARCH_CAP = 2**48
"""Largest value an integer search tries before it calls the answer unbounded."""

Status = Literal["ok", "none-fits", "unbounded"]
Method = Literal["closed-form", "search", "constant"]


@dataclass(frozen=True)
class Solution:
    """The answer to one inverse problem, with the evidence that verifies it.

    ``value`` is the answer (None when nothing fits, or when the memory does not depend on the
    unknown and any value fits: see ``status``). ``bytes`` is the exact memory at ``value``;
    ``neighbour`` is the next value in the direction that stops fitting (``value + step`` for a
    largest answer, ``value - step`` for a smallest one) and ``neighbour_bytes`` its memory, which
    exceeds ``limit`` -- the back-substitution every answer passes.

    When offloaded states live on the host, ``host_bytes`` is the host memory one node needs at
    ``value`` (``neighbour_host_bytes`` at the neighbour) against ``host_limit`` per node; the
    answer must fit both, and its neighbour must miss one of them.
    """

    question: str
    unknown: sympy.Symbol
    status: Status
    value: int | None
    method: Method
    limit: int
    bytes: int | None
    neighbour: int | None
    neighbour_bytes: int | None
    expr: sympy.Expr
    host_limit: int | None = None
    host_bytes: int | None = None
    neighbour_host_bytes: int | None = None

    def _host_over(self, need: int | None) -> bool:
        return self.host_limit is not None and need is not None and need > self.host_limit

    @property
    def verified(self) -> bool:
        """True when the answer fits (GPU and host) and its neighbour does not (or none exists)."""
        if self.status != "ok" or self.value is None or self.bytes is None:
            return False
        if self.bytes > self.limit or self._host_over(self.host_bytes):
            return False
        if self.neighbour is None:
            return True
        gpu_over = self.neighbour_bytes is not None and self.neighbour_bytes > self.limit
        return gpu_over or self._host_over(self.neighbour_host_bytes)

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form: integers for values and bytes, the expression as text."""
        return {
            "question": self.question,
            "unknown": str(self.unknown),
            "status": self.status,
            "value": self.value,
            "method": self.method,
            "limit_bytes": self.limit,
            "bytes": self.bytes,
            "neighbour": self.neighbour,
            "neighbour_bytes": self.neighbour_bytes,
            "host_limit_bytes": self.host_limit,
            "host_bytes": self.host_bytes,
            "neighbour_host_bytes": self.neighbour_host_bytes,
            "verified": self.verified,
            "expr": str(self.expr),
        }

    def __str__(self) -> str:
        if self.status == "unbounded":
            return (
                f"{self.question}: no limit -- the estimated memory does not grow with "
                f"{self.unknown}"
            )
        if self.status == "none-fits":
            if self.host_limit is not None and self._host_over(self.host_bytes):
                assert self.host_bytes is not None
                return (
                    f"{self.question}: none fits (the host needs {fmt_bytes(self.host_bytes)} "
                    f"per node, {fmt_bytes(self.host_limit)} installed)"
                )
            return f"{self.question}: none fits ({fmt_bytes(self.limit)} usable)"
        assert self.bytes is not None
        text = (
            f"{self.question}: {self.unknown} = {self.value} "
            f"({fmt_bytes(self.bytes)} of {fmt_bytes(self.limit)} usable"
        )
        if self.host_bytes:
            of = "" if self.host_limit is None else f" of {fmt_bytes(self.host_limit)}"
            text += f"; host {fmt_bytes(self.host_bytes)}{of} per node"
        if self.neighbour is not None and self.neighbour_bytes is not None:
            text += f"; {self.neighbour} needs {fmt_bytes(self.neighbour_bytes)}"
            if self._host_over(self.neighbour_host_bytes):
                assert self.neighbour_host_bytes is not None
                text += f" and {fmt_bytes(self.neighbour_host_bytes)} of host"
        return text + f") [{self.method}]"


def _put(expr: sympy.Expr, mapping: dict[sympy.Basic, sympy.Basic]) -> sympy.Expr:
    """``expr`` with ``mapping`` put in, every ``Max`` kept unevaluated while symbols remain (a
    symbolic Max compares its branches symbolically, which is slow; numbers decide it exactly)."""
    if isinstance(expr, sympy.Max):
        return sympy.Max(*(_put(a, mapping) for a in expr.args), evaluate=False)
    if expr.has(sympy.Max):
        return expr.func(*(_put(a, mapping) for a in expr.args))
    return expr.xreplace(mapping)


class _Problem:
    """f(k) = sum of ceil(term(step * k)), for k = 1, 2, ... (the unknown is step * k)."""

    def __init__(
        self,
        terms: tuple[sympy.Expr, ...],
        values: Mapping[sympy.Symbol, int],
        unknown: sympy.Symbol,
        step: int,
    ) -> None:
        others = {sym: v for sym, v in values.items() if sym != unknown}
        self.k = sympy.Symbol("k", positive=True, integer=True)
        numbers: dict[sympy.Basic, sympy.Basic] = {s: sympy.Integer(v) for s, v in others.items()}
        numbers[unknown] = step * self.k
        self.terms = tuple(_put(term, numbers) for term in terms)
        self.step = step
        self.symbol = unknown
        stray = set().union(*(term.free_symbols for term in self.terms)) - {self.k}
        if stray:
            raise InputError(
                "values", "must give a number for every symbol", got=sorted(map(str, stray))
            )
        self.expr = sympy.Add(*self.terms)
        self._cache: dict[int, int] = {}

    def at(self, k: int) -> int:
        if k not in self._cache:
            at_k = {self.k: sympy.Integer(k)}
            self._cache[k] = sum(int(sympy.ceiling(term.xreplace(at_k))) for term in self.terms)
        return self._cache[k]

    def boundary_roots(self, limit: int, largest: bool = True) -> list[sympy.Expr] | None:
        """Real roots of the cleared polynomial ``num - limit * den``, or None if not degree <= 2.

        Stepwise parts are smoothed first -- ``ceiling(x)`` and ``floor(x)`` to ``x``,
        ``KroneckerDelta`` to 0 (its value away from one point) -- which moves the boundary by
        less than a step or two; the candidate is then checked exactly and nudged. A ``Max`` (a
        peak over phases) is solved branch by branch: growing memory first crosses the limit at
        the smallest branch root, shrinking memory last at the largest.
        """
        brs = branches(self.expr)
        if len(brs) == 1:
            return self._roots(brs[0], limit)
        bounds = []
        for br in brs:
            if self.k not in br.free_symbols:
                continue  # a constant branch: checked exactly afterwards
            roots = self._roots(br, limit)
            if not roots:
                return None
            bounds.append(roots[-1])
        if not bounds:
            return None
        return [min(bounds, key=float)] if largest else [max(bounds, key=float)]

    def _roots(self, expr: sympy.Expr, limit: int) -> list[sympy.Expr] | None:
        smooth = expr.replace(sympy.KroneckerDelta, lambda *args: sympy.Integer(0))
        smooth = smooth.replace(sympy.ceiling, lambda x: x).replace(sympy.floor, lambda x: x)
        num, den = sympy.fraction(sympy.together(smooth - limit))
        try:
            den_poly = sympy.Poly(den, self.k)
            num_poly = sympy.Poly(num, self.k)
        except sympy.PolynomialError:
            return None
        # the denominator must be positive for every k >= 1 (non-negative coefficients, not 0)
        if den_poly.is_zero or any(c < 0 for c in den_poly.all_coeffs()):
            return None
        if num_poly.degree() > 2 or num_poly.degree() < 1:
            return None
        x = sympy.Symbol("x", real=True)
        roots = sympy.solveset(num_poly.as_expr().subs(self.k, x), x, domain=sympy.S.Reals)
        if not isinstance(roots, sympy.FiniteSet):
            return None
        return sorted(roots, key=float)


def _solution(
    question: str,
    unknown: sympy.Symbol,
    prob: _Problem,
    limit: int,
    status: Status,
    k: int | None,
    method: Method,
    neighbour_k: int | None,
) -> Solution:
    step = prob.step
    return Solution(
        question=question,
        unknown=unknown,
        status=status,
        value=None if k is None else k * step,
        method=method,
        limit=limit,
        bytes=None if k is None else prob.at(k),
        neighbour=None if neighbour_k is None else neighbour_k * step,
        neighbour_bytes=None if neighbour_k is None else prob.at(neighbour_k),
        expr=_put(prob.expr, {prob.k: unknown / step}),
    )


_ADJUST = 3  # steps a closed-form candidate may move to absorb per-component rounding


def _solve(prob: _Problem, limit: int, question: str | None, *, grows: bool) -> Solution:
    """The last ``k`` that fits when memory grows with it (:func:`largest`), else the first
    (:func:`smallest`); the neighbour checked is one step further, towards not fitting.

    One walk serves both: ``inside(k)`` is the side of the boundary that holds ``k = 1`` (fits
    for a largest answer, does not for a smallest), and ``d`` the step towards not fitting.
    """
    d = 1 if grows else -1
    name = question or f"{'largest' if grows else 'smallest'} {prob.symbol}"
    far: Status = "unbounded" if grows else "none-fits"  # no boundary before the cap

    def fits(k: int) -> bool:
        return prob.at(k) <= limit

    def inside(k: int) -> bool:
        return fits(k) == grows

    def answer(status: Status, k: int | None, method: Method) -> Solution:
        ok = status == "ok" and k is not None and k + d >= 1
        neighbour = k + d if ok and k is not None else None
        return _solution(name, prob.symbol, prob, limit, status, k, method, neighbour)

    constant = prob.k not in prob.expr.free_symbols
    if not inside(1):  # nothing fits at all (largest), or the first value already does
        if grows:
            return answer("none-fits", None, "search")
        return answer("ok", 1, "constant" if constant else "search")
    if constant:
        return answer(far, None, "constant")
    roots = prob.boundary_roots(limit, largest=grows)
    if roots:
        rounded = sympy.floor(roots[-1]) if grows else sympy.ceiling(roots[-1])
        k = max(1, int(rounded))
        for _ in range(_ADJUST):
            if k - d >= 1 and not fits(k):
                k -= d
            elif k + d >= 1 and fits(k + d):
                k += d
        if fits(k) and (k + d < 1 or not fits(k + d)):
            return answer("ok", k, "closed-form")
    lo, hi = 1, 2  # inside(lo); find hi outside
    while inside(hi):
        lo, hi = hi, hi * 2
        if hi > SEARCH_CAP:
            return answer(far, None, "search")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if inside(mid) else (lo, mid)
    return answer("ok", lo if grows else hi, "search")


@dataclass(frozen=True)
class Inverse:
    """An inverse problem as :func:`largest` and :func:`smallest` are asked it: the memory
    ``expr`` (one expression, or terms each rounded up to a whole byte), the ``values`` of every
    other symbol, the ``unknown``, the ``limit`` in bytes, the step ``multiple_of`` and the
    ``question`` the answer names (default: "largest b", "smallest N_d", ...)."""

    expr: sympy.Expr | Sequence[sympy.Expr]
    values: Mapping[sympy.Symbol | str, int]
    unknown: sympy.Symbol | str
    limit: int
    _: KW_ONLY
    multiple_of: int = 1
    question: str | None = None


def _problem(ask: Inverse) -> _Problem:
    """The checked inputs of :func:`largest` and :func:`smallest`, as one problem."""
    positive_int("multiple_of", ask.multiple_of)
    terms = expr_terms("expr", ask.expr)
    symbol = symbol_named("unknown", ask.unknown)
    numbers = symbol_values("values", ask.values)
    if isinstance(ask.limit, bool) or not isinstance(ask.limit, int):
        raise InputError("limit", "must be an integer number of bytes", got=ask.limit)
    return _Problem(terms, numbers, symbol, ask.multiple_of)


@after(Inverse)
def largest(ask: Inverse) -> Solution:
    """The largest multiple of ``multiple_of`` for ``unknown`` whose memory fits ``limit`` bytes.

    ``expr`` is one expression or a sequence of terms (each rounded up to a whole byte, as
    :func:`~vrammath.compose.estimate.estimate` rounds components); ``values`` gives every other symbol.
    Memory must not decrease as ``unknown`` grows. Symbols may be named by their names in
    :mod:`vrammath.notation.symbols` (looked up, never parsed).

    >>> from vrammath.notation.symbols import b, s, h
    >>> sol = largest(2 * b * s * h + 5 * b * s**2, {b: 1, h: 4096}, s, 10**9)
    >>> sol.value, sol.method, sol.verified
    (13346, 'closed-form', True)
    """
    return _solve(_problem(ask), ask.limit, ask.question, grows=True)


@after(Inverse)
def smallest(ask: Inverse) -> Solution:
    """The smallest multiple of ``multiple_of`` for ``unknown`` whose memory fits ``limit`` bytes.

    Memory must not increase as ``unknown`` grows (``N_d``, ``t``, ``p``). The neighbour checked
    is ``value - multiple_of`` (absent when the answer is the first candidate).

    >>> from vrammath.notation.symbols import P, N_d
    >>> sol = smallest([2 * P, 14 * P / N_d], {P: 7 * 10**9}, N_d, 40 * 10**9)
    >>> sol.value, sol.neighbour, sol.method
    (4, 3, 'closed-form')
    """
    return _solve(_problem(ask), ask.limit, ask.question, grows=False)


__all__ = [
    "SEARCH_CAP",
    "Inverse",
    "Solution",
    "largest",
    "smallest",
]
