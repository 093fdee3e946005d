"""How the CLI reads each declared field: argparse types that refuse bad input in one line naming
the field and what is allowed (never a traceback), and one option per field of a record.

Examples
========

>>> from vrammath.compose.setup import Setup
>>> parser = Parser(prog="vrammath")
>>> add_options(parser, Setup)
>>> parser.parse_args(["--zero", "FULL_SHARD", "--batch", "4"]).zero
3
>>> integer(next(o for o in options(Setup) if o.name == "gpus"))("0")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: gpus: must be an integer from 1 to 1048576 (got '0')
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from vrammath.compose.table import TERMS
from vrammath.notation.errors import InputError
from vrammath.notation.fields import Option, options
from vrammath.notation.vocab import KV_DTYPE_ALIASES
from vrammath.terms.lora.targets import lora_targets
from vrammath.terms.parallel import zero_stage

#: other spellings a field's value is accepted in (an engine's own), by field
VALUE_ALIASES: dict[str, Mapping[str, str]] = {"kv_dtype": KV_DTYPE_ALIASES}


def printable(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"vrammath: error: {printable(message)}\n")


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _label(opt: Option) -> str:
    return (opt.flag or opt.name).removeprefix("--")


_ASCII_INT = re.compile(r"[+-]?[0-9]+")
_ASCII_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def _plain_float(text: str) -> float:
    """``text`` in plain ASCII decimal notation as a float, else NaN (which every bound
    refuses): float() also takes "١.٥", "1_0", "inf" and "nan"."""
    plain = len(text) <= 40 and _ASCII_NUMBER.fullmatch(text.strip()) is not None
    return float(text) if plain else float("nan")


def integer(opt: Option) -> Callable[[str], int]:
    label = _label(opt)
    allowed = f"must be an integer from {opt.low} to {opt.high}"

    def parse(text: str) -> int:
        digits = text.strip()
        # a length check first: int() of a 5,000-digit string raises, and nothing needs one
        # ASCII digits only: str.isdigit() also takes "٤", "１" and "²" (int() then fails on "²")
        if not 0 < len(digits) <= 24 or not _ASCII_INT.fullmatch(digits):
            raise argparse.ArgumentTypeError(f"{label}: {allowed} (got {_shown(text)})")
        value = int(digits)
        if (opt.low is not None and value < opt.low) or (opt.high is not None and value > opt.high):
            raise argparse.ArgumentTypeError(f"{label}: {allowed} (got {_shown(text)})")
        return value

    return parse


def choice(
    field: str, allowed: Sequence[str], aliases: Mapping[str, str] | None = None
) -> Callable[[str], str]:
    def parse(text: str) -> str:
        text = (aliases or {}).get(text, text)
        if text not in allowed:
            raise argparse.ArgumentTypeError(
                f"{field}: must be one of {', '.join(allowed)} (got {_shown(text)})"
            )
        return text

    return parse


def zero(text: str) -> int:
    try:
        return zero_stage(text)
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def targets(text: str) -> tuple[str, ...]:
    try:
        return lora_targets(text)
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


#: the opt-in rows of the default table, what ``--with`` may name
OPT_IN = tuple(t.key for t in TERMS if t.opt_in)


def row_keys(text: str) -> tuple[str, ...]:
    """Comma-separated row keys; ``estimate`` checks them against its table."""
    return tuple(k.strip() for k in text.split(",") if k.strip())


def number(field: str, low: float, high: float, *, open_low: bool, open_high: bool) -> Any:
    lo, hi = ("(" if open_low else "["), (")" if open_high else "]")
    allowed = f"must be a number in {lo}{low:g}, {high:g}{hi}"

    def parse(text: str) -> float:
        value = _plain_float(text)
        above = value > low if open_low else value >= low
        below = value < high if open_high else value <= high
        if not (above and below):  # NaN fails both
            raise argparse.ArgumentTypeError(f"{field}: {allowed} (got {_shown(text)})")
        return value

    return parse


def _ratio(field: str) -> Any:
    """A finite number; its bounds are the field's own check (an InputError, exit 2)."""

    def parse(text: str) -> float:
        value = _plain_float(text)
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{field}: must be a number (got {_shown(text)})")
        return value

    return parse


def add_options(cmd: argparse.ArgumentParser, cls: Any) -> None:
    """One argparse option per declared field of ``cls`` that has a CLI flag."""
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    for opt in options(cls):
        if opt.flag is None:
            continue
        names = [opt.flag] + ([opt.short] if opt.short else [])
        kw: dict[str, Any] = {"dest": opt.name, "default": defaults[opt.name], "help": opt.help}
        if opt.kind == "switch":
            cmd.add_argument(*names, action="store_true", **kw)
            continue
        kw["metavar"] = _label(opt).upper().replace("-", "_")
        if opt.kind == "zero":
            kw["type"] = zero
        elif opt.kind == "targets":
            kw["type"] = targets
            kw["default"] = None  # given or not: only with --lora-rank
        elif opt.kind == "terms":
            kw["type"] = row_keys
            kw["help"] = f"{opt.help} ({', '.join(OPT_IN) or 'none in the default table'})"
        elif opt.kind == "ratio":
            kw["type"] = _ratio(_label(opt))
        elif opt.kind == "fraction":
            kw["type"] = number(_label(opt), 0, 1, open_low=True, open_high=False)
        elif opt.choices:
            kw["type"] = choice(_label(opt), opt.choices, VALUE_ALIASES.get(opt.name))
        elif opt.low is not None:
            kw["type"] = integer(opt)
        cmd.add_argument(*names, **kw)
