"""The ``vrammath`` command: estimate, serve, fit, formula, models, gpus.

Every subcommand prints text, or with ``--json`` the same content as JSON. Warnings go to stderr
(and into the JSON's ``warnings``). Bad input prints one line naming the field and what is
allowed, and exits with status 2; a failure to write the output (a full disk, a closed pipe other
than an early reader) prints one line and exits with status 1.

The training and serving options are generated from the field metadata of
:class:`~vrammath.compose.setup.Setup` and :class:`~vrammath.serve.estimate.Serve`, so each is declared once.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib.util
import json
import math
import os
import sys
import tomllib
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sympy

from vrammath.answers.budget import DEFAULT_RESERVE_BYTES, budget
from vrammath.answers.fit import fit
from vrammath.answers.formulas import FORMULA_OPTIONS, FORMULAS, formula_exprs, with_sizes
from vrammath.answers.report import estimate_dict, estimate_table
from vrammath.compose.accelerate_config import (
    accelerate_deepspeed_file,
    accelerate_fields,
    simple_yaml,
)
from vrammath.compose.engine_config import deepspeed_fields
from vrammath.compose.estimate import estimate
from vrammath.compose.setup import Setup, setup_warnings
from vrammath.compose.torchtitan_config import torchtitan_fields
from vrammath.flags import Parser, add_options, choice, integer, number, printable, targets, zero
from vrammath.model.params import param_count
from vrammath.model.presets import (
    GPU,
    _read_limited,
    load_gpus,
    load_model,
    model_names,
    parse_config_text,
    raw_config,
    resolve_model,
)
from vrammath.notation.errors import ContextWarning, InputError, one_of
from vrammath.notation.fields import Option, options
from vrammath.notation.units import fmt_bytes, fmt_gb, fmt_gib
from vrammath.notation.vocab import (
    ATTENTIONS,
    HF_RECOMPUTES,
    IMPLEMENTATIONS,
    OPTIMIZERS,
    QUANTS,
    RECIPE_NAMES,
)
from vrammath.serve_command import add_serve_parser, cmd_serve
from vrammath.terms.lora.adapters import lora_param_count
from vrammath.terms.lora.linears import default_targets_refusal

#: the model whose structure shapes a formula when ``--model`` is not given (sizes stay symbols)
FORMULA_MODEL = "llama-7b"

Result = tuple[str, dict[str, Any]]


MODEL_HELP = (
    "preset name (see `vrammath models`), path to a config.json, or a Hugging Face Hub id "
    "(owner/name; needs the 'hub' extra)"
)


def _add_engine_config(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "--deepspeed",
        metavar="DS_CONFIG_JSON",
        help="a DeepSpeed config file: its ZeRO stage, bucket, precision, micro-batch and "
        'optimizer set --engine deepspeed\'s fields ("auto" as the Hugging Face Trainer fills '
        "it); a key that changes memory and is not modelled is refused by name",
    )
    cmd.add_argument(
        "--accelerate",
        metavar="CONFIG_YAML",
        help="an accelerate config file (YAML as `accelerate config` writes it, or JSON): "
        "distributed_type, num_processes, mixed_precision and its FSDP or DeepSpeed section set "
        "the engine's fields; a key that changes memory and is not modelled is refused by name",
    )
    cmd.add_argument(
        "--torchtitan",
        metavar="JOB_TOML",
        help="a torchtitan job file (TOML, as torchtitan read it before its Python configs): "
        "its batch, sequence, mixed precision, shard degree, resharding, offload, "
        "checkpointing and optimizer set --engine fsdp2's fields; the model is MODEL",
    )


def _add_json(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--json", action="store_true", help="machine-readable output (same content)")


def _add_formula_parser(sub: argparse._SubParsersAction[Parser]) -> None:
    form = sub.add_parser("formula", help="print a symbolic expression of any memory term")
    form.add_argument("term", type=choice("term", FORMULAS), help=", ".join(FORMULAS))
    form.add_argument(
        "--model",
        default=None,
        help=f"substitute this model's sizes (b, s, N_d, t, p, r stay symbols); without it the "
        f"structure is {FORMULA_MODEL}'s and every size is a symbol",
    )
    # defaults None: a flag the term does not read is refused (FORMULA_OPTIONS), so the CLI
    # must know which were typed; the library's defaults fill the rest
    form.add_argument("--stage", type=zero, help="ZeRO stage (zero, communication, phases)")
    form.add_argument("--recipe", type=choice("recipe", RECIPE_NAMES))
    form.add_argument("--optimizer", type=choice("optimizer", OPTIMIZERS))
    form.add_argument("--impl", type=choice("impl", IMPLEMENTATIONS), dest="implementation")
    form.add_argument("--attention", type=choice("attention", ATTENTIONS))
    form.add_argument("--lora-targets", type=targets, dest="lora_targets")
    form.add_argument("--quant", type=choice("quant", QUANTS))
    form.add_argument("--latex", action="store_true", help="LaTeX instead of plain text")
    _add_json(form)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for the docs and tests)."""
    parser = Parser(prog="vrammath", description="GPU memory of LLM training, derived.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    est = sub.add_parser("estimate", help="breakdown of per-GPU memory for a training setup")
    est.add_argument("model", help=MODEL_HELP)
    add_options(est, Setup)
    _add_engine_config(est)
    _add_json(est)

    add_serve_parser(sub, MODEL_HELP)

    fit_cmd = sub.add_parser(
        "fit", help="largest batch, longest sequence, fewest GPUs and cheapest ZeRO stage"
    )
    fit_cmd.add_argument("model", help=MODEL_HELP)
    add_options(fit_cmd, Setup)
    _add_engine_config(fit_cmd)
    fit_cmd.add_argument(
        "--headroom",
        type=number("headroom", 0, 1, open_low=False, open_high=True),
        default=0.0,
        help="fraction of the GPU kept free (default 0)",
    )
    fit_cmd.add_argument(
        "--reserve-gib",
        dest="reserve_gib",
        type=number("reserve-gib", 0, 2**20, open_low=False, open_high=True),
        default=DEFAULT_RESERVE_BYTES / 2**30,
        help="GiB reserved for the CUDA context, workspaces and NCCL (default 1)",
    )
    _add_json(fit_cmd)

    _add_formula_parser(sub)
    _add_json(sub.add_parser("models", help="list model presets"))
    _add_json(sub.add_parser("gpus", help="list GPU presets"))
    _add_derive_parser(sub)
    return parser


# --- derive (the measure extra): the exact polynomial of any config transformers can build ------


def _add_derive_parser(sub: argparse._SubParsersAction[Parser]) -> None:
    der = sub.add_parser(
        "derive",
        help="exact memory polynomial in b and s of any transformers config, from fake training "
        "steps (needs the 'measure' extra)",
    )
    der.add_argument("config", help="path to a config.json, or a preset name")
    batch = Option("batch", "--batch", "micro-batch size b (default 1)", low=1, high=2**20)
    seq = Option("seq", "--seq", "sequence length s (default 512)", low=1, high=2**24)
    der.add_argument("--batch", type=integer(batch), default=1, help=batch.help)
    der.add_argument("--seq", type=integer(seq), default=512, help=seq.help)
    der.add_argument("--precision", type=choice("precision", ("bf16", "fp32")), default="bf16")
    der.add_argument("--attention", type=choice("attention", ATTENTIONS), default="sdpa")
    der.add_argument("--recompute", type=choice("recompute", HF_RECOMPUTES), default="none")
    _add_json(der)


def _cmd_derive(args: argparse.Namespace) -> Result:
    if any(importlib.util.find_spec(m) is None for m in ("torch", "transformers")):
        raise InputError("derive", "needs torch and transformers: pip install 'vrammath[measure]'")
    # the measure extra (torch, transformers) loads only when derive runs
    from vrammath.measure.derive import derive, report_lines

    if args.config in model_names():
        cfg = raw_config(args.config)
    else:
        path = Path(args.config)
        cfg = parse_config_text(_read_limited(path, "config"), path.name)
    found = derive(
        cfg,
        precision=args.precision,
        attention=args.attention,
        recompute=args.recompute,
        batch=args.batch,
        seq=args.seq,
    )
    return "\n".join(report_lines(found, args.batch, args.seq)), found.as_dict(args.batch, args.seq)


# --- the commands: each returns its text and the same content as a JSON-ready dict -------------


def training_setup(args: argparse.Namespace) -> Setup:
    """The training setup that parsed ``estimate``/``fit`` flags describe (the model resolved)."""
    return training_config(args)[0]


def training_config(args: argparse.Namespace) -> tuple[Setup, list[str]]:
    """:func:`training_setup`, with the fields of an engine config file (``--deepspeed``)
    applied and its warnings; a flag given another value than the file's is refused."""
    given = {o.name: getattr(args, o.name) for o in options(Setup) if o.flag is not None}
    if given["lora_targets"] is None:
        del given["lora_targets"]
    elif args.lora_rank is None:
        raise InputError("lora-targets", "needs --lora-rank", got=",".join(given["lora_targets"]))
    spec = resolve_model(args.model)
    ds_path, accel_path = getattr(args, "deepspeed", None), getattr(args, "accelerate", None)
    titan_path = getattr(args, "torchtitan", None)
    paths = [p for p in (ds_path, accel_path, titan_path) if p is not None]
    if len(paths) > 1:
        raise InputError(
            "config",
            "--deepspeed, --accelerate and --torchtitan each name an engine's file: give one",
        )
    if not paths:
        return Setup(spec, **given), []
    file = Path(paths[0])
    if titan_path is not None:
        fields, said = torchtitan_fields(_toml_file(file), spec)
    elif ds_path is not None:
        fields, said = deepspeed_fields(_config_file(file, "deepspeed", yaml=False), spec)
    else:
        config = _config_file(file, "accelerate", yaml=True)
        named = accelerate_deepspeed_file(config)
        ds_file = None
        if named is not None:  # as accelerate opens it; else beside the accelerate file
            found = Path(named) if Path(named).is_file() else file.parent / named
            ds_file = _config_file(found, "deepspeed_config.deepspeed_config_file", yaml=False)
        fields, said = accelerate_fields(config, spec, ds_file)
    defaults = {f.name: f.default for f in dataclasses.fields(Setup)}
    for name, value in fields.items():  # stage3 has no flag: the config alone sets it
        if given.get(name, defaults[name]) not in (defaults[name], value):
            raise InputError(
                name, f"is {value} in {file.name}; the flag says otherwise", got=given[name]
            )
        given[name] = value
    return Setup(spec, **given), [f"{file.name}: {line}" for line in said]


def _toml_file(file: Path) -> dict[str, Any]:
    """A torchtitan job file parsed (TOML)."""
    text = _read_limited(file, "torchtitan")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError("torchtitan", f"{file.name} is not TOML ({exc})", got=str(file)) from None


def _config_file(file: Path, field: str, *, yaml: bool) -> dict[str, Any]:
    """An engine's config file parsed: JSON, or (``yaml``) accelerate's YAML."""
    text = _read_limited(file, field)
    if yaml and not text.lstrip().startswith("{"):
        return simple_yaml(text)
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        why = f"{file.name} is not JSON ({exc.msg}, line {exc.lineno})"
        raise InputError(field, why, got=str(file)) from None
    if not isinstance(config, dict):
        raise InputError(field, "must be a JSON object", got=type(config).__name__)
    return config


def _cmd_estimate(args: argparse.Namespace) -> Result:
    setup, said = training_config(args)
    est = estimate(setup)
    data: dict[str, Any] = estimate_dict(est)
    data["warnings"] = said + list(setup_warnings(setup))
    engine = "" if setup.engine == "hf" else f" ({setup.engine})"
    head = (
        f"{setup.model.name}: {param_count(setup.model):,} parameters; {setup.recipe}, "
        f"{setup.optimizer} ({setup.implementation}), ZeRO-{setup.zero}{engine} over {setup.gpus} GPU(s), "
        f"micro-batch {setup.micro_batch} x {setup.seq_len} tokens"
    )
    moe = data.get("moe")
    if moe is not None:
        head += (
            f"\nmixture of experts: {moe['total_params']:,} parameters in all, "
            f"{moe['active_params']:,} active per token; experts over --ep {setup.ep} "
            f"(expert-data-parallel group of {setup.gpus // setup.ep}), dense parts over "
            f"{setup.gpus} data-parallel rank(s)"
        )
    if setup.lora_rank is None:
        data["trainable_params"] = param_count(setup.model)
    else:
        n = lora_param_count(setup.model, setup.lora_rank, setup.lora_targets)
        data["trainable_params"] = n
        data["frozen_base"] = setup.quant or "recipe dtype"
        head += (
            f"\nLoRA rank {setup.lora_rank} on {','.join(setup.lora_targets)}: {n:,} trainable "
            f"parameters; frozen base {setup.quant or 'in the recipe dtype'}"
        )
    return head + "\n" + estimate_table(est), data


def _cmd_fit(args: argparse.Namespace) -> Result:
    if args.gpu is None:
        raise one_of("gpu", None, list(load_gpus()))
    setup, said = training_config(args)
    reserve = round(args.reserve_gib * 2**30)
    capacity = load_gpus()[args.gpu].bytes if args.gpu in load_gpus() else None
    if capacity is not None and math.floor(capacity * (1 - args.headroom)) <= reserve:
        # the flags' names, not Budget's fields: the user typed these
        raise InputError(
            "headroom/reserve-gib",
            f"leave nothing of {args.gpu}'s {fmt_bytes(capacity)}",
            got=(args.headroom, args.reserve_gib),
        )
    bud = budget(args.gpu, headroom=args.headroom, reserve_bytes=reserve)
    answer = fit(setup, bud)
    data: dict[str, Any] = answer.as_dict()
    data["warnings"] = said + list(setup_warnings(setup))
    return "\n".join(answer.lines()), data


_FORMULA_FLAGS = {
    "recipe": "--recipe",
    "optimizer": "--optimizer",
    "implementation": "--impl",
    "stage": "--stage",
    "attention": "--attention",
    "lora_targets": "--lora-targets",
    "quant": "--quant",
}


def _cmd_formula(args: argparse.Namespace) -> Result:
    spec = resolve_model(args.model) if args.model is not None else load_model(FORMULA_MODEL)
    typed = {name: getattr(args, name) for name in _FORMULA_FLAGS}
    typed = {name: value for name, value in typed.items() if value is not None}
    for name, value in typed.items():
        if name not in FORMULA_OPTIONS[args.term]:
            reads = ", ".join(_FORMULA_FLAGS[n] for n in FORMULA_OPTIONS[args.term]) or "none"
            raise InputError(
                _FORMULA_FLAGS[name].removeprefix("--"),
                f"is not read by formula {args.term} (its options: {reads})",
                got=",".join(value) if isinstance(value, tuple) else value,
            )
    try:
        exprs = formula_exprs(args.term, spec, **typed)
    except InputError as err:
        if args.lora_targets is None and err.field == "lora_targets":
            raise default_targets_refusal(spec) from err  # not a value the user typed
        raise
    if args.model is not None:
        exprs = {k: with_sizes(v, spec) for k, v in exprs.items()}
    render = sympy.latex if args.latex else str
    data = {
        "term": args.term,
        "model": spec.name,
        "sizes_substituted": args.model is not None,
        "format": "latex" if args.latex else "text",
        "exprs": [{"name": k, "expr": render(v)} for k, v in exprs.items()],
        "warnings": list(getattr(spec, "warnings", ())) if args.model is not None else [],
    }
    return "\n".join(f"{e['name']}: {e['expr']}" for e in data["exprs"]), data


def _cmd_models() -> Result:
    lines, rows = [], []
    for name in model_names():
        spec = load_model(name)
        n = param_count(spec)
        lines.append(
            f"{name:14} {spec.model_type:8} {n:>17,} params  h={spec.hidden} "
            f"L={spec.layers} heads={spec.heads}/{spec.kv_heads} vocab={spec.vocab}"
        )
        rows.append(
            {
                "name": name,
                "model_type": spec.model_type,
                "params": n,
                "hidden": spec.hidden,
                "layers": spec.layers,
                "heads": spec.heads,
                "kv_heads": spec.kv_heads,
                "vocab": spec.vocab,
            }
        )
    return "\n".join(lines), {"models": rows}


def _cmd_gpus() -> Result:
    gpus = load_gpus().values()

    def usable(g: GPU) -> str:
        return f"torch sees {fmt_gib(g.usable_bytes)}" if g.usable_bytes else "usable: unmeasured"

    text = "\n".join(
        f"{g.name:16} {fmt_gb(g.bytes):>10} / {fmt_gib(g.bytes):>11}  {usable(g):22}  {g.label}"
        for g in gpus
    )
    rows = [
        {"name": g.name, "bytes": g.bytes, "usable_bytes": g.usable_bytes or None, "label": g.label,
         "source": g.source, "usable_source": g.usable_source or None}
        for g in gpus
    ]  # fmt: skip
    return text, {"gpus": rows}


def _run(args: argparse.Namespace) -> Result:
    if args.command == "estimate":
        return _cmd_estimate(args)
    if args.command == "serve":
        return cmd_serve(args)
    if args.command == "fit":
        return _cmd_fit(args)
    if args.command == "formula":
        return _cmd_formula(args)
    if args.command == "models":
        return _cmd_models()
    if args.command == "derive":
        return _cmd_derive(args)
    return _cmd_gpus()


def _say(line: str) -> None:
    with contextlib.suppress(OSError):  # stderr itself is gone: nothing left to tell
        print(printable(line), file=sys.stderr, flush=True)


@functools.cache
def _parser() -> argparse.ArgumentParser:
    # one parser per process: the browser's page runs main() at every change of its form
    return build_parser()


def _answered(args: argparse.Namespace) -> Result:
    """:func:`_run`, with every :class:`ContextWarning` the library gave (an answer past the
    model's positions, as a longest sequence) added to the answer's ``warnings`` once, in the
    CLI's words (without the model's name, which the answer states); other warnings pass on."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text, data = _run(args)
    said = list(data.get("warnings", []))
    for w in caught:
        if issubclass(w.category, ContextWarning):
            line = str(w.message).split(": ", 1)[-1]
            if line not in said:
                said.append(line)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if said:
        data["warnings"] = said
    return text, data


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 2 bad input, 1 the output could not be
    written)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed its one line (or the help)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        text, data = _answered(args)
    except InputError as exc:
        _say(f"vrammath: error: {exc}")
        return 2
    for warning in data.get("warnings", []):
        _say(f"vrammath: warning: {warning}")
    out = json.dumps(data, indent=2, sort_keys=True) if args.json else text
    try:
        print(out, flush=True)
    except BrokenPipeError:  # the reader left early (``| head``): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError as exc:  # e.g. ``> /dev/full``
        _say(f"vrammath: error: cannot write the output ({exc.strerror or type(exc).__name__})")
        return 1
    return 0


__all__ = ["FORMULAS", "build_parser", "main", "training_setup"]
