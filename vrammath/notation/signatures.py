"""Functions that take one record's parameters: write a group of options once, read it in many.

:func:`after` gives a function the parameters of another -- a ``*_bytes`` those of its
``*_terms``, a formula those of the frozen dataclass that names its options -- so that related
functions share one signature instead of repeating it, while each keeps its own name, docstring
and doctest, and the API pages, ``inspect.signature`` and mypy see the shared parameters.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import ParamSpec, TypeVar

_P = ParamSpec("_P")
_T = TypeVar("_T")
_R = TypeVar("_R")


def after(first: Callable[_P, _T]) -> Callable[[Callable[[_T], _R]], Callable[_P, _R]]:
    """Make the decorated function read ``first``'s result, called with ``first``'s parameters.

    ``@after(first)`` over ``def body(x)`` gives ``body(first(*args, **kwargs))``: functions that
    take the same options write them once, a ``*_bytes`` as the sum of its ``*_terms``, formulas
    of one layer over :class:`LayerOptions`. The result keeps ``body``'s name, docstring and
    return annotation and shows ``first``'s parameters to ``inspect.signature`` (so to the
    API pages); the type checker sees them through the ParamSpec.

    >>> @after(lambda x, y=1: x + y)
    ... def doubled(total: int) -> int:
    ...     return 2 * total
    >>> doubled(2), doubled(2, y=3)
    (6, 10)
    """

    def derive(body: Callable[[_T], _R]) -> Callable[_P, _R]:
        @functools.wraps(body)
        def derived(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            return body(first(*args, **kwargs))

        # the signature as first's source spells it; the annotations evaluated (where first's
        # and body's modules define the names), as typing.get_type_hints and autodoc read them
        returns = inspect.signature(body).return_annotation
        signature = inspect.signature(first).replace(return_annotation=returns)
        vars(derived)["__signature__"] = signature  # the attribute inspect reads; not in typeshed
        hints = typing.get_type_hints(first)
        derived.__annotations__ = {
            **{name: hints[name] for name in signature.parameters if name in hints},
            "return": typing.get_type_hints(body)["return"],
        }
        return derived

    return derive


__all__ = ["after"]
