"""Derive the exact memory polynomial of any transformers causal LM from fake training steps.

``derive`` builds the real Hugging Face model of a ``config.json`` (whatever ``model_type``
transformers can instantiate, with or without a vrammath reader), runs fake training steps at a
few (b, s) points (``FakeTensorMode`` + ``MemTracker`` on a CPU: no weights, no GPU), and solves
exactly, in rationals, for the coefficients of

    1, b, s, b s, s^2, b s^2

in each measured quantity: the activation bytes kept at the end of forward, and the peak of each
phase (forward, backward, optimizer step) of a steady-state iteration. The fit is checked at
points it was not solved on (a larger b, an odd s, another s); a miss is reported, never hidden.
b = 1 is measured apart: some tensors stay views at b = 1 (the loss's shifted labels), so the
polynomial holds for b >= 2 and the b = 1 offset is reported.

The layer count: when every decoder layer is the same (no per-layer ``layer_types`` with more
than one kind, no first-k-dense or sparse-step keys), each point is measured with 1 and 2 layers
and the result is f(L) = f(1) + (L - 1) (f(2) - f(1)), checked with 3 layers at one point; else
the model is run with all its layers. The bytes at the config's L follow from the expression in L.

torch and transformers are imported inside the functions, so this module imports without them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import sympy

from vrammath.measure.build import check_choice, param_dtype, real_training_masks
from vrammath.measure.hf_config import (
    first_line,
    grouped_experts,
    hf_config_of,
    layer_count,
    uniform_layers,
)
from vrammath.measure.step import (
    _enable_checkpointing,
    _make_optimizer,
    _mem_tracker,
    _tracked_loop,
)
from vrammath.notation.errors import InputError, positive_int
from vrammath.notation.symbols import L, b, s
from vrammath.notation.units import fmt_bytes

MONOMIALS: tuple[sympy.Expr, ...] = (sympy.Integer(1), b, s, b * s, s**2, b * s**2)
"""The monomials the fit solves for."""
QUANTITIES = ("activations", "forward", "backward", "step")
"""What is fitted: bytes kept at the end of forward, and the peak of each steady-state phase."""
FIT_BATCHES = (2, 3)
"""The batches the fit is solved at (b = 1 is special; see the module docstring)."""


def grid(seq: int) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...], tuple[int, ...]]:
    """The sequences the fit is solved at, the (b, s) points it is verified at, and the
    sequences b = 1 is measured at, for a user's ``seq``.

    Fake tensors cost the same time at any size, so the grid sits around ``seq``: the phase peaks
    are maxima over the moments of a phase, and which moment wins can change with s (a small s is
    dominated by the gradients, a large one by the activations), so the polynomial is the one of
    the piece that holds ``seq``.

    >>> grid(512)
    ((256, 512, 768), ((4, 513), (3, 641), (2, 1024)), (512, 768))
    """
    h = max(8, seq // 2)
    return (h, 2 * h, 3 * h), ((4, 2 * h + 1), (3, (5 * h // 2) | 1), (2, 4 * h)), (2 * h, 3 * h)


PRECISIONS = ("bf16", "fp32")
ATTENTIONS = ("sdpa", "eager")
RECOMPUTES = ("none", "full")


@dataclass(frozen=True)
class Derived:
    """What :func:`derive` found: per quantity a polynomial in b, s (and L), and its checks.

    ``exprs`` are in b and s at the config's layer count; ``in_layers`` in b, s and L when the
    layers were fitted (else equal to ``exprs``). ``misses`` lists every verification point where
    the measured bytes differ from the polynomial; ``batch_one`` the measured minus the
    polynomial at b = 1 per quantity and sequence. ``experts`` names transformers' experts
    implementation when the model has switchable experts (``"grouped_mm"``), else is empty.
    """

    model_type: str
    layers: int
    layer_mode: str
    precision: str
    attention: str
    recompute: str
    exprs: dict[str, sympy.Expr]
    in_layers: dict[str, sympy.Expr]
    misses: tuple[str, ...]
    batch_one: dict[str, dict[int, int]]
    runs: int
    checks: tuple[tuple[int, int], ...]
    seconds: float
    versions: dict[str, str] = field(default_factory=dict)
    experts: str = ""

    def bytes_at(self, batch: int, seq: int) -> dict[str, int]:
        """Bytes of each quantity at (batch, seq); at b = 1 with the offset measured at that seq,
        or the constant one measured at every seq."""
        out = {}
        for q, e in self.exprs.items():
            value = int(e.subs({b: batch, s: seq}))
            measured = self.batch_one.get(q, {})
            if batch == 1 and seq in measured:
                value += measured[seq]
            elif batch == 1 and len(set(measured.values())) == 1:
                value += next(iter(measured.values()))
            out[q] = value
        return out

    def peak_phase(self, batch: int, seq: int) -> str:
        """The phase whose peak is the largest at (batch, seq)."""
        at = self.bytes_at(batch, seq)
        return max(("forward", "backward", "step"), key=lambda ph: at[ph])

    def switches(self, batch: int) -> list[str]:
        """Where, at this batch, the largest phase peak changes: the positive real roots in s of
        the difference of two phase polynomials."""
        out = []
        phases = ("forward", "backward", "step")
        for i, one in enumerate(phases):
            for two in phases[i + 1 :]:
                diff = sympy.expand((self.exprs[one] - self.exprs[two]).subs(b, batch))
                if diff == 0:
                    continue
                for root in sympy.Poly(diff, s).real_roots() if diff.has(s) else []:
                    if root >= 1:
                        out.append(
                            f"{one} = {two} at s = {float(root):.1f} (b = {batch}; polynomials "
                            "fitted near the given s, extrapolated there)"
                        )
        return out

    def as_dict(self, batch: int, seq: int) -> dict[str, Any]:
        """A JSON-ready record: the expressions (text and per-monomial coefficients), the bytes
        at (batch, seq), the checks and how long it took."""
        return {
            "model_type": self.model_type,
            "layers": self.layers,
            "layer_mode": self.layer_mode,
            "precision": self.precision,
            "attention": self.attention,
            "recompute": self.recompute,
            "batch": batch,
            "seq": seq,
            "exprs": {q: str(e) for q, e in self.exprs.items()},
            "exprs_in_layers": {q: str(e) for q, e in self.in_layers.items()},
            "coefficients": {q: coefficients(e) for q, e in self.exprs.items()},
            "bytes": self.bytes_at(batch, seq),
            "peak_phase": self.peak_phase(batch, seq),
            "switches": self.switches(batch),
            "misses": list(self.misses),
            "batch_one": {q: {str(k): v for k, v in d.items()} for q, d in self.batch_one.items()},
            "checks": [list(c) for c in self.checks],
            "runs": self.runs,
            "seconds": self.seconds,
            "versions": self.versions,
            **({"experts": self.experts} if self.experts else {}),
        }


def coefficients(expr: sympy.Expr) -> dict[str, str]:
    """Each monomial's coefficient of a polynomial in b and s (as text, rationals exact).

    >>> coefficients(3*b*s**2 + 8*s + 7)
    {'1': '7', 'b': '0', 's': '8', 'b*s': '0', 's**2': '0', 'b*s**2': '3'}
    """
    poly = sympy.Poly(sympy.expand(expr), b, s)
    out = {}
    for m in MONOMIALS:
        powers = sympy.Poly(m, b, s).monoms()[0]
        out[str(m)] = str(poly.coeff_monomial(powers))
    return out


def solve_exact(points: Sequence[tuple[int, int]], values: Sequence[int]) -> sympy.Expr:
    """The polynomial over :data:`MONOMIALS` through ``values`` at the (b, s) ``points``, solved
    exactly in rationals (Gauss-Jordan over :class:`fractions.Fraction`).

    >>> pts = [(2, 16), (2, 24), (2, 40), (3, 16), (3, 24), (3, 40)]
    >>> solve_exact(pts, [5 + 2*bb*ss + bb*ss*ss for bb, ss in pts])
    b*s**2 + 2*b*s + 5
    """
    n = len(MONOMIALS)
    if len(points) != n or len(values) != n:
        raise InputError("points", f"need exactly {n} (b, s) points and values", got=len(points))
    rows = [
        [Fraction(int(m.subs({b: bb, s: ss}))) for m in MONOMIALS] + [Fraction(v)]
        for (bb, ss), v in zip(points, values, strict=True)
    ]
    for col in range(n):
        pivot = next((r for r in range(col, n) if rows[r][col] != 0), None)
        if pivot is None:
            raise InputError("points", "do not determine the six coefficients", got=list(points))
        rows[col], rows[pivot] = rows[pivot], rows[col]
        lead = rows[col][col]
        rows[col] = [x / lead for x in rows[col]]
        for r in range(n):
            if r != col and rows[r][col] != 0:
                f = rows[r][col]
                rows[r] = [x - f * y for x, y in zip(rows[r], rows[col], strict=True)]
    coeffs = [sympy.Rational(row[n].numerator, row[n].denominator) for row in rows]
    return sympy.expand(sum((c * m for c, m in zip(coeffs, MONOMIALS, strict=True)), sympy.S(0)))


def measure_config(
    cfg: Mapping[str, object],
    *,
    batch: int,
    seq: int,
    precision: str = "bf16",
    attention: str = "sdpa",
    recompute: str = "none",
    layers: int | None = None,
    optimizer: str = "adamw",
    implementation: str = "foreach",
    steps: int = 2,
) -> dict[str, int]:
    """Bytes of each of :data:`QUANTITIES` in the last of ``steps`` fake training iterations of
    the transformers model of ``cfg`` (``layers`` overrides its layer count)."""
    import torch
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode

    config = hf_config_of(cfg, attention=attention, layers=layers)
    with real_training_masks(), FakeTensorMode():
        torch.manual_seed(0)
        try:
            model = transformers.AutoModelForCausalLM.from_config(
                config, dtype=param_dtype(precision), attn_implementation=attention
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise InputError(
                "config", f"transformers cannot build a causal LM of it ({first_line(exc)})"
            ) from None
        model.train()
        if recompute == "full":
            _enable_checkpointing(model)
        opt = _make_optimizer(model.parameters(), optimizer, implementation)
        ids = torch.randint(0, int(config.vocab_size), (batch, seq))
        iterations = _tracked_loop(_mem_tracker(model, opt), model, opt, ids, precision, steps)
    last = iterations[-1]
    return {
        "activations": int(last["forward"]["end"]["Activation"]),
        **{ph: int(last[ph]["peak"]["Total"]) for ph in ("forward", "backward", "step")},
    }


def derive(
    cfg: Mapping[str, object],
    *,
    precision: str = "bf16",
    attention: str = "sdpa",
    recompute: str = "none",
    batch: int = 1,
    seq: int = 512,
    layers: str = "auto",
    optimizer: str = "adamw",
    implementation: str = "foreach",
    steps: int = 2,
    verify: bool = True,
) -> Derived:
    """Fit the exact polynomial in b and s of each of :data:`QUANTITIES` for ``cfg``.

    ``layers``: ``"auto"`` fits in L with 1 and 2 layers when the layers are uniform, else runs
    all of them; ``"fit"`` or ``"full"`` forces one way.
    """

    check_choice("precision", precision, PRECISIONS)
    check_choice("attention", attention, ATTENTIONS)
    check_choice("recompute", recompute, RECOMPUTES)
    positive_int("batch", batch)
    positive_int("seq", seq)
    check_choice("layers", layers, ("auto", "fit", "full"))
    with _quiet_transformers():
        return _derive(
            cfg,
            precision,
            attention,
            recompute,
            (batch, seq),
            layers,
            (optimizer, implementation),
            (steps, verify),
        )


def _derive(
    cfg: Mapping[str, object],
    precision: str,
    attention: str,
    recompute: str,
    point: tuple[int, int],
    layers: str,
    opt: tuple[str, str],
    how: tuple[int, bool],
) -> Derived:
    import torch
    import transformers

    (batch, seq), (optimizer, implementation), (steps, verify) = point, opt, how
    started = time.perf_counter()
    config = hf_config_of(cfg, attention=attention)
    n_layers = layer_count(config)
    if precision != "bf16" and grouped_experts(config):
        raise InputError(
            "precision",
            f"{cfg.get('model_type')} runs grouped-matmul experts, which fake mode runs in bf16 "
            "only: derive it with bf16",
            got=precision,
        )
    fitted = layers == "fit" or (layers == "auto" and uniform_layers(cfg, config))
    runs = 0

    def at(batch: int, seq: int, count: int | None) -> dict[str, int]:
        nonlocal runs
        runs += 1
        return measure_config(
            cfg,
            batch=batch,
            seq=seq,
            precision=precision,
            attention=attention,
            recompute=recompute,
            layers=count,
            optimizer=optimizer,
            implementation=implementation,
            steps=steps,
        )

    counts: tuple[int | None, ...] = (1, 2) if fitted else (None,)
    seqs, checks, b1_seqs = grid(seq)
    if batch >= 2 and (batch, seq) not in checks:
        checks = (*checks, (batch, seq))
    if not verify:
        checks, b1_seqs = (), ()
    points = [(bb, ss) for bb in FIT_BATCHES for ss in seqs]
    by_count: dict[int | None, dict[str, sympy.Expr]] = {}
    for count in counts:
        measured = [at(bb, ss, count) for bb, ss in points]
        by_count[count] = {q: solve_exact(points, [m[q] for m in measured]) for q in QUANTITIES}
    if fitted:
        one, two = by_count[1], by_count[2]
        in_layers = {q: sympy.expand(one[q] + (L - 1) * (two[q] - one[q])) for q in QUANTITIES}
    else:
        in_layers = {q: by_count[None][q] for q in QUANTITIES}
    exprs = {q: sympy.expand(e.subs(L, n_layers)) for q, e in in_layers.items()}

    misses: list[str] = []
    check_count = 2 if fitted else None
    check_exprs = {q: e.subs(L, 2) for q, e in in_layers.items()} if fitted else exprs
    for bb, ss in checks:
        got = at(bb, ss, check_count)
        misses += _compare(got, check_exprs, bb, ss, "")
    if fitted and verify:
        got = at(3, seqs[1], 3)
        three = {q: e.subs(L, 3) for q, e in in_layers.items()}
        misses += _compare(got, three, 3, seqs[1], ", 3 layers")
    batch_one: dict[str, dict[int, int]] = {q: {} for q in QUANTITIES}
    for ss in b1_seqs:
        got = at(1, ss, check_count)
        for q in QUANTITIES:
            batch_one[q][ss] = got[q] - int(check_exprs[q].subs({b: 1, s: ss}))
    batch_one = {q: d for q, d in batch_one.items() if any(d.values())}
    return Derived(
        model_type=str(cfg.get("model_type")),
        layers=n_layers,
        layer_mode="fit in L with 1 and 2 layers" if fitted else f"all {n_layers} layers run",
        precision=precision,
        attention=attention,
        recompute=recompute,
        exprs=exprs,
        in_layers=in_layers,
        misses=tuple(misses),
        batch_one=batch_one,
        runs=runs,
        checks=checks,
        seconds=round(time.perf_counter() - started, 2),
        versions={"torch": torch.__version__, "transformers": transformers.__version__},
        experts="grouped_mm" if grouped_experts(config) else "",
    )


def _compare(
    got: Mapping[str, int], exprs: Mapping[str, sympy.Expr], bb: int, ss: int, where: str
) -> list[str]:
    out = []
    for q in QUANTITIES:
        want = int(exprs[q].subs({b: bb, s: ss}))
        if got[q] != want:
            out.append(
                f"{q}: at b = {bb}, s = {ss}{where} measured {got[q]:,} bytes, the polynomial "
                f"gives {want:,} ({got[q] - want:+,}): not one polynomial over this range"
            )
    return out


def report_lines(result: Derived, batch: int, seq: int) -> list[str]:
    """The text the CLI prints: the expressions, the bytes at (batch, seq) and the checks."""

    at = result.bytes_at(batch, seq)
    head = (
        f"{result.model_type}, {result.layers} layers ({result.layer_mode}), {result.precision}, "
        f"{result.attention}, recompute {result.recompute}: {result.runs} fake training runs, "
        f"{result.seconds:.1f} s"
    )
    lines = [head]
    if result.experts:
        lines.append(
            f"experts run as transformers' {result.experts} (one grouped matmul, bf16): the "
            "memory does not depend on the routing"
        )
    names = {
        "activations": "activations kept at the end of forward",
        "forward": "forward peak",
        "backward": "backward peak",
        "step": "optimizer step peak",
    }
    for q in QUANTITIES:
        lines.append(f"{names[q]}: {result.exprs[q]}")
        lines.append(f"  at b = {batch}, s = {seq}: {at[q]:,} bytes ({fmt_bytes(at[q])})")
    lines.append(f"largest phase at b = {batch}, s = {seq}: {result.peak_phase(batch, seq)}")
    lines += [f"  max() switches: {w}" for w in result.switches(batch)]
    for q, d in result.batch_one.items():
        shown = ", ".join(f"{v:+,} at s = {k}" for k, v in d.items())
        lines.append(f"b = 1 differs from the polynomial ({q}): {shown}")
    lines += [f"not polynomial: {m}" for m in result.misses]
    if not result.checks:
        lines.append("not verified at other points (verify=False)")
    elif not result.misses:
        lines.append(
            "verified at "
            + ", ".join(f"(b={bb}, s={ss})" for bb, ss in result.checks)
            + (" and with 3 layers" if result.layer_mode.startswith("fit") else "")
        )
    return lines


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' logger warns about token ids of tiny test vocabularies: not ours to print."""
    import transformers

    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(level)


__all__ = [
    "MONOMIALS",
    "QUANTITIES",
    "Derived",
    "coefficients",
    "derive",
    "measure_config",
    "report_lines",
    "solve_exact",
]
