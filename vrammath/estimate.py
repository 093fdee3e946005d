"""Compose a training Setup into an Estimate: per-component expressions, their values, totals.

Each :class:`Component` keeps its sympy expression *and* its exact byte value, computed from the
same object by substituting the setup's numbers, so what the handbook prints as a formula and what
it prints as a number cannot disagree. A term vrammath does not estimate for a setup is kept in
the output with ``bytes=None`` and a note -- never a silent zero.

Examples
========

>>> from vrammath.presets import load_model
>>> est = estimate(Setup(load_model("llama-7b"), zero=2, gpus=4))
>>> est.component("optimizer").expr
8*P/N_d
>>> est.component("optimizer").bytes
13476831232
>>> est.model_state_bytes == 2 * 6738415616 + (2 + 4 + 8) * 6738415616 // 4
True
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import sympy

from vrammath.errors import InputError, one_of, positive_int
from vrammath.model import ModelSpec
from vrammath.parallel import shard_model_states, zero_stage
from vrammath.params import layer_param_expr, param_count
from vrammath.presets import GPU, gpu
from vrammath.states import (
    IMPLEMENTATIONS,
    OPTIMIZERS,
    RECIPES,
    model_state_exprs,
    optimizer_step_temp_expr,
    recipe,
    state_values,
)
from vrammath.symbols import N_d, b, p, s, t
from vrammath.units import fmt_gb, fmt_gib

ATTENTION = ("sdpa", "eager")
RECOMPUTE = ("none", "selective", "full")

_STATE_LABELS = {
    "weights": "weights",
    "gradients": "gradients",
    "master": "master weights (fp32)",
    "optimizer": "optimizer states",
}


@dataclass(frozen=True)
class Setup:
    """One training setup: the model, how it is stored and optimized, and how it is split."""

    model: ModelSpec
    recipe: str = "bf16-mixed"
    optimizer: str = "adamw"
    implementation: str = "foreach"
    zero: int = 0
    gpus: int = 1
    offload_optimizer: bool = False
    offload_params: bool = False
    micro_batch: int = 1
    seq_len: int = 2048
    tp: int = 1
    pp: int = 1
    sp: bool = False
    attention: str = "sdpa"
    recompute: str = "none"
    gpu: str | None = None

    def __post_init__(self) -> None:
        if self.recipe not in RECIPES:
            raise one_of("recipe", self.recipe, list(RECIPES))
        if self.optimizer not in OPTIMIZERS:
            raise one_of("optimizer", self.optimizer, OPTIMIZERS)
        if self.implementation not in IMPLEMENTATIONS:
            raise one_of("implementation", self.implementation, IMPLEMENTATIONS)
        object.__setattr__(self, "zero", zero_stage(self.zero))
        for name in ("gpus", "micro_batch", "seq_len", "tp", "pp"):
            positive_int(name, getattr(self, name))
        if self.attention not in ATTENTION:
            raise one_of("attention", self.attention, ATTENTION)
        if self.recompute not in RECOMPUTE:
            raise one_of("recompute", self.recompute, RECOMPUTE)
        if self.gpu is not None:
            gpu(self.gpu)  # raises on an unknown name
        if self.offload_params and self.zero != 3:
            raise InputError("offload_params", "needs --zero 3", got=self.zero)
        if self.offload_optimizer and self.zero == 0:
            raise InputError("offload_optimizer", "needs --zero 1, 2 or 3", got=self.zero)
        if self.sp and self.tp == 1:
            raise InputError("sp", "sequence parallelism needs tp > 1", got=self.tp)


@dataclass(frozen=True)
class Component:
    """One memory term: where it lives, its expression, its exact value (None = not estimated)."""

    key: str
    label: str
    device: str
    expr: sympy.Expr | None
    bytes: int | None
    note: str = ""


@dataclass(frozen=True)
class Estimate:
    """The result of :func:`estimate`: components, totals and the verdict against a GPU."""

    setup: Setup
    components: tuple[Component, ...]
    values: dict[sympy.Symbol, int] = field(repr=False)

    def component(self, key: str) -> Component:
        """The component with this key (e.g. ``"optimizer"``, ``"activations"``)."""
        for comp in self.components:
            if comp.key == key:
                return comp
        raise KeyError(f"no component {key!r}; have {[c.key for c in self.components]}")

    def _total(self, device: str, keys: tuple[str, ...] | None = None) -> int:
        return sum(
            c.bytes
            for c in self.components
            if c.device == device and c.bytes is not None and (keys is None or c.key in keys)
        )

    def gpu_expr(self) -> sympy.Expr:
        """Sum of the estimated GPU components' expressions (in the symbols of
        :mod:`vrammath.symbols`; evaluate with :attr:`values`). Solvers and sweeps use this."""
        return sympy.Add(
            *(c.expr for c in self.components if c.device == "gpu" and c.expr is not None)
        )

    @property
    def model_state_bytes(self) -> int:
        """Weights + gradients + master + optimizer states on one GPU."""
        return self._total("gpu", ("weights", "gradients", "master", "optimizer"))

    @property
    def gpu_bytes(self) -> int:
        """Total of every estimated GPU component (the steady-state footprint of one rank)."""
        return self._total("gpu")

    @property
    def cpu_bytes(self) -> int:
        """Host memory one rank needs for offloaded states."""
        return self._total("cpu")

    @property
    def unestimated(self) -> tuple[str, ...]:
        """Labels of components that are listed but not estimated for this setup."""
        return tuple(c.label for c in self.components if c.bytes is None)

    @property
    def gpu_spec(self) -> GPU | None:
        """The target GPU preset, if the setup names one."""
        return None if self.setup.gpu is None else gpu(self.setup.gpu)

    def fits(self) -> bool | None:
        """Whether the estimated GPU total fits the named GPU (None if no GPU is named).

        With unestimated components the answer is only a lower bound: see :attr:`unestimated`.
        """
        spec = self.gpu_spec
        return None if spec is None else self.gpu_bytes <= spec.bytes

    def as_dict(self) -> dict[str, object]:
        """Machine-readable form with stable keys; bytes are integers (None = not estimated)."""
        spec = self.gpu_spec
        setup = self.setup
        return {
            "model": setup.model.name,
            "params": param_count(setup.model),
            "setup": {
                "recipe": setup.recipe,
                "optimizer": setup.optimizer,
                "implementation": setup.implementation,
                "zero": setup.zero,
                "gpus": setup.gpus,
                "offload_optimizer": setup.offload_optimizer,
                "offload_params": setup.offload_params,
                "micro_batch": setup.micro_batch,
                "seq_len": setup.seq_len,
                "tp": setup.tp,
                "pp": setup.pp,
                "sp": setup.sp,
                "attention": setup.attention,
                "recompute": setup.recompute,
                "gpu": setup.gpu,
            },
            "components": [
                {
                    "key": c.key,
                    "label": c.label,
                    "device": c.device,
                    "bytes": c.bytes,
                    "expr": None if c.expr is None else str(c.expr),
                    "note": c.note,
                }
                for c in self.components
            ],
            "totals": {
                "gpu_bytes": self.gpu_bytes,
                "cpu_bytes": self.cpu_bytes,
                "model_state_bytes": self.model_state_bytes,
            },
            "unestimated": list(self.unestimated),
            "gpu": None
            if spec is None
            else {"name": spec.name, "bytes": spec.bytes, "fits": self.fits()},
        }

    def table(self) -> str:
        """A plain-text breakdown table, GB (1e9 bytes) and GiB (2**30 bytes) side by side."""
        rows = [("component", "device", "GB (1e9 B)", "GiB (2^30 B)", "formula")]
        for c in self.components:
            if c.bytes is None:
                rows.append((c.label, c.device, "not estimated", "", c.note))
            else:
                expr = "" if c.expr is None else str(c.expr)
                rows.append((c.label, c.device, fmt_gb(c.bytes), fmt_gib(c.bytes), expr))
        rows.append(("total per GPU", "gpu", fmt_gb(self.gpu_bytes), fmt_gib(self.gpu_bytes), ""))
        if self.cpu_bytes:
            rows.append(
                ("total CPU per rank", "cpu", fmt_gb(self.cpu_bytes), fmt_gib(self.cpu_bytes), "")
            )
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = [
            "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
            for r in rows
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        spec = self.gpu_spec
        if spec is not None:
            verdict = "fits" if self.fits() else "does NOT fit"
            free = spec.bytes - self.gpu_bytes
            lines.append(
                f"{spec.name} ({fmt_gb(spec.bytes)} / {fmt_gib(spec.bytes)}): {verdict}, "
                f"headroom {fmt_gb(free)} / {fmt_gib(free)}"
            )
        if self.unestimated:
            lines.append("not estimated: " + ", ".join(self.unestimated) + " (totals exclude them)")
        return "\n".join(lines)


def _state_components(setup: Setup, values: dict[sympy.Symbol, int]) -> list[Component]:
    exprs = model_state_exprs(setup.model, setup.recipe, setup.optimizer)
    rec = recipe(setup.recipe)
    gpu_exprs, cpu_exprs = shard_model_states(
        exprs,
        setup.zero,
        offload_optimizer=setup.offload_optimizer,
        offload_params=setup.offload_params,
    )
    out = []
    for key, expr in gpu_exprs.items():
        if key == "master" and rec.master == 0:
            continue
        out.append(Component(key, _STATE_LABELS[key], "gpu", expr, _value(expr, values)))
    for key, expr in cpu_exprs.items():
        out.append(
            Component(
                f"cpu_{key}", _STATE_LABELS[key] + " (offloaded)", "cpu", expr, _value(expr, values)
            )
        )
    return out


def _value(expr: sympy.Expr, values: dict[sympy.Symbol, int]) -> int:
    # Shards round up: the last rank holds the padding (DeepSpeed and FSDP pad to N_d).
    return int(sympy.ceiling(expr.subs(values)))


def estimate(setup: Setup) -> Estimate:
    """Evaluate every memory component of ``setup`` for one GPU (and its host, when offloading)."""
    if setup.tp > 1 or setup.pp > 1:
        raise InputError(
            "tp/pp",
            "tensor and pipeline parallel splits of model states are not estimated yet; "
            "use tp=1, pp=1",
            got=(setup.tp, setup.pp),
        )
    values: dict[sympy.Symbol, int] = {
        **state_values(setup.model),
        N_d: setup.gpus,
        b: setup.micro_batch,
        s: setup.seq_len,
        t: setup.tp,
        p: setup.pp,
    }
    comps = _state_components(setup, values)
    if setup.zero == 3 and not setup.offload_params:
        rec = recipe(setup.recipe)
        expr = 2 * rec.weights * layer_param_expr(setup.model)
        comps.append(
            Component(
                "gathered",
                "gathered layers (ZeRO-3 in flight)",
                "gpu",
                expr,
                _value(expr, values),
                "current layer + one prefetched, unsharded",
            )
        )
    comps.append(
        Component(
            "activations",
            "activations",
            "gpu",
            None,
            None,
            "not estimated yet: activation formulas land with the activation issue",
        )
    )
    step_expr = optimizer_step_temp_expr(
        setup.model, setup.recipe, setup.optimizer, setup.implementation
    )
    if setup.offload_optimizer:
        step_expr = sympy.Integer(0)  # the step runs on the CPU
    elif setup.zero >= 1:
        step_expr = step_expr / N_d  # each rank steps its own shard
    comps.append(
        Component(
            "step_temporaries",
            f"optimizer step temporaries ({setup.implementation})",
            "gpu",
            step_expr,
            _value(step_expr, values),
            "transient, during optimizer.step()",
        )
    )
    return Estimate(setup, tuple(comps), values)


def with_changes(setup: Setup, **changes: object) -> Setup:
    """A copy of ``setup`` with some fields changed (validated again)."""
    return replace(setup, **changes)  # type: ignore[arg-type]


__all__ = [
    "ATTENTION",
    "RECOMPUTE",
    "Component",
    "Estimate",
    "Setup",
    "estimate",
    "with_changes",
]
