"""Compile vrammath's term table to the handbook calculator's data (docs/_static/calculator-data.js).

Usage: ``python tools/calculator_build.py [OUT]`` (docs/conf.py runs it at build time).

Nothing of the memory logic is written in JavaScript. For each row of
:data:`vrammath.terms.TERMS` the generator finds which discrete choices of a Setup change the
row's per-rank expression (``vrammath.estimate._built``), enumerates those choices, and prints
each distinct expression to JavaScript with :class:`ExactJsPrinter`: calls on an exact rational
class (BigInt numerator / denominator) so the page rounds exactly as the library does. The phase
peaks are compiled the same way, from ``vrammath.estimate.estimate`` itself run with symbolic
group totals (W, O, G, A, T, F, R). Expressions stay symbolic in the model's sizes and the run's
numbers; the presets' sizes ship as data. The page composes: a row's value, its group (a column
of the table), the phases of the group totals, their maximum.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import sys
from importlib import import_module
from pathlib import Path
from typing import Any, cast
from unittest import mock

import sympy
from sympy.printing.jscode import JavascriptCodePrinter

from vrammath.errors import InputError
from vrammath.fields import options
from vrammath.lora import lora_targets
from vrammath.parallel import zero_stage
from vrammath.params import param_count, rank_param_count, size_values
from vrammath.peak import PHASES, Groups
from vrammath.presets import load_gpus, load_model, model_names
from vrammath.setup import Setup
from vrammath.symbols import N_d, b, m, p, r, s, t
from vrammath.terms import STATE_GROUPS, TERMS, TERMS_BY_KEY, Context, text
from vrammath.vocab import (
    ACTIVATION_MODELS,
    ATTENTIONS,
    DEVICES,
    IMPLEMENTATIONS,
    ITERATIONS,
    OPTIMIZERS,
    QUANTS,
    RECIPE_NAMES,
    RECOMPUTES,
    SCHEDULES,
)

# the module, not the function vrammath re-exports under the same name
est_mod = import_module("vrammath.estimate")
ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "_static" / "calculator-data.js"

#: What the page says where a row's expression depends on the LoRA rank's size.
RANK_REFUSAL = (
    "lora_rank: with this optimizer the adapters' states depend on the rank's size, "
    "which the calculator does not compile (use the CLI)"
)
#: LoRA target sets the calculator offers (others: the CLI).
TARGET_CHOICES = ("q,v", "q,k,v,o", "all-linear")
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
#: The run's numbers, by symbol (vrammath.estimate._values); P comes from the presets' data.
RUN_SYMBOLS = {
    N_d: "gpus",
    b: "micro_batch",
    s: "seq_len",
    t: "tp",
    p: "pp",
    m: "chunks",
    r: "lora_rank",
}

# A feature is a discrete fact of a setup the page reads generically: a field's value, or
# whether a number field is above 1 ("tp>1"), or whether an optional field is set ("lora").
FEATURES: dict[str, tuple[Any, ...]] = {
    "recipe": RECIPE_NAMES,
    "optimizer": OPTIMIZERS,
    "implementation": IMPLEMENTATIONS,
    "zero": (0, 1, 2, 3),
    "offload_optimizer": (False, True),
    "offload_params": (False, True),
    "sp": (False, True),
    "attention": ATTENTIONS,
    "recompute": RECOMPUTES,
    "activation_model": ACTIVATION_MODELS,
    "tp>1": (False, True),
    "pp>1": (False, True),
    "schedule": SCHEDULES,
    "lora": (False, True),
    "lora_targets": TARGET_CHOICES,
    "quant": (None, *QUANTS),
    "lora_dropout": (False, True),
    "iteration": ITERATIONS,
    "device": DEVICES,
}
DEFAULTS: dict[str, Any] = {
    "recipe": "bf16-mixed",
    "optimizer": "adamw",
    "implementation": "foreach",
    "zero": 0,
    "offload_optimizer": False,
    "offload_params": False,
    "sp": False,
    "attention": "sdpa",
    "recompute": "none",
    "activation_model": "auto",
    "tp>1": False,
    "pp>1": False,
    "schedule": "1f1b",
    "lora": False,
    "lora_targets": "q,v",
    "quant": None,
    "lora_dropout": False,
    "iteration": "steady",
    "device": "cuda",
}
# where a feature's relevance shows: the defaults, and these changes to them
PROBES: tuple[dict[str, Any], ...] = (
    {},
    {"lora": True},
    {"lora": True, "quant": "nf4"},
    {"lora": True, "recompute": "full"},
    {"zero": 3},
    {"zero": 2, "offload_optimizer": True},
    {"zero": 3, "offload_optimizer": True, "offload_params": True},
    {"tp>1": True},
    {"pp>1": True, "tp>1": True, "sp": True},
    {"recompute": "full"},
    {"attention": "eager"},
    {"device": "cpu"},
    {"recipe": "fp32"},
    {"recipe": "autocast-bf16", "recompute": "full"},
    {"implementation": "for-loop"},
    {"optimizer": "adam8bit"},
    {"optimizer": "adafactor", "implementation": "for-loop"},
    {"lora": True, "optimizer": "adam8bit", "lora_targets": "all-linear"},
    {"lora": True, "recipe": "fp32", "quant": "int8", "lora_dropout": True},
    {"pp>1": True, "implementation": "for-loop", "optimizer": "adafactor"},
    {"zero": 2, "offload_optimizer": True, "optimizer": "adafactor", "implementation": "for-loop"},
    {"zero": 3, "offload_optimizer": True, "optimizer": "adam8bit", "recipe": "fp32"},
)


def smallest_tp(spec: Any) -> int | None:
    """The smallest tensor-parallel size above 1 the model accepts (divides both head counts)."""
    return next(
        (t for t in range(2, spec.heads + 1) if spec.heads % t == 0 and spec.kv_heads % t == 0),
        None,
    )


REPAIRS: tuple[dict[str, Any], ...] = (
    {},
    {"lora": True},
    {"zero": 3},
    {"zero": 2},
    {"tp>1": True},
    {"pp>1": True},
    {"lora": False, "quant": None},
    {"recompute": "selective"},
    {"activation_model": "korthikanti"},
)


def _setup_kwargs(spec: Any, f: dict[str, Any]) -> dict[str, Any] | None:
    kw: dict[str, Any] = {
        k: f[k]
        for k in (
            "recipe",
            "optimizer",
            "implementation",
            "zero",
            "offload_optimizer",
            "offload_params",
            "sp",
            "attention",
            "recompute",
            "activation_model",
            "schedule",
            "quant",
            "lora_dropout",
            "iteration",
            "device",
        )
    }
    kw["gpus"] = 8
    if f["tp>1"]:
        tp = smallest_tp(spec)
        if tp is None:
            return None
        kw["tp"] = tp
    if f["pp>1"]:
        kw["pp"] = 2
    if f["schedule"] == "interleaved":
        kw["chunks"] = 2
    if f["lora"]:
        kw["lora_rank"] = 8
        kw["lora_targets"] = f["lora_targets"]
    elif f["lora_targets"] != DEFAULTS["lora_targets"]:
        kw["lora_targets"] = f["lora_targets"]
    return kw


def make_setup(
    spec: Any, feats: dict[str, Any], *, repair: bool = True, pairs: bool = False
) -> Setup | str:
    """A valid Setup with these feature values, the others at their defaults or, where the
    defaults refuse it, at a repaired choice; else the library's message for the first try."""
    first = ""
    # single repairs first, then pairs of them (sp needs tp > 1, offload needs a ZeRO stage)
    changes = list(REPAIRS)
    if pairs:
        changes += [{**x, **y} for x, y in itertools.combinations(REPAIRS[1:], 2)]
    for change in changes if repair else [{}]:
        f = {**DEFAULTS, **{k: v for k, v in change.items() if k not in feats}, **feats}
        kw = _setup_kwargs(spec, f)
        if kw is None:
            first = first or "tp: the model has no tensor-parallel size above 1"
            continue
        try:
            return Setup(spec, **kw)
        except InputError as err:
            first = first or str(err)
    return first


def phase_exprs(setup: Setup) -> dict[str, sympy.Expr]:
    """The phase peaks of ``setup`` in the group totals' symbols: the library's own estimate,
    its group sums replaced by symbols."""
    groups = Groups(*GROUP_SYMBOLS)
    with mock.patch.object(est_mod, "_groups", return_value=groups):
        return dict(est_mod.estimate(setup).phase_exprs)


def built_row(term: Any, ctx: Context) -> Any:
    """A row's per-rank expression and label (None: absent; ``("err", message)``: refused)."""
    try:
        expr = est_mod._built(term, ctx)
        return None if expr is None else (expr, text(term.label, ctx))
    except InputError as err:
        return ("err", str(err))


def built_phases(setup: Setup) -> Any:
    """The phase peaks in the group symbols, or ``("err", message)``."""
    try:
        exprs = phase_exprs(setup)
    except InputError as err:
        return ("err", str(err))
    return tuple(exprs[k] for k in PHASES)


def row_outputs(setup: Setup) -> dict[str, Any]:
    """Every row's output for ``setup`` (see :func:`built_row`), and the phases."""
    ctx = Context(setup)
    out: dict[str, Any] = {term.key: built_row(term, ctx) for term in TERMS}
    out["@phases"] = built_phases(setup)
    return out


def relevant_features(specs: list[Any]) -> dict[str, list[str]]:
    """Per row (and "@phases"), the features that change its output somewhere in the probes."""
    found: dict[str, set[str]] = {}
    for spec in specs:
        for probe in PROBES:
            base = make_setup(spec, probe, repair=False)
            if isinstance(base, str):
                continue
            ref = row_outputs(base)
            for name, values in FEATURES.items():
                for value in values:
                    if value == {**DEFAULTS, **probe}[name]:
                        continue
                    other = make_setup(spec, {**probe, name: value}, repair=False)
                    if isinstance(other, str):
                        continue
                    got = row_outputs(other)
                    for key, val in got.items():
                        if val != ref[key]:
                            found.setdefault(key, set()).add(name)
        # and every field a row's builder reads, on every probe (value changes alone miss
        # interactions: the quantized base's width matters only under an fp32 recipe)
        for probe in PROBES:
            base = make_setup(spec, probe, repair=False)
            if isinstance(base, str):
                continue
            for term in TERMS:
                reader = _Reader(base)
                with contextlib.suppress(InputError):
                    est_mod._built(term, Context(cast(Setup, reader)))
                for name in reader.read:
                    found.setdefault(term.key, set()).update(FEATURES_OF_FIELD.get(name, ()))
    order = list(FEATURES)
    keys = [t.key for t in TERMS] + ["@phases"]
    return {k: sorted(found.get(k, ()), key=order.index) for k in keys}


#: The features a Setup attribute stands for (numbers enter as symbols; their size as "> 1").
FEATURES_OF_FIELD: dict[str, tuple[str, ...]] = {
    **{name: (name,) for name in FEATURES},
    "tp": ("tp>1",),
    "pp": ("pp>1",),
    "lora_rank": ("lora",),
    "activation_formula": ("activation_model", "tp>1", "pp>1", "recompute"),
    "chunks": ("schedule",),
}


class _Reader:
    """A Setup that records which of its attributes a builder reads."""

    def __init__(self, setup: Setup) -> None:
        object.__setattr__(self, "_setup", setup)
        object.__setattr__(self, "read", set())

    def __getattr__(self, name: str) -> Any:
        self.read.add(name)
        return getattr(self._setup, name)


class ExactJsPrinter(JavascriptCodePrinter):
    """JavaScript on the page's exact rationals: ``Z.add``, ``Z.mul``, ``Z.pow``, ``Z.ceil``,
    ``Z.max``, ``Z.min``, ``Z.delta``; integers and rationals as ``Z.q("p","q")``; a symbol
    ``x`` as ``v["x"]``. Only arithmetic: the expression decides everything."""

    def _print_Symbol(self, expr: sympy.Symbol) -> str:
        return f"v[{json.dumps(expr.name)}]"

    def _print_Integer(self, expr: sympy.Integer) -> str:
        return f'Z.q("{int(expr)}")'

    def _print_Rational(self, expr: sympy.Rational) -> str:
        return f'Z.q("{expr.p}","{expr.q}")'

    def _print_Zero(self, expr: sympy.Expr) -> str:
        return 'Z.q("0")'

    def _print_One(self, expr: sympy.Expr) -> str:
        return 'Z.q("1")'

    def _print_NegativeOne(self, expr: sympy.Expr) -> str:
        return 'Z.q("-1")'

    def _print_Half(self, expr: sympy.Expr) -> str:
        return 'Z.q("1","2")'

    def _call(self, name: str, args: Any) -> str:
        return f"Z.{name}(" + ",".join(self._print(a) for a in args) + ")"

    def _print_Add(self, expr: sympy.Add, order: Any = None) -> str:
        return self._call("add", expr.args)

    def _print_Mul(self, expr: sympy.Mul) -> str:
        return self._call("mul", expr.args)

    def _print_Pow(self, expr: sympy.Pow) -> str:
        base, exp = expr.args
        if not exp.is_Integer:
            raise ValueError(f"not exact: {expr}")
        return f"Z.pow({self._print(base)},{int(exp)})"

    def _print_Max(self, expr: sympy.Expr) -> str:
        return self._call("max", expr.args)

    def _print_Min(self, expr: sympy.Expr) -> str:
        return self._call("min", expr.args)

    def _print_ceiling(self, expr: sympy.Expr) -> str:
        return self._call("ceil", expr.args)

    def _print_floor(self, expr: sympy.Expr) -> str:
        return self._call("floor", expr.args)

    def _print_KroneckerDelta(self, expr: sympy.Expr) -> str:
        return self._call("delta", expr.args)

    def _print_Piecewise(self, expr: sympy.Expr) -> str:
        pairs = ",".join(f"[{self._print(c)},{self._print(e)}]" for e, c in expr.args)
        return f"Z.pw({pairs})"

    def _print_BooleanTrue(self, expr: sympy.Expr) -> str:
        return "true"

    def _print_BooleanFalse(self, expr: sympy.Expr) -> str:
        return "false"

    def _print_Relational(self, expr: sympy.Expr) -> str:
        name = {">=": "ge", ">": "gt", "<=": "le", "<": "lt", "==": "eq", "!=": "ne"}[expr.rel_op]
        return self._call(name, expr.args)

    def emptyPrinter(self, expr: Any) -> str:
        raise ValueError(f"cannot compile {type(expr).__name__}: {expr}")


def js_function(expr: sympy.Expr) -> str:
    """``expr`` as a JavaScript arrow function of the values ``v``."""
    return "(v)=>" + ExactJsPrinter().doprint(sympy.sympify(expr))


class Pool:
    """Distinct strings, each stored once and referred to by index."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.index: dict[str, int] = {}

    def add(self, item: str) -> int:
        if item not in self.index:
            self.index[item] = len(self.items)
            self.items.append(item)
        return self.index[item]


def signatures(spec: Any) -> dict[str, str]:
    """Per row, its outputs over the probes: presets whose outputs agree share the row's
    compiled table (most rows are symbolic in the sizes; a few hold a model's own numbers)."""
    parts: dict[str, list[str]] = {}
    for probe in PROBES:
        setup = make_setup(spec, probe, repair=False)
        out = {} if isinstance(setup, str) else row_outputs(setup)
        for key in [term.key for term in TERMS] + ["@phases"]:
            parts.setdefault(key, []).append(sympy.srepr(out.get(key, "-")))
    return {key: "\n".join(v) for key, v in parts.items()}


def invalid_pairs(spec: Any) -> dict[str, str]:
    """The library's refusals of single feature values and of pairs of them (the others at
    their defaults, or repaired): ``"f=v"`` or ``"f=v&g=w"`` -> the message."""
    out: dict[str, str] = {}
    items = [(f, v) for f, values in FEATURES.items() for v in values]
    for f, v in items:
        got = make_setup(spec, {f: v}, pairs=True)
        if isinstance(got, str):
            out[f"{f}={json.dumps(v)}"] = got
    names = list(FEATURES)
    for (f, v), (g, w) in itertools.combinations(items, 2):
        if f == g or names.index(f) > names.index(g):
            continue
        one, two = f"{f}={json.dumps(v)}", f"{g}={json.dumps(w)}"
        if one in out or two in out:
            continue
        got = make_setup(spec, {f: v, g: w}, pairs=True)
        if isinstance(got, str):
            out[f"{one}&{two}"] = got
    return out


def _refusal(spec: Any, **kw: Any) -> str:
    try:
        Setup(spec, **kw)
    except InputError as err:
        return str(err)
    raise AssertionError(f"accepted {kw}")


def numeric_messages(spec: Any) -> dict[str, Any]:
    """The library's messages for numbers checked against the model, ``{got}`` for the value."""
    big_tp, big_pp, big_chunks = spec.heads + 1, spec.layers + 1, spec.layers
    return {
        "tpBig": _refusal(spec, tp=big_tp).replace(f"(got {big_tp})", "(got {got})"),
        "ppBig": _refusal(spec, pp=big_pp).replace(f"(got {big_pp})", "(got {got})"),
        "chunksOne": _refusal(spec, pp=2, schedule="interleaved", chunks=1),
        "chunksBig": _refusal(spec, pp=2, schedule="interleaved", chunks=big_chunks).replace(
            f"(got {big_chunks})", "(got {got})"
        ),
        "chunksUnused": _refusal(spec, chunks=2).replace("(got 2)", "(got {got})"),
    }


#: The pure functions the builders of vrammath.terms call, memoized while the generator
#: enumerates thousands of setups that share them (the model by identity: one object per preset).
MEMOIZED = (
    "activation_exprs",
    "korthikanti_first_stage_bytes",
    "lora_activation_layer_expr",
    "lora_state_exprs",
    "lora_step_temp_expr",
    "layer_param_expr",
    "dequant_buffer_expr",
    "frozen_base_exprs",
    "model_state_exprs",
    "optimizer_step_temp_expr",
)


def _memo(fn: Any) -> Any:
    cache: dict[Any, Any] = {}

    def call(*args: Any, **kw: Any) -> Any:
        key = (tuple(a if isinstance(a, str | int | tuple | None) else id(a) for a in args),
               tuple(sorted(kw.items())))  # fmt: skip
        if key not in cache:
            cache[key] = fn(*args, **kw)
        return cache[key]

    return call


_JS: dict[sympy.Expr, str] = {}
_TEX: dict[sympy.Expr, str] = {}


def _js(expr: sympy.Expr) -> str:
    if expr not in _JS:
        _JS[expr] = js_function(expr)
    return _JS[expr]


def _tex(expr: sympy.Expr) -> str:
    if expr not in _TEX:
        _TEX[expr] = sympy.latex(expr)
    return _TEX[expr]


def build() -> dict[str, Any]:
    """The calculator's data: features, rows, compiled variants per model class, presets."""
    terms_mod = import_module("vrammath.terms")
    with contextlib.ExitStack() as stack:
        for name in MEMOIZED:
            fn = getattr(terms_mod, name)
            stack.enter_context(mock.patch.object(terms_mod, name, _memo(fn)))
        return _build()


def _build() -> dict[str, Any]:
    names = model_names()
    specs = {name: load_model(name) for name in names}
    # per row, a class of presets whose compiled tables agree
    row_class: dict[str, dict[str, str]] = {}
    first_of: dict[tuple[str, str], str] = {}
    for name, spec in specs.items():
        for key, sig in signatures(spec).items():
            row_class.setdefault(key, {})[name] = first_of.setdefault((key, sig), name)
    structure = row_class["activations"]  # the model's shape: its activations
    reps = sorted(set(structure.values()))
    relevant = relevant_features([specs[r] for r in reps])
    funcs, labels, texs, messages, entries = Pool(), Pool(), Pool(), Pool(), Pool()

    def refused(message: str) -> int:
        return -1 - messages.add(message)

    def variant(*parts: int) -> int:
        return 1 + entries.add(json.dumps(parts))

    # one dense table per row: the feature values' product in itertools order (the first
    # feature most significant); 0 = the row is absent, k > 0 = entries[k - 1], k < 0 = the
    # library's refusal messages[-k - 1]
    variants: dict[str, dict[str, list[int]]] = {}
    for key, feats in relevant.items():
        per_rep: dict[str, list[int]] = {}
        for rep in sorted(set(row_class[key].values())):
            spec = specs[rep]
            table: list[int] = []
            for combo in itertools.product(*(FEATURES[f] for f in feats)):
                setup = make_setup(spec, dict(zip(feats, combo, strict=True)))
                if isinstance(setup, str):
                    table.append(refused(setup))
                    continue
                if key == "@phases":
                    got = built_phases(setup)
                    if got[0] == "err":
                        table.append(refused(got[1]))
                    else:
                        table.append(variant(*(funcs.add(_js(e)) for e in got)))
                    continue
                got = built_row(TERMS_BY_KEY[key], Context(setup))
                if setup.lora_rank is not None and got is not None and got[0] != "err":
                    # an expression that holds the rank's size (8-bit states keep a small
                    # adapter in fp32) is not one expression in r: refuse, never a wrong number
                    small = built_row(
                        TERMS_BY_KEY[key], Context(dataclasses.replace(setup, lora_rank=1))
                    )
                    if small != got:
                        table.append(refused(RANK_REFUSAL))
                        continue
                if got is None:
                    table.append(0)
                elif got[0] == "err":
                    table.append(refused(got[1]))
                else:
                    table.append(
                        variant(funcs.add(_js(got[0])), labels.add(got[1]), texs.add(_tex(got[0])))
                    )
            per_rep[rep] = table
        variants[key] = per_rep
    invalid = {rep: invalid_pairs(specs[rep]) for rep in reps}
    presets = {}
    for name, spec in specs.items():
        values = {str(k): v for k, v in size_values(spec).items()}
        values["P"] = param_count(spec)
        tps, tp_err = [], {}
        for tp in range(1, spec.heads + 1):
            try:
                Setup(spec, tp=tp)
                tps.append(tp)
            except InputError as err:
                tp_err[tp] = str(err)
        # P on the fullest tensor/pipeline rank (vrammath.estimate._values), per tp the values
        # for pp = 1, 2, ... run-length encoded as [value, repeats, ...]
        rank_p: dict[int, list[int]] = {}
        for tp in tps:
            runs: list[int] = []
            for pp in range(1, spec.layers + 1):
                value = param_count(spec) if tp == pp == 1 else rank_param_count(spec, tp, pp)
                if runs and runs[-2] == value:
                    runs[-1] += 1
                else:
                    runs += [value, 1]
            rank_p[tp] = runs
        presets[name] = {
            "cls": structure[name],
            "values": values,
            "params": param_count(spec),
            "rankP": rank_p,
            "tps": tps,
            "tpErr": tp_err,
            "layers": spec.layers,
            "msg": numeric_messages(spec),
            "model_type": spec.model_type,
        }
    fields = []
    for opt in options(Setup):
        fields.append(
            {
                "name": opt.name,
                "flag": opt.flag,
                "help": opt.help,
                "choices": list(opt.choices),
                "low": opt.low,
                "high": opt.high,
                "kind": opt.kind,
            }
        )
    defaults = {f.name: f.default for f in dataclasses.fields(Setup) if f.name != "model"}
    defaults["lora_targets"] = list(defaults["lora_targets"])
    try:
        zero_stage("@@")
    except InputError as err:
        zero_msg = str(err)
    return {
        "defaults": defaults,
        "zeroMsg": zero_msg,
        "targetSets": {",".join(lora_targets(t)): t for t in TARGET_CHOICES},
        "runSymbols": {str(sym): name for sym, name in RUN_SYMBOLS.items()},
        "groupSums": [
            [str(sym), group, backward]
            for sym, (group, backward) in zip(GROUP_SYMBOLS, GROUP_SUMS, strict=True)
        ],
        "invalid": invalid,
        "features": {k: list(v) for k, v in FEATURES.items()},
        "targets": list(TARGET_CHOICES),
        "rows": [
            {
                "key": t.key,
                "device": t.device,
                "group": t.group,
                "live": t.live,
                "listed": t.listed,
                "relevant": relevant[t.key],
            }
            for t in TERMS
        ],
        "phaseFeatures": relevant["@phases"],
        "phases": list(PHASES),
        "groups": [str(sym) for sym in GROUP_SYMBOLS],
        "stateGroups": list(STATE_GROUPS),
        "variants": variants,
        "rowClass": row_class,
        "labels": labels.items,
        "messages": messages.items,
        "entries": [json.loads(e) for e in entries.items],
        "tex": texs.items,
        "presets": presets,
        "gpus": {g.name: g.bytes for g in load_gpus().values()},
        "fields": fields,
        "funcs": funcs.items,
    }


def write(out: Path = OUT) -> int:
    """Write the data script; returns its size in bytes."""
    data = build()
    funcs = data.pop("funcs")
    body = (
        "window.VRAMMATH_DATA=" + json.dumps(data, separators=(",", ":")) + ";\n"
        "window.VRAMMATH_DATA.funcs=(function(Z){return[\n" + ",\n".join(funcs) + "];});\n"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(body)
    return len(body.encode())


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    print(f"{target}: {write(target)} bytes")
