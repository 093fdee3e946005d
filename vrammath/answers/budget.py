"""The bytes a setup may use, and the exact rule that counts them.

The budget is the GPU's total memory as the driver reports it, less a fraction kept free
(``headroom``), less ``reserve_bytes`` for what no tensor count sees: the CUDA context, the
cuBLAS/cuDNN workspaces and NCCL's buffers. The default reserve, :data:`DEFAULT_RESERVE_BYTES`
(1 GiB), is a round upper figure for a PyTorch process that has initialised CUDA: PyTorch's
switch to CUDA lazy module loading measured a bare context at 287,047,680 bytes (666,632,192
bytes loading every module eagerly; reference 1), users report 781 MB in ``nvidia-smi`` for a first
tensor (reference 2), and cuBLAS workspaces and NCCL buffers come on top. Measure yours with
``nvidia-smi`` after a first matmul and collective, and pass it as ``reserve_bytes``.

Values are computed exactly as :func:`~vrammath.compose.estimate.estimate` computes them -- each term
rounded up to a whole byte, then summed (:func:`exact_bytes`) -- and a peak over phases (a
``Max``) is split into plain sums by :func:`branches`, which the solvers and sweeps evaluate.

Examples
========

>>> budget("A100-80GB").usable == 80 * 2**30 - 2**30
True
>>> from vrammath.notation.symbols import b, s
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
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import cache

import sympy

from vrammath.compose.estimate import Estimate
from vrammath.compose.setup import Setup
from vrammath.model.presets import conf_dir, gpu
from vrammath.notation.errors import InputError, one_of, positive_int
from vrammath.notation.symbols import notation
from vrammath.notation.units import GiB, fmt_bytes

DEFAULT_RESERVE_BYTES = GiB
"""Bytes kept back for the CUDA context, library workspaces and NCCL buffers (1 GiB)."""

DEFAULT_GPUS_PER_NODE = 8
"""The GPUs sharing one host when no node is named (the 8-GPU board of DGX/HGX servers)."""


# --- node presets (the host side) --------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """A server preset from ``conf/nodes.toml``: its GPU, GPUs per node and system memory."""

    name: str
    gpu: str
    gpus: int
    host_bytes: int
    label: str
    source: str


@cache
def load_nodes() -> dict[str, Node]:
    """Every node preset, by name (read once from ``conf/nodes.toml``).

    >>> load_nodes()["DGX-A100-640GB"].host_bytes == 2 * 2**40
    True
    """
    data = tomllib.loads((conf_dir() / "nodes.toml").read_text(encoding="utf-8"))
    return {
        name: Node(
            name,
            str(row["gpu"]),
            int(row["gpus"]),
            int(row["host_bytes"]),
            str(row["label"]),
            str(row["source"]),
        )
        for name, row in data["node"].items()
    }


def node_preset(name: str) -> Node:
    """The node preset called ``name``.

    >>> node_preset("DGX-H100").gpus
    8
    >>> node_preset("DGX-1")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: node: must be one of DGX-A100-320GB, ... (got 'DGX-1')
    """
    nodes = load_nodes()
    if not isinstance(name, str) or name not in nodes:
        raise one_of("node", name, list(nodes))
    return nodes[name]


def default_node(gpu_name: str) -> Node | None:
    """The node preset holding ``gpu_name`` (the DGX of that GPU), or None if there is none.

    >>> default_node("A100-80GB").name, default_node("RTX-4090-24GB")
    ('DGX-A100-640GB', None)
    """
    return next((n for n in load_nodes().values() if n.gpu == gpu_name), None)


# --- the budget ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    """The bytes a setup may use: on one GPU (capacity, less a headroom fraction, less a reserve)
    and on its host (``host_bytes`` of system memory per node, shared by ``gpus_per_node`` ranks;
    None when unknown, and then the host side is shown but not checked).

    >>> Budget(80 * 2**30, headroom=0.1, reserve_bytes=0).usable == 72 * 2**30
    True
    >>> Budget(80 * 2**30, host_bytes=0)
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: host_bytes: must be a positive integer or None (got 0)
    """

    capacity: int
    headroom: float = 0.0
    reserve_bytes: int = DEFAULT_RESERVE_BYTES
    gpu: str | None = None
    host_bytes: int | None = None
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    node: str | None = None

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
        if self.usable <= 0:
            raise InputError(
                "reserve_bytes",
                f"must leave part of the GPU's {self.capacity} bytes after "
                f"{self.headroom:.0%} headroom",
                got=self.reserve_bytes,
            )
        if self.host_bytes is not None and (
            isinstance(self.host_bytes, bool)
            or not isinstance(self.host_bytes, int)
            or self.host_bytes <= 0
        ):
            raise InputError(
                "host_bytes", "must be a positive integer or None", got=self.host_bytes
            )
        positive_int("gpus_per_node", self.gpus_per_node)

    @property
    def usable(self) -> int:
        """Bytes of one GPU available to the estimated components."""
        kept = Fraction(self.headroom).limit_denominator(10**9)
        return math.floor(self.capacity * (1 - kept)) - self.reserve_bytes

    def describe_host(self) -> str:
        """The host side in words: the node, its system memory and GPUs per node."""
        if self.host_bytes is None:
            return f"host memory not given ({self.gpus_per_node} GPUs per node assumed)"
        name = self.node or "host"
        return f"{name}: {fmt_bytes(self.host_bytes)} per node, {self.gpus_per_node} GPUs per node"

    def describe(self) -> str:
        """One line: the GPU, its capacity and what is usable after headroom and reserve."""
        name = self.gpu or "GPU"
        return (
            f"{name} ({fmt_bytes(self.capacity)}): usable {fmt_bytes(self.usable)} after "
            f"{self.headroom:.0%} headroom and {fmt_bytes(self.reserve_bytes)} reserved"
        )

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form (bytes as integers)."""
        return {
            "gpu": self.gpu,
            "capacity_bytes": self.capacity,
            "headroom": self.headroom,
            "reserve_bytes": self.reserve_bytes,
            "usable_bytes": self.usable,
            "node": self.node,
            "host_bytes": self.host_bytes,
            "gpus_per_node": self.gpus_per_node,
        }


def budget(
    device: str | int,
    *,
    headroom: float = 0.0,
    reserve_bytes: int = DEFAULT_RESERVE_BYTES,
    node: str | None = None,
    host_bytes: int | None = None,
    gpus_per_node: int | None = None,
) -> Budget:
    """A :class:`Budget` for a GPU preset name (see ``vrammath gpus``) or a capacity in bytes.

    The host side comes from ``node`` (a preset of ``conf/nodes.toml``), else from ``host_bytes``
    and ``gpus_per_node``, else from the node preset that holds the named GPU (the GPU's DGX), if
    there is one; ``host_bytes`` and ``gpus_per_node`` override a node's figures.

    >>> budget("A100-80GB").usable == 80 * 2**30 - 2**30
    True
    >>> budget("A100-80GB").node, budget("A100-80GB", host_bytes=2**39).node
    ('DGX-A100-640GB', None)
    >>> budget("A100-80GB", headroom=1.5)
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: headroom: must be a fraction in [0, 1) (got 1.5)
    """
    name: str | None = None
    if isinstance(device, str):
        spec = gpu(device)
        capacity, name = spec.bytes, spec.name
    elif isinstance(device, bool) or not isinstance(device, int):
        raise InputError("device", "must be a GPU preset name or a capacity in bytes", got=device)
    else:
        capacity = device
    preset: Node | None = None
    if node is not None:
        preset = node_preset(node)
        if name is not None and preset.gpu != name:
            raise InputError("node", f"holds {preset.gpu}, not {name}", got=node)
    elif host_bytes is None and name is not None:
        preset = default_node(name)
    return Budget(
        capacity,
        headroom,
        reserve_bytes,
        name,
        host_bytes if host_bytes is not None else (preset.host_bytes if preset else None),
        gpus_per_node
        if gpus_per_node is not None
        else (preset.gpus if preset else DEFAULT_GPUS_PER_NODE),
        preset.name if preset is not None and host_bytes is None else None,
    )


def setup_budget(setup: Setup, given: Budget | None = None) -> Budget:
    """``given``, else the setup's GPU with the default reserve (an error if it names none)."""
    if given is not None:
        if not isinstance(given, Budget):
            raise InputError("budget", "must be a Budget (vrammath.budget(...)) or None", got=given)
        return given
    if not isinstance(setup, Setup):
        raise InputError("setup", "must be a vrammath.Setup", got=type(setup).__name__)
    if setup.gpu is None:
        raise InputError("gpu", "name a GPU in the setup or pass a Budget")
    return budget(setup.gpu)


# --- the host side ---------------------------------------------------------------------------


@dataclass(frozen=True)
class HostCheck:
    """The CPU side of one estimate: offloaded bytes per rank, times the ranks sharing a node,
    against the node's system memory (``limit`` None: not checked)."""

    per_rank: int
    ranks_per_node: int
    limit: int | None
    node: str | None = None

    @property
    def need(self) -> int:
        """The host bytes one node needs, ``per_rank * ranks_per_node``."""
        return self.per_rank * self.ranks_per_node

    @property
    def fits(self) -> bool | None:
        """True or False against the node's memory; None when nothing sets a limit."""
        if self.per_rank == 0:
            return True
        return None if self.limit is None else self.need <= self.limit

    def __str__(self) -> str:
        if self.per_rank == 0:
            return "host: nothing offloaded"
        text = (
            f"host: {fmt_bytes(self.per_rank)} per rank x {self.ranks_per_node} rank(s) per node "
            f"= {fmt_bytes(self.need)}"
        )
        if self.limit is None:
            return text + " (not checked: no host memory given)"
        verdict = "fits" if self.fits else "does NOT fit"
        return text + f" of {fmt_bytes(self.limit)} ({self.node or 'host'}): {verdict}"

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form (bytes as integers)."""
        return {
            "per_rank_bytes": self.per_rank,
            "ranks_per_node": self.ranks_per_node,
            "need_bytes": self.need,
            "limit_bytes": self.limit,
            "node": self.node,
            "fits": self.fits,
        }


def host_check(est: Estimate, bud: Budget) -> HostCheck:
    """The CPU side of ``est``: ``est.cpu_bytes`` per rank x the ranks one node holds.

    A run has ``gpus * tp * pp`` ranks; a node holds ``min(ranks, bud.gpus_per_node)`` of them.

    >>> from vrammath.compose.estimate import estimate
    >>> from vrammath.model.presets import load_model
    >>> est = estimate(Setup(load_model("llama-7b"), zero=3, gpus=16, offload_optimizer=True))
    >>> check = host_check(est, budget("A100-80GB"))
    >>> check.ranks_per_node, check.need == 8 * est.cpu_bytes, check.fits
    (8, True, True)
    """
    ranks = est.setup.gpus * est.setup.tp * est.setup.pp
    return HostCheck(est.cpu_bytes, min(ranks, bud.gpus_per_node), bud.host_bytes, bud.node)


# --- exact evaluation ------------------------------------------------------------------------


def symbol_named(
    field: str, value: object, allowed: Iterable[sympy.Symbol] | None = None
) -> sympy.Symbol:
    """``value`` as a symbol: a sympy Symbol, or the exact name of one in ``allowed`` (default:
    every symbol of :mod:`vrammath.notation.symbols`). Text is looked up, never parsed.

    >>> symbol_named("unknown", "N_d")
    N_d
    >>> from vrammath.notation.symbols import b, s
    >>> symbol_named("knobs", "h", [b, s])
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: knobs: must be one of b, s (got 'h')
    """
    pool = [row.symbol for row in notation()] if allowed is None else list(allowed)
    if isinstance(value, sympy.Symbol) and (allowed is None or value in pool):
        return value
    if isinstance(value, str):
        for sym in pool:
            if sym.name == value:
                return sym
    names = [sym.name for sym in pool]
    raise one_of(field, value if isinstance(value, str) else str(value), names)


def expr_terms(field: str, expr: object) -> tuple[sympy.Expr, ...]:
    """``expr`` (one sympy expression, an integer, or a sequence of them) as a tuple of terms.

    >>> from vrammath.notation.symbols import P
    >>> expr_terms("expr", [2 * P, 7])
    (2*P, 7)
    >>> expr_terms("expr", "2*P")
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: expr: must be a sympy expression or a sequence of them; text is not parsed (got '2*P')
    """
    items = [expr] if isinstance(expr, sympy.Basic | int) else expr
    if isinstance(expr, str) or not isinstance(items, list | tuple):
        raise InputError(
            field, "must be a sympy expression or a sequence of them; text is not parsed", got=expr
        )
    out = []
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool):
            out.append(sympy.Integer(item))
        elif isinstance(item, sympy.Expr):
            out.append(item)
        else:
            raise InputError(
                field,
                "must be a sympy expression or a sequence of them; text is not parsed",
                got=item,
            )
    return tuple(out)


def symbol_values(field: str, values: object) -> dict[sympy.Symbol, int]:
    """``values`` as ``{Symbol: int}``: keys are Symbols or symbol names, values whole numbers.

    >>> symbol_values("values", {"b": 4})
    {b: 4}
    >>> symbol_values("values", {"b": 0.5})
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: values: must map each symbol to a non-negative integer (got {'b': 0.5})
    """
    if not isinstance(values, Mapping):
        raise InputError(field, "must map symbols to non-negative integers", got=values)
    out: dict[sympy.Symbol, int] = {}
    for key, raw in values.items():
        value = int(raw) if isinstance(raw, sympy.Integer) else raw
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(
                field, "must map each symbol to a non-negative integer", got={str(key): value}
            )
        out[symbol_named(field, key)] = value
    return out


def gpu_terms(est: Estimate) -> tuple[sympy.Expr, ...]:
    """The per-GPU peak as terms to sum: ``est.gpu_expr()``, the largest phase, as one term
    (rounded up as a whole, exactly as ``est.gpu_bytes`` rounds it)."""
    return (est.gpu_expr(),)


def exact_bytes(terms: Iterable[sympy.Expr], values: Mapping[sympy.Symbol, int]) -> int:
    """Each term rounded up to a whole byte, then summed -- the rule of ``estimate``.

    >>> from vrammath.notation.symbols import P, N_d
    >>> exact_bytes([2 * P, 8 * P / N_d], {P: 10, N_d: 3})
    47
    """
    total = 0
    # every number put in at once: subs would re-evaluate a Max at each partial step
    numbers = {k: sympy.sympify(v) for k, v in values.items()}
    for term in expr_terms("terms", list(terms) if not isinstance(terms, str) else terms):
        value = sympy.ceiling(term.xreplace(numbers))
        if not value.is_Integer:
            missing = sorted(str(x) for x in value.free_symbols) or [str(value)]
            raise InputError("values", "must give a number for every symbol", got=missing)
        total += int(value)
    return total


def branches(expr: sympy.Expr) -> list[sympy.Expr]:
    """Max-free expressions whose largest is ``expr`` (a phase peak is a ``Max`` of sums).

    ``Max`` is distributed over sums and positive factors, so each branch is a plain sum that
    solvers and numpy evaluate directly; ``ceiling(max) == max(ceiling)`` keeps rounding exact.

    >>> from vrammath.notation.symbols import b, s
    >>> branches(sympy.Max(b, s) + 1)
    [b + 1, s + 1]
    """
    if not isinstance(expr, sympy.Expr):
        raise InputError("expr", "must be a sympy expression; text is not parsed", got=expr)
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
    "DEFAULT_GPUS_PER_NODE",
    "DEFAULT_RESERVE_BYTES",
    "Budget",
    "HostCheck",
    "Node",
    "active_branch",
    "branches",
    "budget",
    "default_node",
    "exact_bytes",
    "expr_terms",
    "gpu_terms",
    "host_check",
    "load_nodes",
    "node_preset",
    "setup_budget",
    "symbol_named",
    "symbol_values",
]
