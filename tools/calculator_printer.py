"""The calculator's code printer: sympy expressions as JavaScript on exact rationals.

:func:`exact_js` prints an expression as calls on the page's exact rational type ``Z``
(``docs/_static/calculator.js``: BigInt numerator and denominator), so the page computes the
library's exact value and rounds it as the library does. It prints arithmetic only: an expression
it cannot print exactly (a square root, a float) is refused, never approximated.
"""

from __future__ import annotations

import json

import sympy

_RELATIONS = {">=": "Z.ge", ">": "Z.gt", "<=": "Z.le", "<": "Z.lt", "==": "Z.eq", "!=": "Z.ne"}
#: sympy functions and the page's exact counterparts, by the short names :func:`funcs_script`
#: binds (``m`` is ``Z.mul``, ...): the data holds hundreds of expressions
_CALLS: dict[type, str] = {
    sympy.Add: "a",
    sympy.Mul: "m",
    sympy.Max: "x",
    sympy.Min: "n",
    sympy.ceiling: "c",
    sympy.floor: "f",
    sympy.KroneckerDelta: "k",
}
_SHORT = {"q": "q", "a": "add", "m": "mul", "p": "pow", "x": "max", "n": "min", "c": "ceil",
          "f": "floor", "k": "delta", "w": "pw"}  # fmt: skip
_SAFE = 2**53  # integers below it are exact as JavaScript numbers


def _number(n: int) -> str:
    return str(n) if abs(n) < _SAFE else f'"{n}"'


def exact_js(expr: sympy.Basic) -> str:
    """``expr`` as JavaScript on the page's exact rationals ``Z`` (``docs/_static/calculator.js``):
    ``a`` (add), ``m`` (mul), ``p`` (pow), ``c`` (ceil), ``f`` (floor), ``x`` (max), ``n`` (min),
    ``k`` (Kronecker delta), ``w`` (Piecewise) and the relations ``Z.ge`` ...; an integer as a
    number (a decimal string past 2**53), a rational as ``q(p,q)``; a symbol ``x`` as ``v.x``.
    Only arithmetic: the expression decides everything. Anything else (a square root, a float)
    raises ValueError.

    >>> exact_js(sympy.ceiling(sympy.Symbol("h") / 256) * 3)
    'm(3,c(m(q(1,256),v.h)))'
    """
    if isinstance(expr, sympy.Symbol):
        name = expr.name
        return f"v.{name}" if name.isidentifier() else f"v[{json.dumps(name)}]"
    if isinstance(expr, sympy.Integer):
        return _number(int(expr))
    if isinstance(expr, sympy.Rational):
        return f"q({_number(expr.p)},{_number(expr.q)})"
    if expr is sympy.true or expr is sympy.false:
        return "true" if expr is sympy.true else "false"
    if isinstance(expr, sympy.Pow):
        base, exp = expr.args
        if not exp.is_Integer:
            raise ValueError(f"not exact: {expr}")
        return f"p({exact_js(base)},{int(exp)})"
    if isinstance(expr, sympy.Piecewise):
        return "w(" + ",".join(f"[{exact_js(c)},{exact_js(e)}]" for e, c in expr.args) + ")"
    if isinstance(expr, sympy.core.relational.Relational):
        name = _RELATIONS[expr.rel_op]
    else:
        name = next((js for cls, js in _CALLS.items() if isinstance(expr, cls)), "")
    if not name:
        raise ValueError(f"cannot compile {type(expr).__name__}: {expr}")
    return f"{name}(" + ",".join(exact_js(a) for a in expr.args) + ")"


def js_function(expr: sympy.Expr) -> str:
    """``expr`` as a JavaScript arrow function of the values ``v``."""
    return "v=>" + exact_js(sympy.sympify(expr))


def funcs_script(funcs: list[str]) -> str:
    """A JavaScript function of ``Z`` returning the compiled functions, the short names bound."""
    names = ",".join(f"{short}=Z.{long}" for short, long in _SHORT.items())
    return "(function(Z){const " + names + ";return[\n" + ",\n".join(funcs) + "];})"


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
