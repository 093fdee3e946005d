"""The calculator's code printer: sympy expressions as JavaScript on exact rationals.

:func:`exact_js` prints an expression as calls on the page's exact rational type ``Z``
(``docs/_static/calculator.js``: BigInt numerator and denominator), so the page computes the
library's exact value and rounds it as the library does. It prints arithmetic only: an expression
it cannot print exactly (a square root, a float) is refused, never approximated.
"""

from __future__ import annotations

import json

import sympy

_RELATIONS = {">=": "ge", ">": "gt", "<=": "le", "<": "lt", "==": "eq", "!=": "ne"}
#: sympy functions and the page's exact counterparts (``Z.name(args...)``)
_CALLS: dict[type, str] = {
    sympy.Add: "add",
    sympy.Mul: "mul",
    sympy.Max: "max",
    sympy.Min: "min",
    sympy.ceiling: "ceil",
    sympy.floor: "floor",
    sympy.KroneckerDelta: "delta",
}


def exact_js(expr: sympy.Basic) -> str:
    """``expr`` as JavaScript on the page's exact rationals: ``Z.add``, ``Z.mul``, ``Z.pow``,
    ``Z.ceil``, ``Z.floor``, ``Z.max``, ``Z.min``, ``Z.delta``, ``Z.pw`` (Piecewise) and the
    relations ``Z.ge`` ...; integers and rationals as ``Z.q("p","q")``; a symbol ``x`` as
    ``v["x"]``. Only arithmetic: the expression decides everything. Anything else (a square
    root, a float) raises ValueError."""
    if isinstance(expr, sympy.Symbol):
        return f"v[{json.dumps(expr.name)}]"
    if isinstance(expr, sympy.Integer):
        return f'Z.q("{int(expr)}")'
    if isinstance(expr, sympy.Rational):
        return f'Z.q("{expr.p}","{expr.q}")'
    if expr is sympy.true or expr is sympy.false:
        return "true" if expr is sympy.true else "false"
    if isinstance(expr, sympy.Pow):
        base, exp = expr.args
        if not exp.is_Integer:
            raise ValueError(f"not exact: {expr}")
        return f"Z.pow({exact_js(base)},{int(exp)})"
    if isinstance(expr, sympy.Piecewise):
        return "Z.pw(" + ",".join(f"[{exact_js(c)},{exact_js(e)}]" for e, c in expr.args) + ")"
    if isinstance(expr, sympy.core.relational.Relational):
        name = _RELATIONS[expr.rel_op]
    else:
        name = next((js for cls, js in _CALLS.items() if isinstance(expr, cls)), "")
    if not name:
        raise ValueError(f"cannot compile {type(expr).__name__}: {expr}")
    return f"Z.{name}(" + ",".join(exact_js(a) for a in expr.args) + ")"


def js_function(expr: sympy.Expr) -> str:
    """``expr`` as a JavaScript arrow function of the values ``v``."""
    return "(v)=>" + exact_js(sympy.sympify(expr))


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
