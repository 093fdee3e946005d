"""What the handbook's pages run in the browser (Pyodide, in a Web Worker): the CLI itself.

The calculator page holds no memory logic. It turns its form (or a setup dict, from a script)
into the command line with :func:`argv_for`, runs ``vrammath.cli.main`` on it with
:func:`run`, and shows what the CLI printed: every byte on the page is the byte
``vrammath ... --json`` prints, refusals and warnings included, by construction. The page's form
is built from :func:`page_data`, the fields the CLI itself declares (:mod:`vrammath.notation.fields`).

>>> argv_for("estimate", {"model": "llama-7b", "zero": 3, "gpus": 8, "micro_batch": 1})
['estimate', 'llama-7b', '--zero', '3', '--gpus', '8']
>>> component_tex(argv_for("estimate", {"model": "llama-7b"}))["optimizer"]
'8 P'
>>> out = call("estimate", {"model": "llama-7b", "zero": 7})
>>> out["rc"], out["error"]
(2, "vrammath: error: argument --zero: zero: must be 0, 1, 2, 3 or NO_SHARD, SHARD_GRAD_OP, FULL_SHARD (got '7')")
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import io
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sympy

from vrammath.cli import build_parser, main, training_setup
from vrammath.compose.estimate import estimate
from vrammath.compose.setup import Setup
from vrammath.model.presets import load_gpus, model_names
from vrammath.notation.errors import InputError
from vrammath.notation.fields import Option, options
from vrammath.serve.estimate import Serve
from vrammath.serve.hf import Hf
from vrammath.serve.sglang import Sglang
from vrammath.serve.vllm import Vllm

COMMANDS = ("estimate", "fit", "serve", "hf", "vllm", "sglang")
#: the command line's head for each calculator tab that runs a command under an engine's rule
ENGINE_TABS = {
    "hf": ("serve", "--engine", "hf"),
    "vllm": ("serve", "--engine", "vllm"),
    "sglang": ("serve", "--engine", "sglang"),
}
#: the engine's own flags, and the fields of ``serve`` it does not read (typed, they are
#: refused; the engine's flags say it)
ENGINE_FLAGS: dict[str, tuple[type, tuple[str, ...]]] = {
    "hf": (Hf, ("gpu_util", "block", "kv_dtype", "tp")),  # one GPU, the cache in the weights' dtype
    "vllm": (Vllm, ("context", "batch", "gpu_util")),
    "sglang": (Sglang, ("context", "batch", "gpu_util")),
}
#: what ``fit`` reads beside a training setup (its flags and defaults are the parser's)
FIT_EXTRAS = ("headroom", "reserve_gib")


@functools.cache
def _fit_extras() -> dict[str, tuple[str, float, str]]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    actions = sub.choices["fit"]._actions
    return {
        a.dest: (a.option_strings[0], a.default, a.help or "")
        for a in actions
        if a.dest in FIT_EXTRAS
    }


def run(argv: Sequence[str]) -> dict[str, Any]:
    """Run the CLI on ``argv`` here; its exit status and what it wrote to stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return {"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()}


def _options(command: str) -> tuple[tuple[Option, ...], dict[str, Any]]:
    if command in ENGINE_TABS:
        engine, unread = ENGINE_FLAGS[command]
        opts = [o for o in options(Serve) if o.flag is not None and o.name not in unread]
        opts += [o for o in options(engine) if o.flag is not None]
        fields = [*dataclasses.fields(Serve), *dataclasses.fields(engine)]
        defaults = {f.name: f.default for f in fields if f.name != "model"}
        return tuple(opts), defaults
    cls = Serve if command == "serve" else Setup
    defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.name != "model"}
    return tuple(o for o in options(cls) if o.flag is not None), defaults


def _command(command: str) -> str:
    if command not in COMMANDS:
        raise InputError("command", f"must be one of {', '.join(COMMANDS)}", command)
    return command


def argv_for(command: str, setup: Mapping[str, Any]) -> list[str]:
    """The command line of ``setup``: the model, then the flag of every field that is not its
    default (the CLI fills the rest). ``setup`` holds the ``setup`` object of the command's
    ``--json`` output (any subset) plus ``model``; for ``serve``, ``block: None`` is
    ``--no-paging``. A key the command does not read is refused by name."""
    opts, defaults = _options(_command(command))
    by_name = {o.name: o for o in opts}
    if "model" not in setup:
        raise InputError("model", "is missing (a preset name)", None)
    head = ENGINE_TABS.get(command, (command,))
    argv = [head[0], str(setup["model"]), *head[1:]]
    for key, given in setup.items():
        value = tuple(given) if isinstance(given, list) else given
        if key == "model":
            continue
        if command == "fit" and key in FIT_EXTRAS:
            flag, default, _ = _fit_extras()[key]
            if value != default:
                argv += [flag, str(value)]
            continue
        opt = by_name.get(key)
        if opt is None or opt.flag is None:
            if key in defaults and value == defaults[key]:
                continue  # a field the CLI has no flag for, at the value the CLI uses
            allowed = ["model", *by_name, *(FIT_EXTRAS if command == "fit" else ())]
            raise InputError(
                key, f"is not a flag of {command} (its fields: {', '.join(allowed)})", value
            )
        default = defaults[key]
        if value == default and type(value) is type(default):
            continue
        if opt.kind == "switch":
            if value is not True and value is not False:
                raise InputError(key, "must be true or false", value)
            argv += [opt.flag] if value else []
        elif value is None:
            if command in ("serve", *ENGINE_TABS) and key == "block":
                argv.append("--no-paging")
            elif not opt.optional:
                raise InputError(key, "must not be null", value)
        elif isinstance(value, tuple):
            argv += [opt.flag, ",".join(str(v) for v in value)]
        else:
            argv += [opt.flag, str(value)]
    return argv


def call(command: str, setup: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`run` the ``--json`` command line of ``setup``: ``argv`` (what to type), ``rc``,
    ``json`` (the parsed output, or None), ``stderr`` and ``error`` (the CLI's error line, or
    None). A setup that has no command line (a key the command does not read) gets the CLI's
    form of error and exit status 2."""
    try:
        argv = argv_for(command, setup)
    except InputError as exc:
        line = f"vrammath: error: {exc}"
        return {
            "argv": [],
            "rc": 2,
            "json": None,
            "stdout": "",
            "stderr": line + "\n",
            "error": line,
        }
    got = run([*argv, "--json"])
    errors = [ln for ln in got["stderr"].splitlines() if ln.startswith("vrammath: error:")]
    return {
        "argv": argv,
        "rc": got["rc"],
        "json": json.loads(got["stdout"]) if got["rc"] == 0 else None,
        "stdout": got["stdout"],
        "stderr": got["stderr"],
        "error": errors[0] if errors else None,
    }


def component_tex(argv: Sequence[str]) -> dict[str, str]:
    """Each component's expression in LaTeX, by key, for an ``estimate`` command line (as
    :func:`argv_for` writes it; the page's MathJax renders it, the CLI prints the same
    expressions as text). Empty for a command line the CLI refuses."""
    if list(argv[:1]) != ["estimate"]:
        return {}
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # run() shows the CLI's refusal
            args = build_parser().parse_args(list(argv))  # the CLI's own reading of it
    except SystemExit:
        return {}
    try:
        est = estimate(training_setup(args))
    except InputError:
        return {}
    return {c.key: sympy.latex(c.expr) for c in est.components if c.expr is not None}


RPC_OPS: dict[str, Callable[..., Any]] = {"call": call, "tex": component_tex, "run": run}
"""The functions the page's Web Worker may ask for, by name (:func:`call`, :func:`component_tex`
and :func:`run`)."""


def rpc(op: str, text: str) -> str:
    """The Web Worker's one entry: ``op`` (a key of :data:`RPC_OPS`) applied to the JSON
    argument list ``text``, its answer as JSON (strings cross the JavaScript boundary unchanged).

    >>> json.loads(rpc("run", '[["estimate", "llama-7b", "--json"]]'))["rc"]
    0
    """
    if op not in RPC_OPS:
        raise InputError("op", f"must be one of {', '.join(RPC_OPS)}", got=op)
    args = json.loads(text)
    return json.dumps(RPC_OPS[op](*args))


def _field(opt: Option, default: Any) -> dict[str, Any]:
    return {
        "name": opt.name,
        "flag": opt.flag,
        "help": opt.help,
        "kind": opt.kind,
        "choices": list(opt.choices),
        "low": opt.low,
        "high": opt.high,
        "optional": opt.optional,
        "default": list(default) if isinstance(default, tuple) else default,
    }


def page_data() -> dict[str, Any]:
    """What the calculator's form is built from, as JSON: per command its fields (flag, help,
    kind, choices, bounds, default), the model presets, the GPU presets, and the command line's
    head of each engine tab (:data:`ENGINE_TABS`: the model goes after its first word)."""
    forms = {}
    for command in COMMANDS:
        opts, defaults = _options(command)
        fields = [_field(o, defaults[o.name]) for o in opts]
        if command == "fit":
            fields += [
                {
                    "name": k,
                    "flag": flag,
                    "help": text,
                    "kind": "fraction" if k == "headroom" else "value",
                    "choices": [],
                    "low": None,
                    "high": None,
                    "optional": False,
                    "default": d,
                }
                for k, (flag, d, text) in _fit_extras().items()
            ]
        forms[command] = fields
    gpus = [
        {"name": g.name, "key": key, "bytes": g.bytes, "label": g.label}
        for key, g in load_gpus().items()
    ]
    heads = {tab: list(head) for tab, head in ENGINE_TABS.items()}
    return {"forms": forms, "models": list(model_names()), "gpus": gpus, "heads": heads}


__all__ = [
    "COMMANDS",
    "ENGINE_TABS",
    "RPC_OPS",
    "argv_for",
    "call",
    "component_tex",
    "page_data",
    "rpc",
    "run",
]
