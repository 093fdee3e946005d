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

from dataclasses import dataclass, field

import sympy

from vrammath.activations import activation_exprs, korthikanti_first_stage_bytes
from vrammath.parallel import shard_model_states
from vrammath.params import layer_param_expr, param_count, rank_param_count
from vrammath.peak import compose_phases
from vrammath.peft import lora_terms
from vrammath.presets import GPU, gpu
from vrammath.setup import PRECISION_OF, Setup
from vrammath.states import (
    model_state_exprs,
    optimizer_step_temp_expr,
    recipe,
    state_values,
)
from vrammath.symbols import N_d, P, b, m, p, r, s, t
from vrammath.units import fmt_gb, fmt_gib

PHASES = ("forward_peak", "backward_peak", "step_peak")

_STATE_LABELS = {
    "weights": "weights",
    "gradients": "gradients",
    "master": "master weights (fp32)",
    "optimizer": "optimizer states",
}


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
    phase_exprs: dict[str, sympy.Expr] = field(default_factory=dict, repr=False)

    @property
    def phases(self) -> dict[str, int]:
        """Bytes live at the peak of each phase of a training iteration (forward, backward,
        optimizer step), per GPU; see :func:`vrammath.peak.compose_phases`."""
        return {k: _value(e, self.values) for k, e in self.phase_exprs.items()}

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
        """The per-GPU peak as one expression: the largest phase (in the symbols of
        :mod:`vrammath.symbols`; evaluate with ``values``). Solvers and sweeps use this."""
        if self.phase_exprs:
            return sympy.Max(*self.phase_exprs.values())
        return sympy.Add(
            *(c.expr for c in self.components if c.device == "gpu" and c.expr is not None)
        )

    @property
    def model_state_bytes(self) -> int:
        """Weights + gradients + master + optimizer states on one GPU."""
        return self._total("gpu", _MODEL_STATE_KEYS)

    @property
    def states_plus_gathered_bytes(self) -> int:
        """Model states plus the ZeRO-3 layers gathered in flight on one GPU (no activations):
        what must fit before a single activation is kept.

        >>> from vrammath.presets import load_model
        >>> est = estimate(Setup(load_model("llama-7b"), zero=3, gpus=8))
        >>> est.states_plus_gathered_bytes - est.model_state_bytes == est.component("gathered").bytes
        True
        """
        return self._total("gpu", (*_MODEL_STATE_KEYS, "gathered"))

    @property
    def activation_bytes(self) -> int:
        """Activations, logits and loss buffers kept for backward on one GPU (the ``A`` of the
        phase peaks; the peak adds other terms, see :attr:`phases`).

        >>> from vrammath.presets import load_model
        >>> est = estimate(Setup(load_model("llama-7b"), seq_len=2048))
        >>> est.activation_bytes == sum(est.component(k).bytes for k in ("activations", "logits_loss"))
        True
        """
        return self._total("gpu", _ACTIVATION_KEYS)

    @property
    def gpu_bytes(self) -> int:
        """The peak per GPU, the largest phase of the iteration (what must fit)."""
        return _value(self.gpu_expr(), self.values)

    @property
    def peak_phase(self) -> str:
        """The phase where the peak falls."""
        phases = self.phases
        return max(phases, key=lambda k: phases[k])

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
                "lora_rank": setup.lora_rank,
                "lora_targets": list(setup.lora_targets),
                "quant": setup.quant,
                "lora_dropout": setup.lora_dropout,
                "activation_model": setup.activation_formula,
                "iteration": setup.iteration,
                "schedule": setup.schedule,
                "chunks": setup.chunks,
                "device": setup.device,
            },
            "phases": self.phases,
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
                "peak_phase": self.peak_phase,
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
        for phase, value in self.phases.items():
            rows.append((f"phase: {phase}", "gpu", fmt_gb(value), fmt_gib(value), ""))
        rows.append(
            (
                f"peak per GPU ({self.peak_phase})",
                "gpu",
                fmt_gb(self.gpu_bytes),
                fmt_gib(self.gpu_bytes),
                "",
            )
        )
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
        lines.append(
            "not counted: CUDA context, cuBLAS/NCCL workspaces, allocator rounding and "
            "fragmentation (reserve them: vrammath fit --reserve-gib, solve.DEFAULT_RESERVE_BYTES)"
        )
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


_MODEL_STATE_KEYS = (
    "weights",
    "gradients",
    "master",
    "optimizer",
    "quant_constants",
    "adapter_weights",
    "adapter_gradients",
    "adapter_master",
    "adapter_optimizer",
)
_ACTIVATION_KEYS = ("activations", "logits_loss", "adapter_activations")
_LORA_SHARD = {
    "weights": 3,  # ZeRO stage from which each LoRA term is sharded over N_d
    "quant_constants": 3,
    "adapter_weights": 3,
    "adapter_gradients": 2,
    "adapter_master": 1,
    "adapter_optimizer": 1,
    "step_temporaries": 1,
}


def _lora_components(setup: Setup, values: dict[sympy.Symbol, int]) -> list[Component]:
    assert setup.lora_rank is not None
    values[r] = setup.lora_rank
    terms = lora_terms(
        setup.model,
        setup.lora_rank,
        setup.lora_targets,
        setup.recipe,
        setup.optimizer,
        setup.implementation,
        quant=setup.quant,
        dropout=setup.lora_dropout,
        recompute=setup.recompute,
    )
    out = []
    for term in terms:
        expr = term.expr
        if setup.zero >= _LORA_SHARD.get(term.key, 4):
            expr = expr / N_d
        out.append(Component(term.key, term.label, "gpu", expr, _value(expr, values), term.note))
    return out


def _value(expr: sympy.Expr, values: dict[sympy.Symbol, int]) -> int:
    # Shards round up: the last rank holds the padding (DeepSpeed and FSDP pad to N_d).
    return int(sympy.ceiling(expr.subs(values)))


def _activation_components(setup: Setup, values: dict[sympy.Symbol, int]) -> list[Component]:
    spec = setup.model
    precision = PRECISION_OF[setup.recipe]
    if setup.activation_formula == "hf":
        recompute = "full" if setup.recompute == "full" else "none"
        exprs = activation_exprs(
            spec,
            setup.attention,  # type: ignore[arg-type]
            precision,  # type: ignore[arg-type]
            recompute,  # type: ignore[arg-type]
            device=setup.device,  # type: ignore[arg-type]
        )
        how = f"{spec.model_type} as transformers runs it, {setup.attention}, {precision}"
        if setup.lora_rank is not None:
            # frozen linears keep no inputs for weight gradients: an upper bound under LoRA
            how += "; full fine-tuning's count, an upper bound with a frozen base"
        return [
            Component(
                "activations",
                "activations kept for backward",
                "gpu",
                exprs["activations"],
                _value(exprs["activations"], values),
                how + (", checkpoints only" if recompute == "full" else ""),
            ),
            Component(
                "logits_loss",
                "logits and loss buffers kept",
                "gpu",
                exprs["logits_loss"],
                _value(exprs["logits_loss"], values),
                "logits and the fp32 log-softmax the loss keeps for backward",
            ),
        ]
    parallel = "tp_sp" if setup.sp else "tp"
    expr = korthikanti_first_stage_bytes(
        parallel,  # type: ignore[arg-type]
        setup.recompute,  # type: ignore[arg-type]
        schedule=setup.schedule,  # type: ignore[arg-type]
        activation_bytes=4 if precision == "fp32" else 2,
    )
    return [
        Component(
            "activations",
            "activations, first pipeline stage (Korthikanti et al.)",
            "gpu",
            expr,
            _value(expr, values),
            "as published: GPT block, 4h GeLU MLP, 1-byte dropout masks",
        )
    ]


def _phase_exprs(setup: Setup, comps: list[Component]) -> dict[str, sympy.Expr]:
    by_key = {c.key: c.expr for c in comps if c.device == "gpu" and c.expr is not None}

    def total(*keys: str) -> sympy.Expr:
        return sympy.Add(*(by_key.get(k, sympy.Integer(0)) for k in keys))

    W = total("weights", "master", "quant_constants", "adapter_weights", "adapter_master")
    O_ = total("optimizer", "adapter_optimizer")
    G = total("gradients", "adapter_gradients")
    T_step = total("step_temporaries")
    A = total(*_ACTIVATION_KEYS)
    in_flight = total("gathered", "dequant_buffer")
    rec = recipe(setup.recipe)
    if setup.activation_formula == "korthikanti":
        # Megatron: activations are freed as gradients appear; the backward peak is the larger
        O_before = O_ if setup.iteration == "steady" else sympy.Integer(0)
        return {
            "forward_peak": W + O_before + A + in_flight,
            "backward_peak": sympy.Max(W + O_before + A, W + O_before + G) + in_flight,
            "step_peak": W + O_ + G + T_step,
        }
    reduce_buffer = (
        rec.gradients * layer_param_expr(setup.model) if setup.zero == 3 else sympy.Integer(0)
    )
    phases = compose_phases(
        setup.model,
        weights=W,
        optimizer=O_,
        gradients=G,
        step_temporaries=T_step,
        precision=PRECISION_OF[setup.recipe],  # type: ignore[arg-type]
        attention=setup.attention,  # type: ignore[arg-type]
        recompute="full" if setup.recompute == "full" else "none",
        gathered=in_flight,
        reduce_buffer=reduce_buffer,
        grad_bytes=rec.gradients,
        iteration=setup.iteration,  # type: ignore[arg-type]
        activations=A,
        device=setup.device,  # type: ignore[arg-type]
    )
    return {k: phases[k] for k in PHASES}


def estimate(setup: Setup) -> Estimate:
    """Evaluate every memory component of ``setup`` for one GPU (and its host, when offloading),
    and the peak of each phase of a training iteration.

    With ``tp`` or ``pp`` above 1, ``P`` stands for the parameters of the fullest
    tensor/pipeline rank (:func:`vrammath.params.rank_param_count`) and the activations are
    Korthikanti et al.'s first pipeline stage.
    """
    values: dict[sympy.Symbol, int] = {
        **state_values(setup.model),
        N_d: setup.gpus,
        b: setup.micro_batch,
        s: setup.seq_len,
        t: setup.tp,
        p: setup.pp,
        m: setup.chunks,
    }
    if setup.tp > 1 or setup.pp > 1:
        values[P] = rank_param_count(setup.model, setup.tp, setup.pp)
    lora_step: Component | None = None
    if setup.lora_rank is not None:
        comps = _lora_components(setup, values)
        lora_step = comps.pop()  # the adapters' step temporaries, appended last below
    else:
        comps = _state_components(setup, values)
    if setup.zero == 3:  # gathered for compute even when the shards live on the CPU
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
    comps += _activation_components(setup, values)
    if lora_step is not None:
        comps.append(lora_step)
    else:
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
    return Estimate(setup, tuple(comps), values, _phase_exprs(setup, comps))


__all__ = [
    "PHASES",
    "Component",
    "Estimate",
    "estimate",
]
