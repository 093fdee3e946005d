"""The one error type vrammath raises for bad input.

Every message is one line that names the field and what is allowed, so the CLI can print it as is.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input: a field with a value outside what is allowed.

    >>> raise InputError("micro_batch", "must be a positive integer", got=0)
    Traceback (most recent call last):
    ...
    vrammath.errors.InputError: micro_batch: must be a positive integer (got 0)
    """

    def __init__(self, field: str, allowed: str, got: object = ...) -> None:
        self.field = field
        self.allowed = allowed
        got_text = "" if got is ... else f" (got {got!r})"
        super().__init__(f"{field}: {allowed}{got_text}")


def one_of(field: str, value: object, allowed: list[str] | tuple[str, ...]) -> InputError:
    """An :class:`InputError` for a value that must be one of ``allowed``."""
    return InputError(field, "must be one of " + ", ".join(allowed), got=value)


def positive_int(field: str, value: object) -> int:
    """``value`` if it is a positive integer (not a bool, not a float), else an :class:`InputError`.

    >>> positive_int("layers", 32)
    32
    >>> positive_int("layers", 2.5)
    Traceback (most recent call last):
    ...
    vrammath.errors.InputError: layers: must be a positive integer (got 2.5)
    """
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(field, "must be a positive integer", got=value)
    return value
