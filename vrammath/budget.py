"""The bytes a setup may use, and the exact rule that counts them.

The budget is the GPU's total memory as the driver reports it, less a fraction kept free
(``headroom``), less ``reserve_bytes`` for what no tensor count sees: the CUDA context, the
cuBLAS/cuDNN workspaces and NCCL's buffers. The default reserve, :data:`DEFAULT_RESERVE_BYTES`
(1 GiB), is a round upper figure for a PyTorch process that has initialised CUDA: PyTorch's
switch to CUDA lazy module loading measured a bare context at 287,047,680 bytes (666,632,192
bytes loading every module eagerly; reference 1), users report 781 MB in ``nvidia-smi`` for a first
tensor (reference 2), and cuBLAS workspaces and NCCL buffers come on top. Measure yours with
``nvidia-smi`` after a first matmul and collective, and pass it as ``reserve_bytes``.

Values are computed exactly as :func:`~vrammath.estimate.estimate` computes them -- each term
rounded up to a whole byte, then summed (:func:`exact_bytes`) -- and a peak over phases (a
``Max``) is split into plain sums by :func:`branches`, which the solvers and sweeps evaluate.

Examples
========

>>> budget("A100-80GB").usable == 80 * 2**30 - 2**30
True
>>> from vrammath.symbols import b, s
>>> branches(sympy.Max(b, s) + 1)
[b + 1, s + 1]

References
==========

.. [1] pytorch/pytorch pull request #86509, "Sets CUDA_MODULE_LOADING to LAZY when not set by
   the user" (context memory with lazy and eager module loading).
.. [2] pytorch/pytorch issue #34323, "PyTorch GPU memory allocation".
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction

import sympy

from vrammath.errors import InputError, positive_int
from vrammath.estimate import Estimate
from vrammath.presets import gpu
from vrammath.setup import Setup
from vrammath.units import GiB, fmt_bytes

DEFAULT_RESERVE_BYTES = GiB
"""Bytes kept back for the CUDA context, library workspaces and NCCL buffers (1 GiB)."""


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


def setup_budget(setup: Setup, given: Budget | None = None) -> Budget:
    """``given``, else the setup's GPU with the default reserve (an error if it names none)."""
    if given is not None:
        return given
    if setup.gpu is None:
        raise InputError("gpu", "name a GPU in the setup or pass a Budget")
    return budget(setup.gpu)


# --- exact evaluation ------------------------------------------------------------------------


def gpu_terms(est: Estimate) -> tuple[sympy.Expr, ...]:
    """The per-GPU peak as terms to sum: ``est.gpu_expr()``, the largest phase, as one term
    (rounded up as a whole, exactly as ``est.gpu_bytes`` rounds it)."""
    return (est.gpu_expr(),)


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


def active_branch(expr: sympy.Expr, values: Mapping[sympy.Symbol, int]) -> sympy.Expr:
    """The branch of ``expr`` that is largest at ``values`` (where its derivative is taken)."""
    return max(branches(expr), key=lambda br: float(br.subs(values)))


__all__ = [
    "DEFAULT_RESERVE_BYTES",
    "Budget",
    "active_branch",
    "branches",
    "budget",
    "exact_bytes",
    "gpu_terms",
    "setup_budget",
]
