"""Compose a training Setup into an Estimate: per-component expressions, their values, totals.

Each :class:`Component` keeps its sympy expression *and* its exact byte value, computed from the
same object by substituting the setup's numbers, so what the handbook prints as a formula and what
it prints as a number cannot disagree. A term vrammath does not estimate for a setup is kept in
the output with ``bytes=None`` and a note -- never a silent zero.

Examples
========

>>> from vrammath.model.presets import load_model
>>> est = estimate(Setup(load_model("llama-7b"), zero=2, gpus=4))
>>> est.component("optimizer").expr
8*P/N_d
>>> est.component("optimizer").bytes
13476831232
>>> est.model_state_bytes == 2 * 6738415616 + (2 + 4 + 8) * 6738415616 // 4
True
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cached_property

import sympy

from vrammath.compose.engines import (
    PHASE_ROWS,
    RANKED_ENGINES,
    check_engine,
    counted_rank,
    own_share,
    sharded_stage,
)
from vrammath.compose.moe_stage import stage_copies
from vrammath.compose.peak import PHASES, Groups, hf_phase_peaks, korthikanti_phase_peaks
from vrammath.compose.rows import (
    GROUPS,
    STATE_GROUPS,
    Context,
    Group,
    Term,
    dim0_shard_params,
    per_rank,
    text,
)
from vrammath.compose.setup import PRECISION_OF, Setup
from vrammath.compose.table import TERMS
from vrammath.model.params import rank_param_count
from vrammath.model.presets import GPU, gpu
from vrammath.notation.errors import InputError, warn_context
from vrammath.notation.symbols import N_d, P, P_r, b, m, p, r, s, t
from vrammath.terms.lora.linears import check_estimated_targets
from vrammath.terms.moe.params import ep_replica_params, expert_values
from vrammath.terms.states import state_values


@dataclass(frozen=True)
class Component:
    """One memory term of an estimate: where it lives, its expression, its exact value
    (None = not estimated), and its phase group (a row of :data:`vrammath.compose.table.TERMS`, built)."""

    key: str
    label: str
    device: str
    expr: sympy.Expr | None
    bytes: int | None
    note: str = ""
    group: str = ""


@dataclass(frozen=True)
class Estimate:
    """The result of :func:`estimate`: components, totals and the verdict against a GPU."""

    setup: Setup
    components: tuple[Component, ...]
    values: dict[sympy.Symbol, int] = field(repr=False)
    phase_exprs: dict[str, sympy.Expr] = field(default_factory=dict, repr=False)

    @cached_property
    def phases(self) -> dict[str, int]:
        """Bytes live at the peak of each phase of a training iteration (forward, backward,
        optimizer step), per GPU; see :mod:`vrammath.compose.peak`."""
        return {k: _value(e, self.values) for k, e in self.phase_exprs.items()}

    def component(self, key: str) -> Component:
        """The component with this key (e.g. ``"optimizer"``, ``"activations"``)."""
        for comp in self.components:
            if comp.key == key:
                return comp
        raise KeyError(f"no component {key!r}; have {[c.key for c in self.components]}")

    def _total(self, device: str, groups: tuple[str, ...] | None = None) -> int:
        return sum(
            c.bytes
            for c in self.components
            if c.device == device and c.bytes is not None and (groups is None or c.group in groups)
        )

    def gpu_expr(self) -> sympy.Expr:
        """The per-GPU peak as one expression: the largest phase (in the symbols of
        :mod:`vrammath.notation.symbols`; evaluate with ``values``). Solvers and sweeps use this."""
        return self._gpu_expr

    @cached_property
    def _gpu_expr(self) -> sympy.Expr:
        # unevaluated: a symbolic Max compares the phases symbolically (slow, and decides nothing
        # the numbers do not); solvers take it branch by branch, sweeps and evaluation exactly
        if self.phase_exprs:
            return sympy.Max(*self.phase_exprs.values(), evaluate=False)
        return sympy.Add(
            *(c.expr for c in self.components if c.device == "gpu" and c.expr is not None)
        )

    @property
    def model_state_bytes(self) -> int:
        """Weights + gradients + master + optimizer states on one GPU."""
        return self._total("gpu", STATE_GROUPS)

    @property
    def states_plus_gathered_bytes(self) -> int:
        """Model states plus the ZeRO-3 layers gathered in flight on one GPU (no activations):
        what must fit before a single activation is kept.

        >>> from vrammath.model.presets import load_model
        >>> est = estimate(Setup(load_model("llama-7b"), zero=3, gpus=8))
        >>> est.states_plus_gathered_bytes - est.model_state_bytes == est.component("gathered").bytes
        True
        """
        gathered = [c.bytes for c in self.components if c.key == "gathered" and c.bytes]
        return self.model_state_bytes + sum(gathered)

    @property
    def activation_bytes(self) -> int:
        """Activations, logits and loss buffers kept for backward on one GPU (the ``A`` of the
        phase peaks; the peak adds other terms, see :attr:`phases`).

        >>> from vrammath.model.presets import load_model
        >>> est = estimate(Setup(load_model("llama-7b"), seq_len=2048))
        >>> est.activation_bytes == sum(est.component(k).bytes for k in ("activations", "logits_loss"))
        True
        """
        return self._total("gpu", ("activations",))

    @property
    def gpu_bytes(self) -> int:
        """The peak per GPU, the largest phase of the iteration (what must fit)."""
        if self.phases:  # ceil(max(x)) == max(ceil(x)): no symbolic Max needed
            return max(self.phases.values())
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


def _value(expr: sympy.Expr, values: dict[sympy.Symbol, int]) -> int:
    # Shards round up: the last rank holds the padding (DeepSpeed and FSDP pad to N_d).
    # xreplace puts every number in at once (subs would simplify at each step, 10-100x slower).
    number = sympy.sympify(expr).xreplace({k: sympy.Integer(v) for k, v in values.items()})
    return int(sympy.ceiling(number))


def _values(ctx: Context) -> dict[sympy.Symbol, int]:
    setup = ctx.setup
    values: dict[sympy.Symbol, int] = {
        **state_values(setup.model),
        N_d: setup.gpus,
        b: setup.micro_batch,
        s: setup.seq_len,
        t: setup.tp,
        p: setup.pp,
        m: setup.chunks,
    }
    if (setup.tp > 1 or setup.pp > 1) and not setup.korthikanti_moe:
        values[P] = rank_param_count(setup.model, setup.tp, setup.pp)
    if setup.lora_rank is not None:
        values[r] = setup.lora_rank
    if setup.model.experts is not None:
        values |= expert_values(setup.model, setup.ep)
    if setup.korthikanti_moe:  # the busiest pipeline rank of vrammath.terms.moe.layout
        values |= ctx.moe_values
    if setup.engine in RANKED_ENGINES:
        values[P_r] = counted_rank(setup)[1]
    return values


def _offloaded(setup: Setup, term: Term) -> bool:
    if term.offload == "params":
        return setup.offload_params
    return term.offload == "optimizer" and setup.offload_optimizer


def _built(term: Term, ctx: Context) -> sympy.Expr | None:
    """The row on one rank, or None where it does not exist (a CPU row needs its offload)."""
    offloaded = _offloaded(ctx.setup, term)
    if term.device == "cpu" and not offloaded:
        return None
    expr = term.builder(ctx)
    if expr is None:
        return None
    setup = ctx.setup
    dim0 = own_share(setup, term)  # the rank's own tensors (vrammath.compose.engines)
    if dim0 is None and setup.shard == "dim0" and setup.tp == 1 and setup.pp == 1:
        dim0 = dim0_shard_params(setup.model)
    replica = ep_replica_params() if setup.ep > 1 else None
    zero = sharded_stage(setup, term)
    out = per_rank(term, expr, zero=zero, offloaded=offloaded, dim0=dim0, replica=replica)
    copies = stage_copies(setup) if setup.korthikanti_moe else 1
    # DualPipe: the 2 N_d ranks holding a stage shard its states together
    return out.xreplace({N_d: copies * N_d}) if copies > 1 else out


def _groups(built: list[tuple[Term, sympy.Expr]]) -> Groups:
    def total(group: Group, *, backward_only: bool = False) -> sympy.Expr:
        return sympy.Add(
            *(
                e
                for term, e in built
                if term.device == "gpu"
                and term.group == group
                and (term.live == "backward") == backward_only
                and term.key not in PHASE_ROWS
            )
        )

    weights, optimizer, gradients, activations, temporaries, in_flight, outputs = (
        total(g) for g in GROUPS
    )
    reduce = total("in-flight", backward_only=True)

    def phase_rows(field: str) -> sympy.Expr:
        keys = [k for k, f in PHASE_ROWS.items() if f == field]
        return sympy.Add(*(e for term, e in built if term.key in keys))

    return Groups(
        weights,
        optimizer,
        gradients,
        activations,
        temporaries,
        in_flight,
        reduce,
        outputs,
        *(
            phase_rows(f)
            for f in (
                "bucket",
                "flush",
                "epilogue",
                "forward",
                "unshard",
                "held",
                "held_backward",
                "bottom",
            )
        ),
    )


def check_modelled(setup: Setup) -> None:
    """Refuse what the composition does not describe yet, naming what is missing: what
    :func:`estimate` checks before it composes (a plan skips the variants it refuses)."""

    spec = setup.model
    check_engine(setup)
    if setup.korthikanti_moe:
        _check_korthikanti_moe(setup)
        return
    if spec.latent is not None and setup.zero == 3:
        raise InputError(
            "zero",
            "3: ZeRO-3 of deepseek_v3 is not modelled (FSDP2 units holding its fp32 routers "
            "beside bf16 weights); use --zero 0, 1 or 2",
            got=setup.zero,
        )
    lat = spec.latent
    if lat is not None and setup.device == "cpu" and lat.v_dim != lat.nope_dim + lat.rope_dim:
        raise InputError(
            "device",
            "cpu: with v_head_dim != qk_head_dim SDPA runs PyTorch's fp32 math kernel on a CPU, "
            "whose score-sized transients the phase peaks do not model; use cuda",
            got=setup.device,
        )
    if spec.experts is None:
        return
    # mixture of experts: the HF grouped-matmul block, derived and measured in bf16 with SDPA
    if setup.tp > 1 or setup.pp > 1:
        raise InputError(
            "tp/pp",
            "tensor and pipeline parallelism of mixture-of-experts models are not modelled "
            "(expert tensor parallelism, MoE pipeline stages); use --ep with --zero",
            got=(setup.tp, setup.pp),
        )
    if setup.activation_formula != "hf":
        raise InputError(
            "activation_model",
            "mixture-of-experts activations are HF-exact only (Korthikanti et al.'s formula has "
            "no experts); use hf or auto with recompute none or full",
            got=setup.activation_model,
        )
    if setup.lora_rank is not None:
        check_estimated_targets(spec, setup.lora_targets)
    if PRECISION_OF[setup.recipe] != "bf16":
        raise InputError(
            "recipe",
            "mixture-of-experts training is derived for a bf16 forward only (bf16-pure, "
            "bf16-mixed, bf16-megatron: transformers' grouped matmul takes bf16 inputs, so fp32, "
            "fp16 and autocast cannot be counted in fake mode)",
            got=setup.recipe,
        )
    if setup.attention != "sdpa":
        raise InputError(
            "attention",
            "mixture-of-experts phase peaks are derived for sdpa only",
            got=setup.attention,
        )


def _check_korthikanti_moe(setup: Setup) -> None:
    """Refuse what the Korthikanti-style mixture-of-experts path does not describe yet."""

    if setup.tp > 1:
        raise InputError(
            "tp",
            "tensor parallelism of Korthikanti-style mixture-of-experts / latent-attention "
            "stages is not composed yet (vrammath.terms.moe.layout divides MLA's down projections, "
            "which Megatron-Core replicates); use --tp 1 with --pp and --ep",
            got=setup.tp,
        )
    if setup.recompute == "full":
        raise InputError(
            "recompute",
            "full: the recomputed MoE layer's transient is not in the Korthikanti phase peaks; "
            "use none or selective (the same here: the policies assume a flash kernel)",
            got=setup.recompute,
        )
    if setup.attention != "sdpa":
        raise InputError(
            "attention",
            "the Korthikanti-style mixture-of-experts policies assume a flash kernel (no "
            "score-sized tensors); use sdpa",
            got=setup.attention,
        )
    if PRECISION_OF[setup.recipe] not in ("bf16", "fp16"):
        raise InputError(
            "recipe",
            "the Korthikanti-style mixture-of-experts policies keep 16-bit (or FP8) "
            "activations; use a bf16 or fp16 recipe (deepseek-v3-fp8, bf16-megatron, ...)",
            got=setup.recipe,
        )
    if setup.lora_rank is not None:
        raise InputError(
            "lora_rank",
            "LoRA on the Korthikanti-style mixture-of-experts path is not modelled (the HF-exact "
            "path estimates it: --activations hf)",
            got=setup.lora_rank,
        )


def estimate(setup: Setup, *, terms: tuple[Term, ...] = TERMS) -> Estimate:
    """Evaluate every memory component of ``setup`` for one GPU (and its host, when offloading),
    and the peak of each phase of a training iteration.

    Explanation
    ===========

    The one composition of vrammath: each row of ``terms`` (:data:`vrammath.compose.table.TERMS`) is
    built for the setup, divided over ``N_d`` from the row's ZeRO stage, moved to the host by
    its offload, and evaluated; the rows are summed by phase group
    (:class:`vrammath.compose.peak.Groups`), and the phase model -- HF-exact
    (:func:`vrammath.compose.peak.hf_phase_peaks`) or Korthikanti et al.'s
    (:func:`vrammath.compose.peak.korthikanti_phase_peaks`) -- gives the peak of each phase.

    With ``tp`` or ``pp`` above 1, ``P`` stands for the parameters of the fullest
    tensor/pipeline rank (:func:`vrammath.model.params.rank_param_count`) and the activations are
    Korthikanti et al.'s first pipeline stage. A mixture-of-experts or latent-attention model
    under Korthikanti-style activations (``Setup.korthikanti_moe``) takes the busiest rank of
    its layout instead (:mod:`vrammath.compose.moe_stage`: ``P``, ``P_e`` of that rank; under DualPipe
    a sharded row is divided over ``2 N_d``) and the layers of :mod:`vrammath.terms.korthikanti.layout`
    (capacity factor, imbalance, activation policy); its gradients stay resident beside the
    activations.

    Parameters
    ==========

    setup : Setup
    terms : tuple of vrammath.compose.rows.Term
        The table to compose (see "How to add a term" in :mod:`vrammath.compose.table`).
    """
    warn_context(setup.model.name, setup.model.past_context("seq_len", setup.seq_len))
    composed = _composed(setup, terms)
    # the micro-batch and the sequence are numbers only: their change re-substitutes
    values = {**composed.values, b: setup.micro_batch, s: setup.seq_len}
    comps = tuple(
        Component(key, label, device, expr, _value(expr, values), note, group)
        for key, label, device, expr, note, group in composed.rows
    )
    return Estimate(setup, comps, values, dict(composed.phases))


def _structure(setup: Setup) -> tuple[object, ...]:
    """Every field of ``setup`` but the micro-batch and the sequence length: no row, label, note
    or phase rule reads those two (``tests/test_estimate_cache.py``), they enter as ``b`` and
    ``s`` only."""
    return tuple(
        getattr(setup, f.name) for f in fields(setup) if f.name not in ("micro_batch", "seq_len")
    )


@dataclass(frozen=True)
class _Composed:
    rows: tuple[tuple[str, str, str, sympy.Expr, str, str], ...]
    values: dict[sympy.Symbol, int]
    phases: dict[str, sympy.Expr]


_COMPOSED: dict[tuple[object, ...], _Composed] = {}
_COMPOSED_MAX = 256


def _composed(setup: Setup, terms: tuple[Term, ...]) -> _Composed:
    """The rows of ``setup`` built, labelled and grouped, and its phase model, kept per structure
    (:func:`_structure`): a setup that differs in ``b`` or ``s`` only reuses them."""
    key = (_structure(setup), terms)
    found = _COMPOSED.get(key)
    if found is None:
        if len(_COMPOSED) >= _COMPOSED_MAX:
            _COMPOSED.clear()
        found = _COMPOSED[key] = _compose(setup, terms)
    return found


def _check_table(setup: Setup, terms: tuple[Term, ...]) -> None:
    """Refuse a table with two rows of one key (an estimate names its components by key) and an
    opt-in row the table does not have, naming those it has."""
    keys = [t.key for t in terms]
    for key in keys:
        if keys.count(key) > 1:
            raise InputError("terms", "must hold one row per key", got=key)
    opt_in = [t.key for t in terms if t.opt_in]
    for key in setup.extra_terms:
        if key not in opt_in:
            allowed = ", ".join(opt_in) if opt_in else "none in this table"
            raise InputError("extra_terms", f"must name opt-in rows of the table ({allowed})", key)


def _compose(setup: Setup, terms: tuple[Term, ...]) -> _Composed:
    check_modelled(setup)
    _check_table(setup, terms)
    ctx = Context(setup)
    built: list[tuple[Term, sympy.Expr]] = []
    rows: list[tuple[str, str, str, sympy.Expr, str, str]] = []
    for term in terms:
        if term.opt_in and term.key not in setup.extra_terms:
            continue
        expr = _built(term, ctx)
        if expr is None:
            continue
        built.append((term, expr))
        if term.listed:
            label, note = text(term.label, ctx), text(term.note, ctx)
            rows.append((term.key, label, term.device, expr, note, term.group))
    groups = _groups(built)
    if setup.activation_formula == "korthikanti":
        # Megatron-Core's persistent fp32 gradient buffer, into which the micro-batches of a
        # pipeline accumulate, is kept beside the activations on the MoE path
        phases = korthikanti_phase_peaks(
            groups, iteration=ctx.iteration, gradients_resident=setup.korthikanti_moe
        )
    else:
        phases = hf_phase_peaks(
            setup.model,
            groups,
            precision=ctx.precision,
            attention=ctx.attention,
            recompute=ctx.hf_recompute,
            grad_bytes=ctx.recipe.gradients,
            iteration=ctx.iteration,
            device=ctx.device,
            activation_terms=ctx.hf_activation_terms,
        )
    values = {k: v for k, v in _values(ctx).items() if k not in (b, s)}
    return _Composed(tuple(rows), values, {k: phases[k] for k in PHASES})


__all__ = [
    "PHASES",
    "Component",
    "Estimate",
    "check_modelled",
    "estimate",
]
