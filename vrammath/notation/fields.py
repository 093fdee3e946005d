"""Field metadata: each field of :class:`~vrammath.compose.setup.Setup` and
:class:`~vrammath.serve.estimate.Serve` is declared once, with its CLI flag, help, allowed values and
bounds; argparse, ``as_dict`` and validation read them from here.

Examples
========

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Run:
...     batch: int = declared(1, "--batch", "sequences (default {default})", low=1, high=2**24)
...     kernel: str = declared("sdpa", "--kernel", "attention kernel", choices=("sdpa", "eager"))
>>> [(o.name, o.flag, o.high, o.help) for o in options(Run)]
[('batch', '--batch', 16777216, 'sequences (default 1)'), ('kernel', '--kernel', None, 'attention kernel: sdpa, eager (default sdpa)')]
>>> check_bounds(Run(batch=2**30))
Traceback (most recent call last):
...
vrammath.notation.errors.InputError: batch: must be an integer from 1 to 16777216 (got 1073741824)
>>> check_bounds(Run(batch=None))
Traceback (most recent call last):
...
vrammath.notation.errors.InputError: batch: must be an integer from 1 to 16777216 (got None)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from vrammath.notation.errors import InputError

#: the largest micro-batch, sequence, context or batch accepted (16,777,216)
MAX_TOKENS = 2**24
#: the largest GPU count, parallel degree, rank or block accepted (1,048,576)
MAX_COUNT = 2**20


@dataclass(frozen=True)
class Option:
    """How one field is shown and read: its CLI flag (None: not on the CLI), help text, allowed
    values, integer bounds, and how the CLI parses it (``value``, ``switch``, ``zero``,
    ``targets``, ``fraction``)."""

    name: str
    flag: str | None
    help: str
    choices: tuple[str, ...] = ()
    low: int | None = None
    high: int | None = None
    kind: str = "value"
    short: str | None = None
    optional: bool = False  # None is a value of the field (its type says ``| None``)

    def check_int(self, value: object) -> None:
        """Refuse a non-integer or one outside ``[low, high]``, naming both bounds; ``None``
        only where the field's type admits it."""
        if self.low is None and self.high is None:
            return
        if value is None and self.optional:
            return
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or (self.low is not None and value < self.low)
            or (self.high is not None and value > self.high)
        ):
            raise InputError(self.name, f"must be an integer from {self.low} to {self.high}", value)


def declared(
    default: Any,
    flag: str | None,
    help: str,
    *,
    choices: tuple[str, ...] = (),
    low: int | None = None,
    high: int | None = None,
    kind: str = "value",
    short: str | None = None,
) -> Any:
    """A declared field, its default written once: ``{default}`` in ``help`` shows it, and a
    field with ``choices`` lists them after the help with the default (unless the help already
    says what the default means)."""
    shown = ",".join(default) if isinstance(default, tuple) else str(default)
    shown = "none" if default is None else shown
    if choices and "(default" not in help:
        help = f"{help}: {', '.join(choices)} (default {shown})"
    help = help.replace("{default}", shown)
    meta = {"flag": flag, "help": help, "choices": choices, "low": low, "high": high}
    return dataclasses.field(
        default=default, metadata={"option": {**meta, "kind": kind, "short": short}}
    )


_OPTIONS: dict[type, tuple[Option, ...]] = {}


def options(cls: Any) -> tuple[Option, ...]:
    """The :class:`Option` of every declared field of a dataclass, in field order (read once
    per class: every Setup checks its bounds with them)."""
    if cls not in _OPTIONS:
        out = []
        for f in dataclasses.fields(cls):
            meta = f.metadata.get("option")
            if meta is not None:
                optional = "None" in str(f.type).replace(" ", "").split("|")
                out.append(Option(name=f.name, **meta, optional=optional))
        _OPTIONS[cls] = tuple(out)
    return _OPTIONS[cls]


def check_bounds(record: Any) -> None:
    """Check every integer field of ``record`` against its declared bounds."""
    for opt in options(type(record)):
        opt.check_int(getattr(record, opt.name))


def field_values(record: Any) -> dict[str, object]:
    """The declared fields of ``record`` as JSON-ready values (tuples become lists)."""
    out: dict[str, object] = {}
    for opt in options(type(record)):
        value = getattr(record, opt.name)
        out[opt.name] = list(value) if isinstance(value, tuple) else value
    return out


__all__ = [
    "MAX_COUNT",
    "MAX_TOKENS",
    "Option",
    "check_bounds",
    "declared",
    "field_values",
    "options",
]
