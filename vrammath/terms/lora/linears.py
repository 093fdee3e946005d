"""What each LoRA target adapts in a given model: the linear layers and expert parameters, their
shapes, and which targets a model allows (the names are :mod:`vrammath.terms.lora.targets`).

Explanation
===========

In transformers 5 the routed experts of every MoE layer are two 3-D parameters on the experts
module, ``gate_up_proj`` (E, 2 I_e, h) and ``down_proj`` (E, h, I_e), and the router is a custom
module holding a ``weight`` (E, h): neither is an ``nn.Linear``. peft 0.21.2 adapts them through
``target_parameters`` (its ``ParamWrapper``): a 3-D parameter of E experts gets ``lora_A`` of
(E r, in) and ``lora_B`` of (out, E r), i.e. ``E r (in + out)`` trainable parameters, one LoRA
per expert. What the familiar names adapt depends on the model type, because peft rewrites them
for the models whose layout changed from transformers 4 to 5 (``mixtral``, ``qwen3_moe``,
``deepseek_v3``; ``qwen2_moe`` is left as is):

* on those three, ``gate`` + ``up`` (Mixtral's v4 ``w1`` + ``w3``) become the experts'
  ``gate_up_proj`` at rank ``2 r`` (the two fused LoRAs side by side; naming one without the
  other is refused, as peft refuses it), ``down`` (``w2``) the experts' ``down_proj`` at rank
  ``r``; DeepSeek-V3's dense-layer MLPs and its shared experts are then not adapted at all, since
  their ``gate_proj``/``up_proj``/``down_proj`` names are taken over;
* on ``qwen2_moe``, ``gate``, ``up``, ``down`` adapt the shared expert's ``nn.Linear`` layers
  (and a dense layer's MLP), not the routed experts;
* ``router`` is the ``gate`` module everywhere (a ``target_parameters`` entry ``gate.weight`` on
  ``qwen2_moe``, where peft refuses the module name);
* ``experts`` is ``target_parameters=["experts.gate_up_proj", "experts.down_proj"]``: rank ``r``
  on both;
* ``all-linear`` is peft's own: every ``nn.Linear`` but the head, plus, on the three rewritten
  types, the router and the experts (``gate_up_proj`` at ``2 r``).

On latent attention the ``attention`` group adapts the five MLA projections; ``q`` exists only
without a ``q_lora_rank``, ``k`` and ``v`` not at all.

Examples
========

>>> from vrammath.model.presets import load_model
>>> [(m.target, m.rank_factor) for m in adapted_linears(load_model("mixtral-8x7b"), "all-linear")]
[('q', 1), ('k', 1), ('v', 1), ('o', 1), ('gate_up', 2), ('down', 1), ('router', 1)]
>>> [m.target for m in adapted_linears(load_model("deepseek-v3"), "attention")]
['q_a', 'q_b', 'kv_a', 'kv_b', 'o']

References
==========

.. [1] peft 0.21.2 ``tuners/lora/layer.py`` (``ParamWrapper``: ``lora_A = Linear(in, r *
   num_experts)``, ``lora_B = Linear(r * num_experts, out)``) and
   ``utils/transformers_weight_conversion.py`` (``_MOE_TARGET_MODULE_MAPPING``: the renamed
   targets; ``rank_pattern`` ``2 r`` on the fused ``gate_up_proj``).
.. [2] transformers 5.24 ``models/mixtral/modeling_mixtral.py`` (``MixtralExperts``: 3-D
   ``gate_up_proj``/``down_proj``; ``MixtralTopKRouter``: a ``weight`` parameter) and
   ``conversion_mapping.py`` (``qwen3_moe`` and ``deepseek_v3`` share ``qwen2_moe``'s pattern).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sympy

from vrammath.model.params import Tensor, tensors
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError
from vrammath.notation.symbols import E, I, I_e, I_s, L, L_e, a, a_kv, d, h, r
from vrammath.terms.lora.targets import (
    FUSED_MODULES,
    HF_MODULES,
    MODULE_NAMES,
    MOE_TARGETS,
    TARGET_GROUPS,
    lora_targets,
)

_ONE = sympy.Integer(1)
_NEOX_MODULES = {
    "qkv": "attention.query_key_value",
    "o": "attention.dense",
    "up": "mlp.dense_h_to_4h",
    "down": "mlp.dense_4h_to_h",
}
_GPT2_MODULES = {"qkv": "attn.c_attn", "o": "attn.c_proj", "up": "mlp.c_fc", "down": "mlp.c_proj"}


@dataclass(frozen=True)
class AdaptedLinear:
    """One adapted projection kind: its target name, HF module, sizes and multiplicity.

    ``experts`` is E for a 3-D expert parameter (one LoRA per expert, stacked), else 1;
    ``rank_factor`` is 2 where peft doubles the rank (the fused ``gate_up_proj`` reached by the
    names gate and up). ``peft_field`` and ``peft_names`` say how peft is told to adapt it
    (``target_modules`` or ``target_parameters``).
    """

    target: str
    module: str
    in_features: sympy.Expr
    out_features: sympy.Expr
    count: sympy.Expr
    experts: sympy.Expr = _ONE
    rank_factor: int = 1
    peft_field: str = "target_modules"
    peft_names: tuple[str, ...] = ()

    @property
    def inner(self) -> sympy.Expr:
        """Inner width of the adapter, ``rank_factor * experts * r``."""
        return self.rank_factor * self.experts * r

    @property
    def lora_a(self) -> Tensor:
        """``lora_A.weight``: (inner, in)."""
        return Tensor(
            f"{self.module}.lora_A.weight", (self.inner, self.in_features), self.count, "adapter"
        )

    @property
    def lora_b(self) -> Tensor:
        """``lora_B.weight``: (out, inner)."""
        return Tensor(
            f"{self.module}.lora_B.weight", (self.out_features, self.inner), self.count, "adapter"
        )

    @property
    def params(self) -> sympy.Expr:
        """Trainable parameters of one such module, inner (in + out)."""
        return self.inner * (self.in_features + self.out_features)

    @property
    def wraps_parameter(self) -> bool:
        """peft adapts a parameter here (``ParamWrapper``), not an ``nn.Linear``."""
        return self.target in ("router", "experts") or self.experts != 1


_SHAPES: dict[str, tuple[sympy.Expr, sympy.Expr]] = {
    "q": (h, a * d),
    "k": (h, a_kv * d),
    "v": (h, a_kv * d),
    "qkv": (h, (a + 2 * a_kv) * d),
    "o": (a * d, h),
    "gate": (h, I),
    "up": (h, I),
    "gate_up": (h, 2 * I),
    "down": (I, h),
}


def _linear(
    target: str, module: str, fan_in: sympy.Expr, fan_out: sympy.Expr, count: sympy.Expr
) -> AdaptedLinear:
    # peft matches target_modules as suffixes of the module paths: the path tells GPT-2's
    # attn.c_proj from its mlp.c_proj
    return AdaptedLinear(target, module, fan_in, fan_out, count, peft_names=(module,))


def target_modules(spec: ModelSpec) -> dict[str, str]:
    """The targets ``spec`` has, each with its transformers module, in :data:`ALL_TARGETS` order.

    LLaMA-style layers have q, k, v, o, gate, up, down; Phi-3 fuses ``qkv_proj`` and
    ``gate_up_proj``; StarCoder2's plain MLP is ``c_fc`` (up) and ``c_proj`` (down); GPT-2's
    block is ``c_attn`` (q, k and v in one Conv1D), ``attn.c_proj``, ``mlp.c_fc``,
    ``mlp.c_proj``; GPT-NeoX's ``query_key_value``, ``dense``, ``dense_h_to_4h``,
    ``dense_4h_to_h``. (Mixture-of-experts and latent-attention models resolve their targets
    in :func:`adapted_linears`.)

    >>> from vrammath.model.presets import load_model
    >>> target_modules(load_model("gpt-neox-20b"))["qkv"]
    'attention.query_key_value'
    >>> list(target_modules(load_model("phi-3-mini")))
    ['qkv', 'o', 'gate_up', 'down']
    """
    if spec.attention.fused_qkv:
        return dict(_GPT2_MODULES if spec.embeddings.learned_positions else _NEOX_MODULES)
    if spec.attention.fused_qkv_linear:
        out = {"qkv": FUSED_MODULES["qkv"], "o": HF_MODULES["o"]}
    else:
        out = {t: HF_MODULES[t] for t in ("q", "k", "v", "o")}
    if not spec.mlp.gated:
        out.update({"up": "mlp.c_fc", "down": "mlp.c_proj"})
    elif spec.mlp.fused_gate_up:
        out.update({"gate_up": FUSED_MODULES["gate_up"], "down": HF_MODULES["down"]})
    else:
        out.update({t: HF_MODULES[t] for t in ("gate", "up", "down")})
    return out


def default_targets_refusal(spec: ModelSpec, *, training: bool = False) -> InputError:
    """The refusal when the user named no adapter targets and the default ``q,v`` is not a
    projection of the model: it names the default, not a value the user never typed, and the
    targets that work (for a ``training`` estimate: those it estimates).

    >>> from vrammath.model.presets import load_model
    >>> print(default_targets_refusal(load_model("gpt2")))  # doctest: +ELLIPSIS
    lora_targets: q,v (the default) are not projections of gpt2; pass --lora-targets with one of ...
    """
    return InputError(
        "lora_targets",
        f"q,v (the default) are not projections of {spec.model_type}; pass "
        "--lora-targets with one of "
        + ", ".join(estimated_targets(spec) if training else allowed_targets(spec)),
        got="q,v",
    )


def allowed_targets(spec: ModelSpec) -> tuple[str, ...]:
    """The names :func:`adapted_linears` accepts for ``spec``: its targets, the module names
    that are not ``<target>_proj``, and the groups.

    >>> from vrammath.model.presets import load_model
    >>> allowed_targets(load_model("gpt2"))
    ('qkv', 'o', 'up', 'down', 'c_attn', 'c_proj', 'c_fc', 'all-linear', 'attention', 'mlp')
    >>> allowed_targets(load_model("mixtral-8x7b"))
    ('q', 'k', 'v', 'o', 'gate', 'up', 'down', 'router', 'experts', 'all-linear', 'attention', 'mlp')
    """
    if spec.experts is not None or spec.latent is not None:
        return (*_attention_shapes(spec)[0], *_mlp_names(spec), *TARGET_GROUPS)
    mods = target_modules(spec)
    names = [m.split(".")[-1] for m in mods.values()]
    extra = [n for t, n in zip(mods, names, strict=True) if n != f"{t}_proj"]
    return (*mods, *dict.fromkeys(extra), *TARGET_GROUPS)


def _refuse(spec: ModelSpec, name: str) -> InputError:
    allowed = ", ".join(allowed_targets(spec))
    return InputError("lora_targets", f"must be one of {allowed} for {spec.model_type}", got=name)


def _attention_shapes(
    spec: ModelSpec,
) -> tuple[dict[str, tuple[sympy.Expr, sympy.Expr]], dict[str, str]]:
    """The attention projections of a MoE or MLA model: shapes and modules by target.

    Latent attention's are its weights in :func:`vrammath.model.params.tensors`, each (out, in),
    named as the target with ``_proj`` (``kv_a``: ``_proj_with_mqa``)."""
    if spec.latent is None:
        shapes = {t: _SHAPES[t] for t in ("q", "k", "v", "o")}
        return shapes, {t: HF_MODULES[t] for t in shapes}
    modules = {
        w.name.split(".")[1].removesuffix("_with_mqa").removesuffix("_proj"): w
        for w in tensors(spec)
        if w.component == "attention"
    }
    return (
        {t: (w.shape[1], w.shape[0]) for t, w in modules.items()},
        {t: w.name.removesuffix(".weight") for t, w in modules.items()},
    )


def _attention_linears(spec: ModelSpec, names: set[str], whole: bool) -> list[AdaptedLinear]:
    """Adapted attention projections of a MoE or MLA model (every layer has them)."""
    shapes, modules = _attention_shapes(spec)
    vocabulary = (*TARGET_GROUPS["attention"], "q_a", "q_b", "kv_a", "kv_b")
    for name in sorted(names):
        if name in vocabulary and name not in shapes:
            raise _refuse(spec, name)
    wanted = set(shapes) if whole else names
    return [_linear(t, modules[t], *shapes[t], L) for t in shapes if t in wanted]


def _mlp_names(spec: ModelSpec) -> tuple[str, ...]:
    ex = spec.experts
    assert ex is not None
    dense = ex.shared_intermediate or len(ex.layers) < spec.layers
    mlp = ("gate", "up", "down") if ex.peft_v4_names is not None or dense else ()
    return (*mlp, "router", "experts", *(("shared_gate",) if ex.shared_gate else ()))


def _expert_param(
    target: str, param: str, rank_factor: int, names: tuple[str, ...], *, field: str
) -> AdaptedLinear:
    """An adapter on the experts' 3-D ``gate_up_proj`` (E, 2 I_e, h) or ``down_proj`` (E, h, I_e)."""
    fan_in, fan_out = (h, 2 * I_e) if param == "gate_up_proj" else (I_e, h)
    module = f"mlp.experts.{param}"
    return AdaptedLinear(
        target, module, fan_in, fan_out, L_e, E, rank_factor, f"target_{field}", names
    )


def _expert_linears(
    spec: ModelSpec, names: set[str], whole: bool, mlp_group: bool
) -> list[AdaptedLinear]:
    """Adapted router, experts, shared experts and dense MLPs of a MoE model, as peft does it."""
    ex = spec.experts
    assert ex is not None
    renamed = ex.peft_v4_names
    has_linear_mlp = bool(ex.shared_intermediate) or len(ex.layers) < spec.layers
    mlp = [t for t in ("gate", "up", "down") if t in names or mlp_group]
    if whole and renamed is None and not has_linear_mlp:
        mlp = []  # all-linear: no nn.Linear MLP to adapt
    got = ",".join(sorted(names)) or ("all-linear" if whole else "mlp")
    out: list[AdaptedLinear] = []
    if mlp and renamed is not None:
        if ("gate" in mlp) != ("up" in mlp):
            raise InputError(
                "lora_targets",
                f"gate and up must be named together on {spec.model_type} "
                "(peft fuses them into the experts' gate_up_proj)",
                got=got,
            )
        if "experts" in names:
            raise InputError(
                "lora_targets",
                f"experts and gate/up/down both adapt the routed experts on {spec.model_type}: "
                "name one of them",
                got=got,
            )
        if "gate" in mlp:
            out.append(_expert_param("gate_up", "gate_up_proj", 2, renamed[:2], field="modules"))
        if "down" in mlp:
            out.append(_expert_param("down", "down_proj", 1, renamed[2:], field="modules"))
    elif mlp:
        if not has_linear_mlp:
            raise _refuse(spec, ",".join(mlp))
        for t in mlp:
            if ex.shared_intermediate:
                shape = {"gate": (h, I_s), "up": (h, I_s), "down": (I_s, h)}[t]
                out.append(_linear(t, f"mlp.shared_expert.{t}_proj", *shape, L_e))
            if len(ex.layers) < spec.layers:
                out.append(_linear(t, HF_MODULES[t], *_SHAPES[t], L - L_e))
    if "router" in names or (whole and renamed is not None):
        field, name = (
            ("target_modules", "gate") if renamed else ("target_parameters", "gate.weight")
        )
        out.append(AdaptedLinear("router", "mlp.gate", h, E, L_e, _ONE, 1, field, (name,)))
    if "experts" in names:
        for param in ("gate_up_proj", "down_proj"):
            out.append(
                _expert_param("experts", param, 1, (f"experts.{param}",), field="parameters")
            )
    if "shared_gate" in names or (whole and ex.shared_gate):
        if not ex.shared_gate:
            raise _refuse(spec, "shared_gate")
        out.append(_linear("shared_gate", "mlp.shared_expert_gate", h, _ONE, L_e))
    return out


def _moe_linears(spec: ModelSpec, chosen: tuple[str, ...]) -> list[AdaptedLinear]:
    if spec.experts is None:
        raise InputError("model", "latent attention without experts is not read", got=spec.name)
    names = {n for n in chosen if n not in TARGET_GROUPS}
    for name in sorted(names):
        if name in ("qkv", "gate_up", *MODULE_NAMES) or (
            name in MOE_TARGETS[4:] and name not in _mlp_names(spec)
        ):
            raise _refuse(spec, name)
    whole = "all-linear" in chosen
    attention = _attention_linears(spec, names, whole or "attention" in chosen)
    return attention + _expert_linears(spec, names, whole, whole or "mlp" in chosen)


def adapted_linears(spec: ModelSpec, targets: str | Sequence[str]) -> list[AdaptedLinear]:
    """The projections LoRA adapts in ``spec`` for ``targets``, with symbolic in/out sizes.

    Each architecture has its own targets (:func:`target_modules`): a name it does not have is
    refused, naming the ones it has, as peft refuses a module name it cannot find. Groups take
    what the architecture has (``all-linear`` on Phi-3: qkv, o, gate_up, down). On
    mixture-of-experts and latent-attention models the names resolve as the module's
    Explanation says.

    >>> from vrammath.model.presets import load_model
    >>> [(m.target, m.out_features) for m in adapted_linears(load_model("qwen2-72b"), "k,v")]
    [('k', a_kv*d), ('v', a_kv*d)]
    >>> [(m.module, m.out_features) for m in adapted_linears(load_model("phi-3-mini"), "qkv,mlp")]
    [('self_attn.qkv_proj', d*(a + 2*a_kv)), ('mlp.gate_up_proj', 2*I), ('mlp.down_proj', h)]
    >>> adapted_linears(load_model("phi-3-mini"), "q")
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: lora_targets: must be one of qkv, o, gate_up, down, all-linear, attention, mlp for phi3 (got 'q')
    >>> [(m.module, m.params) for m in adapted_linears(load_model("qwen3-30b-a3b"), "experts")]
    [('mlp.experts.gate_up_proj', E*r*(2*I_e + h)), ('mlp.experts.down_proj', E*r*(I_e + h))]
    >>> adapted_linears(load_model("mixtral-8x7b"), "gate")
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: lora_targets: gate and up must be named together on mixtral (peft fuses them into the experts' gate_up_proj) (got 'gate')
    """
    chosen = lora_targets(targets)
    if spec.experts is not None or spec.latent is not None:
        return _moe_linears(spec, chosen)
    mods = target_modules(spec)
    found_all: set[str] = set()
    for name in chosen:
        if name in TARGET_GROUPS:
            found = [t for t in mods if t in TARGET_GROUPS[name]]
        else:
            found = [t for t, m in mods.items() if name in (t, m.split(".")[-1])]
        if not found:
            raise _refuse(spec, name)
        found_all.update(found)
    return [_linear(t, m, *_SHAPES[t], L) for t, m in mods.items() if t in found_all]


def adapter_tensors(spec: ModelSpec, targets: str | Sequence[str]) -> list[Tensor]:
    """Every adapter tensor (``lora_A`` and ``lora_B`` of each adapted module), shapes in r."""
    return [t for m in adapted_linears(spec, targets) for t in (m.lora_a, m.lora_b)]


def check_estimated_targets(spec: ModelSpec, targets: str | Sequence[str]) -> None:
    """Refuse, for a training estimate, adapters that peft puts on a parameter (the router and
    the experts), naming the targets the estimate takes.

    Their states (:func:`vrammath.terms.lora.adapters.lora_state_exprs`) and kept activations
    (:func:`vrammath.terms.lora.adapters.lora_activation_layer_expr`) are exact and measured, but the backward
    of a wrapped parameter makes the gradient of the whole merged weight, one layer's experts at
    a time, which the MoE phase peaks (:mod:`vrammath.terms.moe.peaks`) do not hold.

    >>> from vrammath.model.presets import load_model
    >>> check_estimated_targets(load_model("mixtral-8x7b"), "q,k,v,o")
    >>> check_estimated_targets(load_model("mixtral-8x7b"), "all-linear")
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: lora_targets: adapters on the router or the experts are not in the training estimate of mixtral-8x7b (their states and kept activations: vrammath.terms.lora.adapters); estimated: q, k, v, o, attention (got 'all-linear')
    """
    if not any(m.wraps_parameter for m in adapted_linears(spec, targets)):
        return
    raise InputError(
        "lora_targets",
        f"adapters on the router or the experts are not in the training estimate of {spec.name} "
        "(their states and kept activations: vrammath.terms.lora.adapters); estimated: "
        + ", ".join(estimated_targets(spec)),
        got=",".join(lora_targets(targets)),
    )


def estimated_targets(spec: ModelSpec) -> tuple[str, ...]:
    """The targets of :func:`allowed_targets` the training estimate takes (none that puts an
    adapter on a parameter: the router, the experts).

    >>> from vrammath.model.presets import load_model
    >>> "experts" in estimated_targets(load_model("mixtral-8x7b"))
    False
    """
    allowed = []
    for name in allowed_targets(spec):
        try:
            chosen = adapted_linears(spec, name)
        except InputError:
            continue
        if not any(m.wraps_parameter for m in chosen):
            allowed.append(name)
    return tuple(allowed)


__all__ = [
    "AdaptedLinear",
    "adapted_linears",
    "adapter_tensors",
    "allowed_targets",
    "check_estimated_targets",
    "default_targets_refusal",
    "estimated_targets",
    "target_modules",
]
