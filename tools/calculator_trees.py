"""The calculator generator's decision trees (tools/calculator_build.py): which setup fields a
row's builder reads, one branch per value of each, and the phase peaks in the group totals'
symbols.

A tree is grown by building the output for the defaults, recording which Setup attributes the
builder read (:class:`_Reader`) and branching on the features they stand for, one at a time: the
builders are pure functions of what they read, so the output depends on nothing else.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable
from importlib import import_module
from typing import Any, cast
from unittest import mock

import sympy
from calculator_setups import FEATURES, FEATURES_OF_FIELD, PROBES, make_setup

from vrammath.errors import InputError
from vrammath.peak import PHASES, Groups
from vrammath.setup import Setup
from vrammath.term_context import Context, text
from vrammath.terms import TERMS

# the module, not the function vrammath re-exports under the same name
est_mod = import_module("vrammath.estimate")
#: The group totals' symbols, one per field of vrammath.peak.Groups, in its order.
GROUP_SYMBOLS = sympy.symbols(
    " ".join(f"G_{f.name}" for f in dataclasses.fields(Groups)), real=True
)

#: What each group symbol sums (vrammath.estimate._groups): the GPU rows of a group, all but
#: those live only in backward; R is the in-flight rows live only in backward.
GROUP_SUMS = tuple(
    ("in-flight", True) if f.name == "reduce" else (f.name.replace("_", "-"), False)
    for f in dataclasses.fields(Groups)
)


def phase_exprs(
    setup: Setup,
    on_groups: Callable[[], None] | None = None,
    zeros: frozenset[sympy.Symbol] = frozenset(),
) -> dict[str, Any]:
    """The phase peaks of ``setup`` in the group totals' symbols: the library's own estimate,
    its group sums replaced by symbols (those in ``zeros`` by 0; ``on_groups`` is called when
    the rows are summed)."""

    def groups(built: Any) -> Groups:
        if on_groups is not None:
            on_groups()
        return Groups(*(sympy.S.Zero if g in zeros else g for g in GROUP_SYMBOLS))

    # the rows only feed the group totals, which are symbols here: build none of them, and
    # evaluate none (the values feed only the rows' numbers)
    with (
        mock.patch.object(est_mod, "_groups", side_effect=groups),
        mock.patch.object(est_mod, "_built", return_value=sympy.S.Zero),
        mock.patch.object(est_mod, "_values", return_value={}),
    ):
        return dict(est_mod.estimate(setup).phase_exprs)


def _same(one: sympy.Expr, two: sympy.Expr, zero: sympy.Symbol) -> bool:
    """Whether ``one`` with ``zero`` put to 0 agrees with ``two`` at two points (every other
    symbol a different integer). Numbers go in at once: a symbolic Max re-simplified with one
    symbol put to 0 costs seconds on a mixture-of-experts model's phases."""
    names = sorted((one.free_symbols | two.free_symbols) - {zero}, key=str)
    for base in (1009, 7919):
        point = {x: sympy.Integer(base + 37 * i) for i, x in enumerate(names)}
        if one.xreplace({**point, zero: sympy.S.Zero}) != two.xreplace(point):
            return False
    return True


def split_group(
    setup: Setup, exprs: dict[str, Any], zeros: frozenset[Any], nonzero: frozenset[Any]
) -> int | None:
    """The first group whose 0 the phase model treats apart (not as its symbol put to 0)."""
    for i, sym in enumerate(GROUP_SYMBOLS):
        if sym in zeros or sym in nonzero:
            continue
        empty = phase_exprs(setup, zeros=zeros | {sym})
        if not all(_same(exprs[k], empty[k], sym) for k in PHASES):
            return i
    return None


def built_row(term: Any, ctx: Context) -> Any:
    """A row's per-rank expression and label (None: absent; ``("err", message)``: refused)."""
    try:
        expr = est_mod._built(term, ctx)
        return None if expr is None else (expr, text(term.label, ctx))
    except InputError as err:
        return ("err", str(err))


def built_phases(setup: Setup, on_groups: Callable[[], None] | None = None) -> Any:
    """The phase peaks in the group symbols, or ``("err", message)``."""
    try:
        exprs = phase_exprs(setup, on_groups)
    except InputError as err:
        return ("err", str(err))
    return tuple(exprs[k] for k in PHASES)


def row_outputs(setup: Setup) -> dict[str, Any]:
    """Every row's output for ``setup`` (see :func:`built_row`), and the phases."""
    ctx = Context(setup)
    out: dict[str, Any] = {term.key: built_row(term, ctx) for term in TERMS}
    out["@phases"] = built_phases(setup)
    return out


def row_read(term: Any, setup: Setup) -> tuple[Any, set[str]]:
    """:func:`built_row` of ``term`` for ``setup``, and the Setup attributes it read."""
    reader = _Reader(setup)
    got = built_row(term, Context(cast(Setup, reader)))
    return got, reader.read


def phases_read(setup: Setup) -> tuple[Any, set[str]]:
    """:func:`built_phases` for ``setup``, and what estimate read: in its checks of what it
    composes (``check_modelled``: a refusal may hang on any field) and once the rows were
    summed into the groups (the rows' own reads are the rows' trees')."""
    reader = _Reader(setup)
    checked: set[str] = set()
    check = est_mod.check_modelled

    def checking(s: Any) -> None:
        try:
            check(s)
        finally:
            checked.update(reader.read)

    with mock.patch.object(est_mod, "check_modelled", side_effect=checking):
        got = built_phases(cast(Setup, reader), reader.read.clear)
    return got, reader.read | checked


def grow(
    spec: Any,
    read: Callable[[Setup], tuple[Any, set[str]]],
    encode: Callable[[Any, Setup], int],
    refused: Callable[[str], int],
) -> Any:
    """The decision tree of one output over the features: build it for the defaults, see which
    features it read, and branch on each of those, one at a time (the output depends on nothing
    else: the builders are pure functions of what they read). A node is ``[feature index,
    [subtree per value]]``, a leaf ``encode``'s code; a node whose subtrees agree is their leaf.
    """
    names = list(FEATURES)
    fields = [f.name for f in dataclasses.fields(Setup) if f.name != "model"]
    seen_setups: dict[tuple[Any, ...], tuple[Any, set[str]]] = {}

    def node(assign: dict[str, Any]) -> Any:
        # pairs of repairs too: GPT-2 under autocast with offload needs a ZeRO stage and tp > 1
        setup = make_setup(spec, assign, pairs=True)
        if isinstance(setup, str):
            return refused(setup)
        # a branch on the value a feature already had builds the same setup again
        key = tuple(getattr(setup, name) for name in fields)
        if key not in seen_setups:
            seen_setups[key] = read(setup)
        got, attrs = seen_setups[key]
        seen = {f for a in attrs for f in FEATURES_OF_FIELD.get(a, ())}
        free = [f for f in names if f in seen and f not in assign]
        if not free:
            return encode(got, setup)
        f = free[0]
        kids = [node({**assign, f: v}) for v in FEATURES[f]]
        if all(json.dumps(k) == json.dumps(kids[0]) for k in kids):
            return kids[0]
        return [names.index(f), kids]

    return node({})


class _Reader:
    """A Setup that records which of its attributes a builder reads."""

    def __init__(self, setup: Setup) -> None:
        object.__setattr__(self, "_setup", setup)
        object.__setattr__(self, "read", set())

    def __getattr__(self, name: str) -> Any:
        self.read.add(name)
        return getattr(self._setup, name)


def signatures(spec: Any) -> dict[str, str]:
    """Per row, its outputs over the probes: presets whose outputs agree share the row's
    compiled table (most rows are symbolic in the sizes; a few hold a model's own numbers)."""
    parts: dict[str, list[str]] = {}
    for probe in PROBES:
        # repaired as the trees repair (a model refusing a probe as written, e.g. q,v on a fused
        # projection, still shows its expressions)
        setup = make_setup(spec, probe, pairs=True)
        outs = [{} if isinstance(setup, str) else row_outputs(setup)]
        if not isinstance(setup, str) and setup.lora_rank is not None:
            # and at rank 1: 8-bit states keep adapters under 4096 elements in fp32, a
            # threshold the rank crosses at a size that depends on the model
            outs.append(row_outputs(dataclasses.replace(setup, lora_rank=1)))
        for out in outs:
            for key in [term.key for term in TERMS] + ["@phases"]:
                parts.setdefault(key, []).append(sympy.srepr(out.get(key, "-")))
    return {key: "\n".join(v) for key, v in parts.items()}


#: Leaves of a class's tree checked against each other member of the class (see :func:`agrees`).
CHECKED_LEAVES = 30


def agrees(
    spec: Any,
    tree: Any,
    read: Callable[[Setup], tuple[Any, set[str]]],
    encode: Callable[[Any, Setup], int],
    refused: Callable[[str], int],
    key: str,
) -> bool:
    """Whether ``spec``'s own outputs are ``tree``'s leaves (grown for another preset of its
    class) at :data:`CHECKED_LEAVES` leaves drawn at random (seeded by the row and the preset)."""
    names = list(FEATURES)
    paths: list[tuple[dict[str, Any], Any]] = []

    def walk(node: Any, assign: dict[str, Any]) -> None:
        if not isinstance(node, list):
            paths.append((assign, node))
            return
        f = names[node[0]]
        for value, kid in zip(FEATURES[f], node[1], strict=True):
            walk(kid, {**assign, f: value})

    walk(tree, {})
    rng = random.Random(f"{key}/{spec.name}")
    for assign, leaf in rng.sample(paths, min(CHECKED_LEAVES, len(paths))):
        setup = make_setup(spec, assign, pairs=True)
        code = refused(setup) if isinstance(setup, str) else encode(read(setup)[0], setup)
        if code != leaf:
            return False
    return True
