"""Compile vrammath's term table to the handbook calculator's data (docs/_static/calculator-data.js).

Usage: ``python tools/calculator_build.py [OUT]`` (docs/conf.py runs it at build time).
The trees themselves are grown in tools/calculator_trees.py.

Nothing of the memory logic is written in JavaScript. For each row of
:data:`vrammath.terms.TERMS` the generator finds which discrete choices of a Setup change the
row's per-rank expression (``vrammath.estimate._built``), enumerates those choices, and prints
each distinct expression to JavaScript with :func:`calculator_printer.exact_js`: calls on an exact rational
class (BigInt numerator / denominator) so the page rounds exactly as the library does. The phase
peaks are compiled the same way, from ``vrammath.estimate.estimate`` itself run with symbolic
group totals (W, O, G, A, T, F, R). Expressions stay symbolic in the model's sizes and the run's
numbers; the presets' sizes ship as data. The page composes: a row's value, its group (a column
of the table), the phases of the group totals, their maximum.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import gzip
import json
import sys
import time
from importlib import import_module
from pathlib import Path
from typing import Any
from unittest import mock

import sympy
from calculator_printer import Pool, funcs_script, js_function
from calculator_serve import serve_data, tp_messages
from calculator_setups import (
    FEATURES,
    FEATURES_OF_FIELD,
    TARGET_CHOICES,
    invalid_pairs,
    model_neutral,
    numeric_messages,
    setup_tp,
)
from calculator_trees import (
    GROUP_SUMS,
    GROUP_SYMBOLS,
    agrees,
    built_row,
    est_mod,
    grow,
    phase_exprs,
    phases_read,
    row_read,
    signatures,
    split_group,
)

from vrammath.budget import budget
from vrammath.errors import InputError
from vrammath.fields import field_values, options
from vrammath.lora import lora_targets
from vrammath.parallel import zero_stage
from vrammath.params import param_count
from vrammath.peak import PHASES
from vrammath.presets import load_gpus, load_model, model_names
from vrammath.setup import Setup
from vrammath.symbols import N_d, P, b, m, n_ep, p, r, s, t
from vrammath.term_context import STATE_GROUPS, Context
from vrammath.terms import TERMS, TERMS_BY_KEY

DIM0_SHARD_PARAMS = est_mod.dim0_shard_params
#: What the rows hold for FSDP2's dim-0 shard's parameter count on the fullest rank (a preset's
#: vrammath.term_context.dim0_shard_params, compiled per preset, gives its value).
P_DIM0 = sympy.Symbol("P_dim0", positive=True, integer=True)
ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "_static" / "calculator-data.js"

#: What the page says where a row's expression depends on the LoRA rank's size.
RANK_REFUSAL = (
    "lora_rank: with this optimizer the adapters' states depend on the rank's size, "
    "which the calculator does not compile (use the CLI)"
)
#: Setup fields the calculator keeps at their defaults: only the Korthikanti-style
#: mixture-of-experts layouts read them, and the page refuses those (calculator_setups).
UNCOMPILED = ("capacity_factor", "imbalance", "activation_policy")
#: The run's numbers, by symbol (vrammath.estimate._values); P comes from the presets' data.
RUN_SYMBOLS = {
    N_d: "gpus",
    b: "micro_batch",
    s: "seq_len",
    t: "tp",
    p: "pp",
    m: "chunks",
    r: "lora_rank",
    n_ep: "ep",
}


def _host(gpu_name: str) -> dict[str, Any]:
    """The host side vrammath.budget.budget gives a GPU preset (its node, if one holds it)."""
    bud = budget(gpu_name)
    return {"node": bud.node, "host_bytes": bud.host_bytes, "gpus_per_node": bud.gpus_per_node}


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


_STARTED = time.monotonic()


def _progress(what: str) -> None:
    print(f"calculator_build: {what} at {time.monotonic() - _STARTED:.0f} s", file=sys.stderr)


def build() -> dict[str, Any]:
    """The calculator's data: features, rows, compiled variants per model class, presets."""
    with contextlib.ExitStack() as stack:
        # FSDP2's dim-0 shard enters the rows as one symbol; each preset ships its expression
        stack.enter_context(mock.patch.object(est_mod, "dim0_shard_params", return_value=P_DIM0))
        # estimate() runs here for its phase expressions only: its numbers are the page's job
        stack.enter_context(mock.patch.object(est_mod, "_value", return_value=0))
        for mod in (import_module("vrammath.terms"), import_module("vrammath.term_context")):
            for name in MEMOIZED:
                if hasattr(mod, name):
                    stack.enter_context(mock.patch.object(mod, name, _memo(getattr(mod, name))))
        return _build()


def _build() -> dict[str, Any]:
    # a Setup field the page neither branches on, nor puts in as a number, nor refuses would be
    # a silently ignored input
    known = {*FEATURES_OF_FIELD, *RUN_SYMBOLS.values(), *UNCOMPILED, "model", "gpu"}
    unknown = [f.name for f in dataclasses.fields(Setup) if f.name not in known]
    if unknown:
        raise SystemExit(f"calculator_build: Setup fields not compiled: {', '.join(unknown)}")
    names = model_names()
    specs = {name: load_model(name) for name in names}
    # per row, a class of presets whose compiled tables agree
    row_class: dict[str, dict[str, str]] = {}
    first_of: dict[tuple[str, str], str] = {}
    for name, spec in specs.items():
        for key, sig in signatures(spec).items():
            row_class.setdefault(key, {})[name] = first_of.setdefault((key, sig), name)
    _progress("row classes")
    structure = row_class["activations"]  # the model's shape: its activations
    reps = sorted(set(structure.values()))
    funcs, labels, texs, messages, entries = Pool(), Pool(), Pool(), Pool(), Pool()

    def refused(message: str) -> int:
        return -1 - messages.add(message)

    def variant(*parts: int) -> int:
        return 1 + entries.add(json.dumps(parts))

    def encode_row(term: Any, got: Any, setup: Setup) -> int:
        if setup.lora_rank is not None and got is not None and got[0] != "err":
            # an expression that holds the rank's size (8-bit states keep a small adapter in
            # fp32) is not one expression in r: refuse, never a wrong number
            small = built_row(term, Context(dataclasses.replace(setup, lora_rank=1)))
            if small != got:
                return refused(RANK_REFUSAL)
        if got is None:
            return 0
        if got[0] == "err":
            return refused(model_neutral(got[1], setup.model))
        return variant(funcs.add(_js(got[0])), labels.add(got[1]), texs.add(_tex(got[0])))

    def encode_phases(got: Any, setup: Setup) -> int:
        if got[0] == "err":
            return refused(model_neutral(got[1], setup.model))
        return phase_code(setup, frozenset(), frozenset())

    split_on: dict[Any, int | None] = {}

    def phase_code(setup: Setup, zeros: frozenset[Any], nonzero: frozenset[Any]) -> int:
        # a phase model may treat an empty group apart (vrammath.peak: a loop that keeps no
        # output adds nothing): where putting 0 in for a group's symbol is not the phases with
        # the group 0, the entry splits on it, ["z", group index, code if 0, code if not].
        # Which group a preset's phase model treats so is found once per preset.
        exprs = phase_exprs(setup, zeros=zeros)
        key = (setup.model.name, zeros, nonzero)
        if key not in split_on:
            split_on[key] = split_group(setup, exprs, zeros, nonzero)
        i = split_on[key]
        if i is None:
            return variant(*(funcs.add(_js(exprs[k])) for k in PHASES))
        sym = GROUP_SYMBOLS[i]
        return variant_of(
            "z",
            i,
            phase_code(setup, zeros | {sym}, nonzero),
            phase_code(setup, zeros, nonzero | {sym}),
        )

    def variant_of(*parts: Any) -> int:
        return 1 + entries.add(json.dumps(parts))

    # per row and class of presets, a decision tree over the features the row reads (see
    # grow): a leaf 0 = the row is absent, k > 0 = entries[k - 1], k < 0 = the library's
    # refusal messages[-k - 1]
    variants: dict[str, dict[str, Any]] = {}
    for key in [term.key for term in TERMS] + ["@phases"]:
        if key == "@phases":
            read, encode = phases_read, encode_phases
        else:
            term = TERMS_BY_KEY[key]
            read = functools.partial(row_read, term)
            encode = functools.partial(encode_row, term)
        per_rep = {
            rep: grow(specs[rep], read, encode, refused)
            for rep in sorted(set(row_class[key].values()))
        }
        # the classes come from a few probes: a member whose own outputs differ from its
        # class's tree at sampled leaves gets a tree of its own (never a wrong number)
        split = []
        for name, rep in sorted(row_class[key].items()):
            if name != rep and not agrees(specs[name], per_rep[rep], read, encode, refused, key):
                row_class[key][name] = name
                per_rep[name] = grow(specs[name], read, encode, refused)
                split.append(f"{name} from {rep}")
        variants[key] = per_rep
        _progress(f"tree {key}: {len(per_rep)} classes; split off by the leaf check: {split}")
    # the trees as a graph: each distinct subtree once, in nodes, referred to as [index]
    nodes = Pool()

    def shared(tree: Any) -> Any:
        if not isinstance(tree, list):
            return tree
        node = [tree[0], [shared(kid) for kid in tree[1]]]
        return [nodes.add(json.dumps(node, separators=(",", ":")))]

    variants = {key: {rep: shared(t) for rep, t in per.items()} for key, per in variants.items()}
    # the library's refusals of feature pairs, each message by its index in messages
    invalid = {
        rep: {pair: messages.add(msg) for pair, msg in invalid_pairs(specs[rep]).items()}
        for rep in reps
    }
    _progress("refused pairs")
    presets = {}
    for name, spec in specs.items():
        # the model's numbers as vrammath.estimate._values gives them (the run's are the form's)
        values = {
            str(k): v
            for k, v in est_mod._values(Context(Setup(spec))).items()
            if k not in RUN_SYMBOLS
        }
        tp_data = tp_messages(functools.partial(setup_tp, spec), spec.heads)
        tps = [x for x in range(1, spec.heads + 1) if x not in tp_data["refused"]]
        # P on the fullest tensor/pipeline rank (vrammath.estimate._values), per tp the values
        # for pp = 1, 2, ... run-length encoded as [value, repeats, ...]
        rank_p: dict[int, list[int]] = {}
        # (a mixture-of-experts model's other layouts are refused: calculator_setups)
        moe = spec.experts is not None or spec.latent is not None
        for tp in [1] if moe else tps:
            runs: list[int] = []
            for pp in range(1, 2 if moe else spec.layers + 1):
                value = est_mod._values(Context(Setup(spec, tp=tp, pp=pp)))[P]
                if runs and runs[-2] == value:
                    runs[-1] += 1
                else:
                    runs += [value, 1]
            rank_p[tp] = runs
        presets[name] = {
            "dim0": funcs.add(_js(DIM0_SHARD_PARAMS(spec))),
            "cls": structure[name],
            "values": values,
            "params": param_count(spec),
            "rankP": rank_p,
            "tp": tp_data,
            "heads": spec.heads,
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
    defaults = field_values(Setup(specs[names[0]]))
    try:
        zero_stage("@@")
    except InputError as err:
        zero_msg = str(err)
    return {
        "defaults": defaults,
        "zeroMsg": zero_msg,
        "targetSets": {",".join(lora_targets(t)): t for t in TARGET_CHOICES},
        "targetLists": {t: ",".join(lora_targets(t)) for t in TARGET_CHOICES},
        "hosts": {name: _host(name) for name in load_gpus()},
        "serve": serve_data(funcs, texs),
        "runSymbols": {str(sym): name for sym, name in RUN_SYMBOLS.items()},
        "dim0Symbol": str(P_DIM0),
        "groupSums": [
            [str(sym), group, backward]
            for sym, (group, backward) in zip(GROUP_SYMBOLS, GROUP_SUMS, strict=True)
        ],
        "invalid": invalid,
        "uncompiled": list(UNCOMPILED),
        "features": {k: list(v) for k, v in FEATURES.items()},
        "targets": list(TARGET_CHOICES),
        "rows": [
            {
                "key": t.key,
                "device": t.device,
                "group": t.group,
                "live": t.live,
                "listed": t.listed,
            }
            for t in TERMS
        ],
        "phases": list(PHASES),
        "groups": [str(sym) for sym in GROUP_SYMBOLS],
        "stateGroups": list(STATE_GROUPS),
        "variants": variants,
        "nodes": [json.loads(n) for n in nodes.items],
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


def data_script(data: dict[str, Any]) -> str:
    """The data as a script: ``window.VRAMMATH_DATA = ...`` and its compiled functions."""
    data = dict(data)
    funcs = data.pop("funcs")
    return (
        "window.VRAMMATH_DATA=" + json.dumps(data, separators=(",", ":")) + ";\n"
        "window.VRAMMATH_DATA.funcs=" + funcs_script(funcs) + ";\n"
    )


def write(out: Path = OUT) -> int:
    """Write the data script, gzip-compressed in base64 (``window.VRAMMATH_PACKED``; the page
    unpacks it with the browser's DecompressionStream); returns its size in bytes."""
    packed = gzip.compress(data_script(build()).encode(), compresslevel=9, mtime=0)
    body = f'window.VRAMMATH_PACKED="{base64.b64encode(packed).decode()}";\n'
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(body)
    return len(body.encode())


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    print(f"{target}: {write(target)} bytes")
