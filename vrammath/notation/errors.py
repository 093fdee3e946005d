"""The one error type vrammath raises for bad input, and the one warning it gives.

Every message is one line that names the field and what is allowed, so the CLI can print it as is.
"""

from __future__ import annotations

import warnings


class InputError(ValueError):
    """Bad user input: a field with a value outside what is allowed.

    >>> raise InputError("micro_batch", "must be a positive integer", got=0)
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: micro_batch: must be a positive integer (got 0)
    """

    def __init__(self, field: str, allowed: str, got: object = ...) -> None:
        self.field = field
        self.allowed = allowed
        got_text = "" if got is ... else f" (got {_shown(got)})"
        super().__init__(f"{_line(field)}: {_line(allowed)}{got_text}")


class ContextWarning(UserWarning):
    """A setup or an answer runs past the positions its model is configured for
    (``max_position_embeddings``). The memory is still counted, as it would be for a context
    extended by RoPE scaling; how well the model does there is another matter. The CLI prints
    the same line in its ``warnings``; filter it with Python's ``warnings`` module where it is
    meant.
    """


def warn_context(model: str, line: str | None, stacklevel: int = 3) -> None:
    """Give ``line`` (a :meth:`vrammath.model.spec.ModelSpec.past_context` line, or None: nothing
    to say) as a :class:`ContextWarning` naming ``model``, attributed to the caller of the
    function that calls this one."""
    if line is not None:
        warnings.warn(f"{model}: {line}", ContextWarning, stacklevel=stacklevel)


def _line(text: str) -> str:
    """``text`` itself, or its escaped ``repr`` when it holds a newline or other control
    character, so that every message stays one line.

    >>> _line("config"), _line("con\\nfig")
    ('config', "'con\\\\nfig'")
    """
    return text if text.isprintable() else repr(text)


def _shown(value: object, limit: int = 200) -> str:
    """``repr(value)`` cut to ``limit`` characters; a huge integer by its size (``repr`` of one
    over 4,300 digits raises, and none should be echoed whole).

    >>> _shown(10**5000)
    'an integer of 16610 bits'
    """
    if isinstance(value, int) and value.bit_length() > 200:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
    vrammath.notation.errors.InputError: layers: must be a positive integer (got 2.5)
    """
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(field, "must be a positive integer", got=value)
    return value
