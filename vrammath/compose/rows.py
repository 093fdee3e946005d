"""The row type of the table of memory terms and the context its builders read.

A row (:class:`Term`) of :data:`vrammath.compose.table.TERMS` names a builder, a function of a
:class:`Context` (the setup, its choices narrowed to the formulas' types); :func:`per_rank`
divides a row's whole-model bytes over the ranks by its columns. The phase groups
(:data:`GROUPS`) are the totals the phase models of :mod:`vrammath.compose.peak` take.

Examples
========

>>> from vrammath.model.presets import load_model
>>> from vrammath.compose.setup import Setup
>>> Context(Setup(load_model("gpt2"))).precision
'bf16'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import sympy

from vrammath.compose.moe_stage import busiest_rank, rank_values, setup_layout
from vrammath.compose.peak import Iteration
from vrammath.compose.setup import PRECISION_OF, Setup
from vrammath.model.params import tensors
from vrammath.model.spec import ModelSpec
from vrammath.notation.symbols import N_d, P
from vrammath.terms.activations.model import activation_components, hf_activation_terms
from vrammath.terms.activations.parts import Attention, HfRecompute, Precision
from vrammath.terms.korthikanti.layout import POLICIES, layout_activation_exprs
from vrammath.terms.korthikanti.moe import ratio
from vrammath.terms.lora.adapters import lora_state_exprs
from vrammath.terms.lora.quant import frozen_base_exprs
from vrammath.terms.moe.layout import RankParams, state_widths
from vrammath.terms.parallel import FSDP2_ENGINES
from vrammath.terms.states import Recipe, model_state_exprs, recipe

Device = Literal["gpu", "cpu"]
Group = Literal[
    "weights", "optimizer", "gradients", "activations", "temporaries", "in-flight", "outputs"
]
Live = Literal["resident", "forward", "forward+backward", "backward", "backward+step", "step"]
Offload = Literal["params", "optimizer"]
ShardGroup = Literal["dp", "dp+edp"]

#: The phase groups, in the order the phase models take them (:class:`vrammath.compose.peak.Groups`).
GROUPS: tuple[Group, ...] = (
    "weights",
    "optimizer",
    "gradients",
    "activations",
    "temporaries",
    "in-flight",
    "outputs",
)
#: The groups that are model states (what ``Estimate.model_state_bytes`` sums).
STATE_GROUPS: tuple[Group, ...] = ("weights", "optimizer", "gradients")

#: CPU Adam keeps an fp32 copy of its gradient partition (ZeRO-Offload).
CPU_ADAM_GRAD_BYTES = 4


def state_recipe(setup: Setup) -> str:
    """The recipe whose bytes per element the model states take: ``setup.recipe``, except under
    ``--engine fsdp2``, where ``bf16-mixed`` is ``MixedPrecisionPolicy(param_dtype=bf16,
    reduce_dtype=fp32)`` over an fp32 model: one fp32 shard that is both the weights and the
    master, fp32 gradient shards (``autocast-bf16``'s 4/4/0/8 split), bf16 compute."""
    if setup.engine in FSDP2_ENGINES and setup.recipe == "bf16-mixed":
        return "autocast-bf16"
    return setup.recipe


@dataclass(frozen=True)
class Context:
    """What a builder reads: the setup, and its choices narrowed to the formulas' types."""

    setup: Setup

    @property
    def precision(self) -> Precision:
        """The dtype the forward runs in (``vrammath.compose.setup.PRECISION_OF`` of the recipe)."""
        return PRECISION_OF[self.setup.recipe]

    @property
    def attention(self) -> Attention:
        """The attention kernel."""
        return self.setup.attention

    @property
    def hf_recompute(self) -> HfRecompute:
        """Recomputation as transformers runs it (full checkpointing or none)."""
        return "full" if self.setup.recompute == "full" else "none"

    @property
    def device(self) -> Literal["cuda", "cpu"]:
        """Where the kernels run."""
        return self.setup.device

    @property
    def iteration(self) -> Iteration:
        """Steady state or the first iteration."""
        return self.setup.iteration

    @property
    def recipe(self) -> Recipe:
        """The precision recipe of the model states (:func:`state_recipe`)."""
        return recipe(state_recipe(self.setup))

    @property
    def lora(self) -> bool:
        """Whether the base is frozen and LoRA adapters train."""
        return self.setup.lora_rank is not None

    @cached_property
    def model_states(self) -> dict[str, sympy.Expr]:
        """The whole model's states (:func:`vrammath.terms.states.model_state_exprs`); on the
        Korthikanti-style mixture-of-experts path a layout's, every parameter at the recipe's
        width (:func:`vrammath.terms.moe.layout.state_widths`)."""
        s = self.setup
        if s.korthikanti_moe:
            widths = state_widths(self.recipe, s.optimizer)
            return {k: w * P for k, w in widths.items()}
        return model_state_exprs(s.model, state_recipe(s), s.optimizer)

    @cached_property
    def frozen_base(self) -> dict[str, sympy.Expr]:
        """The frozen base under LoRA (:func:`vrammath.terms.lora.quant.frozen_base_exprs`)."""
        quant = self.setup.quant
        return frozen_base_exprs(self.setup.model, quant, self.base_bytes)

    @property
    def base_bytes(self) -> int:
        """Bytes per element of the frozen base's unquantized parts."""
        return 2 if self.setup.quant is not None else self.recipe.weights

    @cached_property
    def adapter_states(self) -> dict[str, sympy.Expr]:
        """The adapters' states, fp32 as peft makes them (:func:`vrammath.terms.lora.adapters.lora_state_exprs`)."""
        s = self.setup
        assert s.lora_rank is not None
        return lora_state_exprs(
            s.model, s.lora_rank, s.lora_targets, s.recipe, s.optimizer, adapter_dtype="fp32"
        )

    @cached_property
    def hf_activation_terms(self) -> dict[str, sympy.Expr]:
        """HF-exact activations by part (:func:`vrammath.terms.activations.model.hf_activation_terms`),
        read by the activation row and by the phase model alike."""
        return hf_activation_terms(
            self.setup.model,
            self.attention,
            self.precision,
            self.hf_recompute,
            device=self.device,
        )

    @cached_property
    def hf_activations(self) -> dict[str, sympy.Expr]:
        """HF-exact activations and logits/loss, the two components of :attr:`hf_activation_terms`."""
        return activation_components(self.hf_activation_terms)

    @cached_property
    def moe_rank(self) -> RankParams:
        """The busiest pipeline rank of a Korthikanti-style mixture-of-experts or latent-attention
        setup (:func:`vrammath.compose.moe_stage.busiest_rank`)."""
        return busiest_rank(self.setup)

    @cached_property
    def moe_values(self) -> dict[sympy.Symbol, int]:
        """``P``, ``P_e``, ``n_ep``, ``N_d`` of that rank
        (:func:`vrammath.compose.moe_stage.rank_values`)."""
        return rank_values(self.setup, self.moe_rank)

    @cached_property
    def moe_activations(self) -> dict[str, sympy.Expr]:
        """That rank's activations, ``layers`` and (when it holds the last stage) ``head``
        (:func:`vrammath.terms.korthikanti.layout.layout_activation_exprs`; capacity buffers padded)."""
        s = self.setup
        layout = setup_layout(s)
        return layout_activation_exprs(
            s.model,
            layout,
            POLICIES[s.policy],
            capacity_factor=None
            if s.capacity_factor is None
            else ratio("capacity_factor", s.capacity_factor, 0),
            imbalance=ratio("imbalance", s.imbalance, 1),
            head_on_rank=layout.pp - 1 in self.moe_rank.stages,
        )


Builder = Callable[[Context], sympy.Expr | None]
Text = str | Callable[[Context], str]


@dataclass(frozen=True, kw_only=True)
class Term:
    """One memory term: a row of :data:`vrammath.compose.table.TERMS`.

    Parameters
    ==========

    key : str
        Stable name (the component's key in an estimate and in JSON).
    label, note : str or callable
        What the table prints (text, or a function of the :class:`Context`).
    device : str
        ``"gpu"`` or ``"cpu"``.
    builder : callable
        A function of the :class:`Context` returning the whole-model (unsharded) bytes as a
        sympy expression, or ``None`` where the term does not exist.
    group : one of :data:`GROUPS`
        Which total of :class:`vrammath.compose.peak.Groups` the term enters.
    live : str
        ``"resident"``, ``"forward"``, ``"forward+backward"``, ``"backward"``, ``"backward+step"`` or ``"step"``:
        when the term is alive in an iteration (documentation of the group's place in the
        phase models, and of the rows that share a group but not a time, as ``reduce_buffer``).
    sharded_from : int or None
        The ZeRO stage from which the term is divided over ``N_d`` (None: never).
    offload : str or None
        ``"params"`` or ``"optimizer"``: a GPU term this offload moves to the host (it is 0 on the GPU once both offloaded and
        sharded); a CPU term exists only under it.
    listed : bool
        Whether the estimate lists it as a component (False: a phase transient only).
    shard_group : str
        The ranks the row is spread over. ``"dp"``: the data-parallel group of ``N_d`` ranks
        (from ``sharded_from``). ``"dp+edp"`` (a state proportional to ``P`` of a
        mixture-of-experts model): the dense part over that group too, the routed experts
        first split over the ``n_ep`` expert-parallel ranks and, once sharded, over their
        expert-data-parallel group of ``N_d / n_ep`` ranks (:mod:`vrammath.terms.moe.params`).
    opt_in : bool
        A row only the setups that name its key in ``Setup.extra_terms`` have (the CLI's
        ``--with KEY``): a term some runs add and most do not, off by default.
    """

    key: str
    label: Text
    device: Device
    builder: Builder
    group: Group
    live: Live
    sharded_from: int | None = None
    offload: Offload | None = None
    note: Text = ""
    listed: bool = True
    shard_group: ShardGroup = "dp"
    opt_in: bool = False


def per_rank(
    term: Term,
    expr: sympy.Expr,
    *,
    zero: int,
    offloaded: bool,
    dim0: sympy.Expr | None = None,
    replica: sympy.Expr | None = None,
) -> sympy.Expr:
    """A row's whole-model ``expr`` on one rank: divided over ``N_d`` from the row's ZeRO stage,
    and 0 on the GPU when its offload is on and it is sharded (each rank's shard streams to the
    host, which keeps it: the row's CPU twin).

    ``dim0`` is the parameter count of the rank where the engine does not cut ``P`` into
    ``N_d`` equal parts: the fullest rank when each tensor is sharded on its dim 0 (FSDP2,
    :func:`dim0_shard_params`), or the whole tensors a rank owns (``P_r``,
    ``ZeroRedundancyOptimizer``); a row proportional to ``P`` then holds that many parameters'
    bytes instead of ``1/N_d`` of them. ``replica`` is what one rank holds of ``P``
    where ZeRO does not shard a ``"dp+edp"`` row under expert parallelism
    (:func:`vrammath.terms.moe.params.ep_replica_params`; sharded, the groups come to ``P / N_d``).

    >>> from vrammath.compose.table import TERMS_BY_KEY
    >>> per_rank(TERMS_BY_KEY["gradients"], 2 * P, zero=2, offloaded=False)
    2*P/N_d
    >>> per_rank(TERMS_BY_KEY["gradients"], 2 * P, zero=1, offloaded=True)
    2*P
    >>> per_rank(TERMS_BY_KEY["gradients"], 2 * P, zero=2, offloaded=True)
    0
    >>> per_rank(TERMS_BY_KEY["gradients"], 2 * P, zero=3, offloaded=False, dim0=sympy.Symbol("Q"))
    2*Q
    >>> from vrammath.terms.moe.params import ep_replica_params
    >>> per_rank(TERMS_BY_KEY["gradients"], 2 * P, zero=1, offloaded=False, replica=ep_replica_params())
    2*P - 2*P_e + 2*P_e/n_ep
    """
    sharded = term.sharded_from is not None and zero >= term.sharded_from
    if not sharded and replica is not None and term.shard_group == "dp+edp":
        expr = sympy.expand(expr.xreplace({P: replica}))
    if sharded:
        per_param = expr / P  # a number when the row is proportional to P
        expr = per_param * dim0 if dim0 is not None and not per_param.free_symbols else expr / N_d
    if term.device == "gpu" and sharded and offloaded:
        return sympy.Integer(0)
    return expr


def dim0_shard_params(spec: ModelSpec) -> sympy.Expr:
    """Parameters on the fullest rank when every tensor is sharded on its dim 0, as FSDP2's
    ``fully_shard`` does: ``ceil(dim0 / N_d)`` rows per rank, rank 0 the fullest (the padding
    is on the last ranks).

    >>> from vrammath.model.presets import load_model
    >>> from vrammath.terms.states import state_values
    >>> spec = load_model("llama-7b")
    >>> values = {**state_values(spec), N_d: 7}
    >>> int(dim0_shard_params(spec).subs(values)) - int(sympy.ceiling(P.subs(values) / 7))
    868407
    """
    return sympy.Add(
        *(t.count * sympy.ceiling(t.shape[0] / N_d) * t.numel / t.shape[0] for t in tensors(spec))
    )


def text(value: Text, ctx: Context) -> str:
    """A label or note, evaluated for ``ctx``."""
    return value if isinstance(value, str) else value(ctx)


__all__ = [
    "CPU_ADAM_GRAD_BYTES",
    "GROUPS",
    "STATE_GROUPS",
    "Context",
    "Device",
    "Group",
    "Live",
    "Offload",
    "ShardGroup",
    "Term",
    "dim0_shard_params",
    "per_rank",
    "state_recipe",
    "text",
]
