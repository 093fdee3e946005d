"""Answers read off the expressions: inverse problems, sensitivities and vectorized sweeps.

The forward direction is :func:`vrammath.estimate.estimate`: a setup in, bytes out. This module
runs it backwards on the same sympy objects -- the GPU total ``est.gpu_expr()`` with the numbers
in ``est.values`` -- to answer the questions people ask of a memory model:

* the largest micro-batch ``b``, the longest sequence ``s``, the fewest data-parallel GPUs ``N_d``
  that fit a GPU with a stated headroom (:func:`largest_micro_batch`, :func:`longest_sequence`,
  :func:`fewest_gpus`, and the generic :func:`largest` / :func:`smallest` for any expression);
* the cheapest combination of ZeRO stage, CPU offload and recomputation that fits
  (:func:`cheapest_fit`);
* which knob buys the most memory back (:func:`sensitivities`, :func:`ranking`);
* the total over arrays of settings, compiled once with :func:`sympy.lambdify` (:func:`sweep`;
  needs numpy, the ``numpy`` extra).

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

Values are computed exactly as :func:`~vrammath.estimate.estimate` computes them -- each component
rounded up to a whole byte, then summed -- so ``solution.bytes`` equals
``estimate(setup with the answer).gpu_bytes``.

The budget is the GPU's total memory as the driver reports it, less a fraction kept free
(``headroom``), less ``reserve_bytes`` for what no tensor count sees: the CUDA context, the
cuBLAS/cuDNN workspaces and NCCL's buffers. The default reserve, :data:`DEFAULT_RESERVE_BYTES`
(1 GiB), is a round upper figure for a PyTorch process that has initialised CUDA: PyTorch's
switch to CUDA lazy module loading measured a bare context at 287,047,680 bytes (666,632,192
bytes loading every module eagerly; reference 3), users report 781 MB in ``nvidia-smi`` for a first tensor
(reference 4), and cuBLAS workspaces and NCCL buffers come on top. Measure yours with ``nvidia-smi``
after a first matmul and collective, and pass it as ``reserve_bytes``.

Examples
========

>>> from vrammath.estimate import estimate
>>> from vrammath.setup import Setup
>>> from vrammath.presets import load_model
>>> est = estimate(Setup(load_model("llama-7b"), zero=3, gpus=8, gpu="A100-40GB"))
>>> sol = fewest_gpus(est)
>>> sol.method, sol.verified
('closed-form', True)
>>> from vrammath.setup import with_changes
>>> estimate(with_changes(est.setup, gpus=sol.value)).gpu_bytes == sol.bytes <= sol.limit
True
>>> estimate(with_changes(est.setup, gpus=sol.value - 1)).gpu_bytes > sol.limit
True
>>> plan = cheapest_fit(est.setup)
>>> [t.fits for t in plan.tried][-2:]
[False, True]

A generic expression works too -- here a made-up activation term in ``b``:

>>> from vrammath.symbols import P, b
>>> largest([16 * P, 3 * 10**9 * b], {P: 10**9}, b, 80 * 10**9).value
21

References
==========

.. [1] Rajbhandari et al. 2020, "ZeRO", arXiv:1910.02054 (communication volume per stage).
.. [2] Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
   arXiv:2205.05198 (what selective and full recomputation recompute).
.. [3] pytorch/pytorch pull request #86509, "Sets CUDA_MODULE_LOADING to LAZY when not set by
   the user" (context memory with lazy and eager module loading).
.. [4] pytorch/pytorch issue #34323, "PyTorch GPU memory allocation".
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

import sympy

from vrammath.errors import InputError, positive_int
from vrammath.estimate import Estimate, estimate
from vrammath.parallel import STAGES, zero_communication_elements
from vrammath.params import layer_param_count
from vrammath.presets import gpu
from vrammath.setup import RECOMPUTE, Setup, with_changes
from vrammath.symbols import N_d, b, by_name, p, s, t
from vrammath.units import GiB, fmt_bytes

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

DEFAULT_RESERVE_BYTES = GiB
"""Bytes kept back for the CUDA context, library workspaces and NCCL buffers (1 GiB)."""

SEARCH_CAP = 2**48
"""Largest value an integer search tries before it calls the answer unbounded."""

Status = Literal["ok", "none-fits", "unbounded"]
Method = Literal["closed-form", "search", "constant"]


# --- the budget ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    """The bytes a setup may use on one GPU: capacity, less a headroom fraction, less a reserve.

    >>> Budget(80 * 2**30, headroom=0.1, reserve_bytes=0).usable == 72 * 2**30
    True
    """

    capacity: int
    headroom: float = 0.0
    reserve_bytes: int = DEFAULT_RESERVE_BYTES
    gpu: str | None = None

    def __post_init__(self) -> None:
        positive_int("capacity", self.capacity)
        if isinstance(self.headroom, bool) or not isinstance(self.headroom, int | float):
            raise InputError("headroom", "must be a fraction in [0, 1)", got=self.headroom)
        if not 0 <= self.headroom < 1:
            raise InputError("headroom", "must be a fraction in [0, 1)", got=self.headroom)
        if (
            isinstance(self.reserve_bytes, bool)
            or not isinstance(self.reserve_bytes, int)
            or self.reserve_bytes < 0
        ):
            raise InputError(
                "reserve_bytes", "must be a non-negative integer", got=self.reserve_bytes
            )

    @property
    def usable(self) -> int:
        """Bytes available to the estimated components (may be negative for a tiny GPU)."""
        kept = Fraction(self.headroom).limit_denominator(10**9)
        return math.floor(self.capacity * (1 - kept)) - self.reserve_bytes

    def describe(self) -> str:
        """One line: the GPU, its capacity and what is usable after headroom and reserve."""
        name = self.gpu or "GPU"
        return (
            f"{name} ({fmt_bytes(self.capacity)}): usable {fmt_bytes(self.usable)} after "
            f"{self.headroom:.0%} headroom and {fmt_bytes(self.reserve_bytes)} reserved"
        )


def budget(
    device: str | int,
    *,
    headroom: float = 0.0,
    reserve_bytes: int = DEFAULT_RESERVE_BYTES,
) -> Budget:
    """A :class:`Budget` for a GPU preset name (see ``vrammath gpus``) or a capacity in bytes.

    >>> budget("A100-80GB").usable == 80 * 2**30 - 2**30
    True
    >>> budget("A100-80GB", headroom=1.5)
    Traceback (most recent call last):
    ...
    vrammath.errors.InputError: headroom: must be a fraction in [0, 1) (got 1.5)
    """
    if isinstance(device, str):
        spec = gpu(device)
        return Budget(spec.bytes, headroom, reserve_bytes, spec.name)
    return Budget(device, headroom, reserve_bytes)


def _budget_of(setup: Setup) -> Budget:
    if setup.gpu is None:
        raise InputError("gpu", "name a GPU in the setup or pass a Budget")
    return budget(setup.gpu)


def _limit(setup: Setup, given: Budget | None) -> int:
    """Usable bytes: the given budget's, else the setup's GPU with the default reserve."""
    return (given if given is not None else _budget_of(setup)).usable


# --- exact evaluation ------------------------------------------------------------------------


def _gpu_terms(est: Estimate) -> tuple[sympy.Expr, ...]:
    """The per-GPU peak as terms to sum: ``est.gpu_expr()``, the largest phase, as one term
    (rounded up as a whole, exactly as ``est.gpu_bytes`` rounds it)."""
    return (est.gpu_expr(),)


def _as_terms(expr: sympy.Expr | Sequence[sympy.Expr]) -> tuple[sympy.Expr, ...]:
    if isinstance(expr, sympy.Basic):
        return (sympy.sympify(expr),)
    return tuple(sympy.sympify(e) for e in expr)


def exact_bytes(terms: Iterable[sympy.Expr], values: Mapping[sympy.Symbol, int]) -> int:
    """Each term rounded up to a whole byte, then summed -- the rule of ``estimate``.

    >>> from vrammath.symbols import P, N_d
    >>> exact_bytes([2 * P, 8 * P / N_d], {P: 10, N_d: 3})
    47
    """
    total = 0
    for term in terms:
        value = sympy.ceiling(term.subs(values))
        if not value.is_Integer:
            missing = sorted(str(x) for x in value.free_symbols)
            raise InputError("values", "must give a number for every symbol", got=missing)
        total += int(value)
    return total


# --- inverse problems ------------------------------------------------------------------------


@dataclass(frozen=True)
class Solution:
    """The answer to one inverse problem, with the evidence that verifies it.

    ``value`` is the answer (None when nothing fits, or when the memory does not depend on the
    unknown and any value fits: see ``status``). ``bytes`` is the exact memory at ``value``;
    ``neighbour`` is the next value in the direction that stops fitting (``value + step`` for a
    largest answer, ``value - step`` for a smallest one) and ``neighbour_bytes`` its memory, which
    exceeds ``limit`` -- the back-substitution every answer passes.
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

    @property
    def verified(self) -> bool:
        """True when the answer fits and its neighbour does not (or no neighbour exists)."""
        if self.status != "ok" or self.value is None or self.bytes is None:
            return False
        if self.bytes > self.limit:
            return False
        return self.neighbour is None or (
            self.neighbour_bytes is not None and self.neighbour_bytes > self.limit
        )

    def __str__(self) -> str:
        if self.status == "unbounded":
            return (
                f"{self.question}: no limit -- the estimated memory does not grow with "
                f"{self.unknown}"
            )
        if self.status == "none-fits":
            return f"{self.question}: none fits ({fmt_bytes(self.limit)} usable)"
        assert self.bytes is not None
        text = (
            f"{self.question}: {self.unknown} = {self.value} "
            f"({fmt_bytes(self.bytes)} of {fmt_bytes(self.limit)} usable"
        )
        if self.neighbour is not None and self.neighbour_bytes is not None:
            text += f"; {self.neighbour} needs {fmt_bytes(self.neighbour_bytes)}"
        return text + f") [{self.method}]"


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
        self.terms = tuple(term.subs(others).subs(unknown, step * self.k) for term in terms)
        self.step = step
        stray = set().union(*(term.free_symbols for term in self.terms)) - {self.k}
        if stray:
            raise InputError(
                "values", "must give a number for every symbol", got=sorted(map(str, stray))
            )
        self.expr = sympy.Add(*self.terms)
        self._cache: dict[int, int] = {}

    def at(self, k: int) -> int:
        if k not in self._cache:
            self._cache[k] = sum(int(sympy.ceiling(term.subs(self.k, k))) for term in self.terms)
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
        expr=prob.expr.subs(prob.k, unknown / step),
    )


_ADJUST = 3  # steps a closed-form candidate may move to absorb per-component rounding


def largest(
    expr: sympy.Expr | Sequence[sympy.Expr],
    values: Mapping[sympy.Symbol, int],
    unknown: sympy.Symbol,
    limit: int,
    *,
    multiple_of: int = 1,
    question: str | None = None,
) -> Solution:
    """The largest multiple of ``multiple_of`` for ``unknown`` whose memory fits ``limit`` bytes.

    ``expr`` is one expression or a sequence of terms (each rounded up to a whole byte, as
    :func:`~vrammath.estimate.estimate` rounds components); ``values`` gives every other symbol.
    Memory must not decrease as ``unknown`` grows.

    >>> from vrammath.symbols import b, s, h
    >>> sol = largest(2 * b * s * h + 5 * b * s**2, {b: 1, h: 4096}, s, 10**9)
    >>> sol.value, sol.method, sol.verified
    (13346, 'closed-form', True)
    """
    positive_int("multiple_of", multiple_of)
    terms = _as_terms(expr)
    prob = _Problem(terms, values, unknown, multiple_of)
    name = question or f"largest {unknown}"

    def fits(k: int) -> bool:
        return prob.at(k) <= limit

    if not fits(1):
        return _solution(name, unknown, prob, limit, "none-fits", None, "search", None)
    if prob.k not in prob.expr.free_symbols:
        return _solution(name, unknown, prob, limit, "unbounded", None, "constant", None)
    roots = prob.boundary_roots(limit)
    if roots:
        k = max(1, int(sympy.floor(roots[-1])))
        for _ in range(_ADJUST):
            if k > 1 and not fits(k):
                k -= 1
            elif fits(k + 1):
                k += 1
        if fits(k) and not fits(k + 1):
            return _solution(name, unknown, prob, limit, "ok", k, "closed-form", k + 1)
    lo, hi = 1, 2  # fits(lo); find hi with not fits(hi)
    while fits(hi):
        lo, hi = hi, hi * 2
        if hi > SEARCH_CAP:
            return _solution(name, unknown, prob, limit, "unbounded", None, "search", None)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return _solution(name, unknown, prob, limit, "ok", lo, "search", lo + 1)


def smallest(
    expr: sympy.Expr | Sequence[sympy.Expr],
    values: Mapping[sympy.Symbol, int],
    unknown: sympy.Symbol,
    limit: int,
    *,
    multiple_of: int = 1,
    question: str | None = None,
) -> Solution:
    """The smallest multiple of ``multiple_of`` for ``unknown`` whose memory fits ``limit`` bytes.

    Memory must not increase as ``unknown`` grows (``N_d``, ``t``, ``p``). The neighbour checked
    is ``value - multiple_of`` (absent when the answer is the first candidate).

    >>> from vrammath.symbols import P, N_d
    >>> sol = smallest([2 * P, 14 * P / N_d], {P: 7 * 10**9}, N_d, 40 * 10**9)
    >>> sol.value, sol.neighbour, sol.method
    (4, 3, 'closed-form')
    """
    positive_int("multiple_of", multiple_of)
    terms = _as_terms(expr)
    prob = _Problem(terms, values, unknown, multiple_of)
    name = question or f"smallest {unknown}"

    def fits(k: int) -> bool:
        return prob.at(k) <= limit

    def done(k: int, method: Method) -> Solution:
        return _solution(name, unknown, prob, limit, "ok", k, method, None if k == 1 else k - 1)

    if fits(1):
        return done(1, "constant" if prob.k not in prob.expr.free_symbols else "search")
    if prob.k not in prob.expr.free_symbols:
        return _solution(name, unknown, prob, limit, "none-fits", None, "constant", None)
    roots = prob.boundary_roots(limit, largest=False)
    if roots:
        k = max(1, int(sympy.ceiling(roots[-1])))
        for _ in range(_ADJUST):
            if not fits(k):
                k += 1
            elif k > 1 and fits(k - 1):
                k -= 1
        if fits(k) and (k == 1 or not fits(k - 1)):
            return done(k, "closed-form")
    lo, hi = 1, 2  # not fits(lo); find hi with fits(hi)
    while not fits(hi):
        lo, hi = hi, hi * 2
        if hi > SEARCH_CAP:
            return _solution(name, unknown, prob, limit, "none-fits", None, "search", None)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return done(hi, "search")


def largest_micro_batch(
    est: Estimate, budget: Budget | None = None, *, multiple_of: int = 1
) -> Solution:
    """The largest micro-batch ``b`` whose estimated GPU total fits ``budget``.

    ``budget`` defaults to the setup's GPU with :data:`DEFAULT_RESERVE_BYTES` reserved. While no
    estimated component depends on ``b`` the answer is ``unbounded``; see ``est.unestimated``.
    """
    lim = _limit(est.setup, budget)
    return largest(
        _gpu_terms(est), est.values, b, lim, multiple_of=multiple_of, question="largest micro-batch"
    )


def longest_sequence(
    est: Estimate, budget: Budget | None = None, *, multiple_of: int = 1
) -> Solution:
    """The longest sequence ``s`` (a multiple of ``multiple_of``) that fits ``budget``."""
    lim = _limit(est.setup, budget)
    return largest(
        _gpu_terms(est), est.values, s, lim, multiple_of=multiple_of, question="longest sequence"
    )


def fewest_gpus(est: Estimate, budget: Budget | None = None, *, multiple_of: int = 1) -> Solution:
    """The fewest data-parallel GPUs ``N_d`` (a multiple of ``multiple_of``) that fit ``budget``.

    With ZeRO-0 nothing is sharded: the answer is 1 or nothing fits.
    """
    lim = _limit(est.setup, budget)
    return smallest(
        _gpu_terms(est), est.values, N_d, lim, multiple_of=multiple_of, question="fewest GPUs"
    )


# --- the cheapest plan -----------------------------------------------------------------------

OFFLOAD_OPTIMIZER_COST = Fraction(1)
"""Relative step-time cost charged for optimizer offload (CPU Adam + PCIe traffic); a ranking
weight, not a prediction. It sits above ZeRO-3's extra communication (1/2), as DeepSpeed's and
Hugging Face's guidance orders them: stage 2 < stage 3 < offload."""

OFFLOAD_PARAMS_COST = Fraction(1)
"""Further relative cost charged for parameter offload (weights stream over PCIe every step)."""


def recompute_cost(setup: Setup) -> Fraction:
    """Extra training FLOPs of a recomputation policy, as a fraction of a step without it.

    Forward FLOPs per layer are ``2 b s N_layer`` for the matmuls with weights plus ``4 b s^2 a d``
    for the two attention matmuls; a training step is three forwards' worth. ``full`` repeats the
    forward (1/3); ``selective`` repeats only the attention core (Korthikanti et al. 2022).

    >>> from vrammath.presets import load_model
    >>> float(recompute_cost(Setup(load_model("llama-7b"), recompute="selective")))  # doctest: +ELLIPSIS
    0.0255...
    """
    if setup.recompute == "none":
        return Fraction(0)
    if setup.recompute == "full":
        return Fraction(1, 3)
    spec = setup.model
    core = 4 * setup.seq_len * spec.heads * spec.head_dim  # per token
    forward = 2 * layer_param_count(spec) + core
    return Fraction(core, 3 * forward)


def plan_cost(setup: Setup) -> Fraction:
    """The ranking cost of a setup's memory-saving options (lower is cheaper).

    ZeRO's extra communication (stage 3 moves 3P elements per step against 2P, ZeRO section 7)
    + :func:`recompute_cost` + the offload weights :data:`OFFLOAD_OPTIMIZER_COST` and
    :data:`OFFLOAD_PARAMS_COST`.
    """
    ratio = sympy.Rational(zero_communication_elements(setup.zero) / zero_communication_elements(0))
    comm = Fraction(int(ratio.p), int(ratio.q)) - 1
    cost = comm + recompute_cost(setup)
    if setup.offload_optimizer:
        cost += OFFLOAD_OPTIMIZER_COST
    if setup.offload_params:
        cost += OFFLOAD_PARAMS_COST
    return cost


def plan_label(setup: Setup) -> str:
    """``'ZeRO-3 + offload optimizer + recompute full'`` style name of a setup's options."""
    parts = [f"ZeRO-{setup.zero}"]
    if setup.offload_optimizer:
        parts.append("offload optimizer")
    if setup.offload_params:
        parts.append("offload params")
    if setup.recompute != "none":
        parts.append(f"recompute {setup.recompute}")
    return " + ".join(parts)


@dataclass(frozen=True)
class Tried:
    """One candidate :func:`cheapest_fit` evaluated: its name, cost, GPU bytes and verdict."""

    label: str
    cost: Fraction
    bytes: int
    fits: bool


@dataclass(frozen=True)
class Plan:
    """The cheapest fitting combination (``setup`` None when none fits) and what was tried.

    Every candidate in ``tried`` before the chosen one is cheaper and does not fit.
    """

    setup: Setup | None
    estimate: Estimate | None
    limit: int
    tried: tuple[Tried, ...]

    @property
    def label(self) -> str:
        """The chosen plan's name, or ``'none'``."""
        return "none" if self.setup is None else plan_label(self.setup)

    def __str__(self) -> str:
        if self.setup is None or self.estimate is None:
            return (
                f"which stage: nothing fits ({len(self.tried)} combinations tried, "
                f"{fmt_bytes(self.limit)} usable)"
            )
        return (
            f"which stage: {self.label} on {self.setup.gpus} GPU(s) "
            f"({fmt_bytes(self.estimate.gpu_bytes)} of {fmt_bytes(self.limit)} usable; "
            f"{len(self.tried) - 1} cheaper combination(s) do not fit)"
        )


def candidates(
    setup: Setup,
    *,
    stages: Iterable[int] = STAGES,
    offload: bool = True,
    recompute: Iterable[str] = RECOMPUTE,
) -> list[Setup]:
    """Every valid variant of ``setup`` over ZeRO stage, offload and recomputation, cheapest first.

    Ties in :func:`plan_cost` go to the lower stage, then to fewer offloads. Selective
    recomputation is Megatron's: it is tried only where the setup uses Korthikanti's formulas
    (Hugging Face models offer none or full); combinations a setup refuses are skipped.
    """
    hf_run = setup.activation_model != "korthikanti" and setup.tp == 1 and setup.pp == 1
    out = []
    offloads = [(False, False), (True, False), (True, True)] if offload else [(False, False)]
    for stage in stages:
        for opt, par in offloads:
            if (opt and stage == 0) or (par and stage != 3):
                continue
            for policy in recompute:
                if policy == "selective" and hf_run:
                    continue
                try:
                    variant = with_changes(
                        setup,
                        zero=stage,
                        offload_optimizer=opt,
                        offload_params=par,
                        recompute=policy,
                    )
                except InputError:
                    continue
                out.append(variant)
    return sorted(out, key=lambda c: (plan_cost(c), c.zero, c.offload_optimizer, c.offload_params))


def cheapest_fit(
    setup: Setup,
    budget: Budget | None = None,
    *,
    stages: Iterable[int] = STAGES,
    offload: bool = True,
    recompute: Iterable[str] = RECOMPUTE,
    cost: Callable[[Setup], Fraction] | None = None,
) -> Plan:
    """The cheapest combination of ZeRO stage, CPU offload and recomputation that fits.

    Candidates (:func:`candidates`) are estimated in order of ``cost`` (default
    :func:`plan_cost`); the first that fits is the plan, so every cheaper one is shown not to fit.
    """
    lim = _limit(setup, budget)
    pool = candidates(setup, stages=stages, offload=offload, recompute=recompute)
    if cost is not None:
        pool = sorted(pool, key=cost)
    rank = cost or plan_cost
    tried: list[Tried] = []
    for cand in pool:
        est = estimate(cand)
        ok = est.gpu_bytes <= lim
        tried.append(Tried(plan_label(cand), rank(cand), est.gpu_bytes, ok))
        if ok:
            return Plan(cand, est, lim, tuple(tried))
    return Plan(None, None, lim, tuple(tried))


# --- all answers at once (the CLI's ``fit``) ---------------------------------------------------


@dataclass(frozen=True)
class Fit:
    """Every answer for one setup on one GPU: the cheapest plan at the setup's GPU count, then --
    on that plan, or on the setup as given when nothing fits -- the largest micro-batch, the
    longest sequence and the fewest data-parallel GPUs."""

    setup: Setup
    budget: Budget
    plan: Plan
    basis: Estimate
    batch: Solution
    sequence: Solution
    gpus: Solution

    def lines(self) -> list[str]:
        """One line per answer, then the breakdown of the plan they were solved on."""
        missing = self.basis.unestimated
        caveat = f" (not estimated: {', '.join(missing)})" if missing else ""
        basis = self.basis.setup
        return [
            f"{basis.model.name} on {self.budget.describe()}",
            str(self.plan),
            str(self.batch) + (caveat if self.batch.status == "unbounded" else ""),
            str(self.sequence) + (caveat if self.sequence.status == "unbounded" else ""),
            f"{self.gpus} with {plan_label(basis)}",
            f"breakdown ({plan_label(basis)}, {basis.gpus} GPU(s), micro-batch "
            f"{basis.micro_batch} x {basis.seq_len} tokens):",
            self.basis.table(),
        ]


def fit(setup: Setup, budget: Budget | None = None) -> Fit:
    """All of :func:`cheapest_fit`, :func:`largest_micro_batch`, :func:`longest_sequence` and
    :func:`fewest_gpus` for ``setup`` on ``budget`` (default: the setup's GPU).

    >>> from vrammath.presets import load_model
    >>> answer = fit(Setup(load_model("llama-7b"), gpus=8, gpu="A100-80GB"))
    >>> answer.plan.label in ("ZeRO-1", "ZeRO-2", "ZeRO-3"), answer.gpus.verified
    (True, True)
    """
    bud = budget if budget is not None else _budget_of(setup)
    plan = cheapest_fit(setup, bud)
    basis = plan.estimate if plan.estimate is not None else estimate(setup)
    return Fit(
        setup=setup,
        budget=bud,
        plan=plan,
        basis=basis,
        batch=largest_micro_batch(basis, bud),
        sequence=longest_sequence(basis, bud),
        gpus=fewest_gpus(basis, bud),
    )


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

    >>> from vrammath.estimate import estimate
    >>> from vrammath.setup import Setup
    >>> from vrammath.presets import load_model
    >>> est = estimate(Setup(load_model("llama-7b"), zero=2, gpus=4))
    >>> opt = [x for x in sensitivities(est, ["N_d"]) if x.component == "optimizer"][0]
    >>> opt.derivative, opt.elasticity
    (-8*P/N_d**2, -1.0)
    """
    syms = [by_name(k) if isinstance(k, str) else k for k in knobs]
    rows = [(c.key, c.expr) for c in est.components if c.device == "gpu" and c.expr is not None]
    rows.append(("total", est.gpu_expr()))
    out = []
    for key, expr in rows:
        here = exact_bytes([expr], est.values)
        active = _active_branch(expr, est.values)  # the total is the largest phase
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

    >>> from vrammath.estimate import estimate
    >>> from vrammath.setup import Setup
    >>> from vrammath.presets import load_model
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


def branches(expr: sympy.Expr) -> list[sympy.Expr]:
    """Max-free expressions whose largest is ``expr`` (a phase peak is a ``Max`` of sums).

    ``Max`` is distributed over sums and positive factors, so each branch is a plain sum that
    solvers and numpy evaluate directly; ``ceiling(max) == max(ceiling)`` keeps rounding exact.

    >>> from vrammath.symbols import b, s
    >>> branches(sympy.Max(b, s) + 1)
    [b + 1, s + 1]
    """
    expr = sympy.sympify(expr)
    if isinstance(expr, sympy.Max):
        return [br for arg in expr.args for br in branches(arg)]
    if isinstance(expr, sympy.Add | sympy.Mul) and expr.has(sympy.Max):
        parts = [branches(arg) for arg in expr.args]
        op = sympy.Add if isinstance(expr, sympy.Add) else sympy.Mul
        return [op(*combo) for combo in itertools.product(*parts)]
    return [expr]


def _active_branch(expr: sympy.Expr, values: Mapping[sympy.Symbol, int]) -> sympy.Expr:
    """The branch of ``expr`` that is largest at ``values`` (where its derivative is taken)."""
    return max(branches(expr), key=lambda br: float(br.subs(values)))


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
    >>> from vrammath.estimate import estimate
    >>> from vrammath.setup import Setup
    >>> from vrammath.presets import load_model
    >>> est = estimate(Setup(load_model("llama-7b"), zero=3, gpus=8))
    >>> out = sweep(est, {"N_d": np.array([1, 8, 64])})
    >>> int(out[1]) == est.gpu_bytes
    True
    """
    import numpy as np

    terms = _gpu_terms(est)
    swept = {by_name(k) if isinstance(k, str) else k: v for k, v in axes.items()}
    unknown = [sym for sym in swept if sym not in est.values]
    if unknown:
        raise InputError("axes", "must name symbols of the estimate", got=[str(x) for x in unknown])
    args = tuple(sorted(set().union(*(term.free_symbols for term in terms)), key=str))
    func = _compiled(terms, args)
    arrays = {sym: np.asarray(v, dtype=np.float64) for sym, v in swept.items()}
    shape = np.broadcast_shapes(*(arr.shape for arr in arrays.values())) if arrays else ()
    params = [arrays.get(sym, float(est.values[sym])) for sym in args]
    out = np.broadcast_to(np.asarray(func(*params), dtype=np.float64), shape)
    return out.astype(np.int64)


__all__ = [
    "DEFAULT_RESERVE_BYTES",
    "KNOBS",
    "OFFLOAD_OPTIMIZER_COST",
    "OFFLOAD_PARAMS_COST",
    "SEARCH_CAP",
    "Budget",
    "Fit",
    "Plan",
    "Sensitivity",
    "Solution",
    "Tried",
    "branches",
    "budget",
    "candidates",
    "cheapest_fit",
    "compiled_cache_info",
    "exact_bytes",
    "fewest_gpus",
    "fit",
    "largest",
    "largest_micro_batch",
    "longest_sequence",
    "plan_cost",
    "plan_label",
    "ranking",
    "recompute_cost",
    "sensitivities",
    "smallest",
    "sweep",
]
