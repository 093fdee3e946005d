"""LoRA: trainable low-rank adapters on a frozen (optionally quantized) base, and their terms.

LoRA (Hu et al. 2021) freezes every weight ``W`` (out x in) of the adapted linear layers and trains
``B A`` beside it, with ``A`` (r x in) and ``B`` (out x r): ``r (in + out)`` trainable parameters per
adapted matrix. The frozen base keeps its weights in their own dtype and has no gradients, no
master copy and no optimizer states; only the adapters do. QLoRA (Dettmers et al. 2023) stores the
frozen linear weights in NF4 (:mod:`vrammath.quant`) and pages the optimizer states to the CPU
under memory pressure; :func:`lora_terms` composes both into the terms of one fine-tuning setup.

Adapter targets are named by what they adapt: ``q``, ``k``, ``v``, ``o`` (attention projections,
k and v GQA-shaped ``a_kv d``), ``gate``, ``up``, ``down`` (MLP), and ``qkv``, ``gate_up`` where an
architecture fuses them into one module (Phi-3, GPT-2's ``c_attn``, GPT-NeoX's
``query_key_value``): each architecture has its own (:func:`target_modules`), as peft adapts the
modules the model has.

Examples
========

>>> from vrammath.presets import load_model
>>> spec = load_model("llama-7b")
>>> lora_param_expr(spec, ("q", "v"))
L*r*(a*d + a_kv*d + 2*h)
>>> lora_param_count(spec, 8, ("q", "v")), lora_param_count(spec, 16, "all-linear")
(4194304, 39976960)

References
==========

.. [1] Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", arXiv:2106.09685,
   section 4.2 (GPT-3 175B: 1.2 TB -> 350 GB of training VRAM with r = 4 on q and v).
.. [2] Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs", arXiv:2305.14314,
   section 3 (NF4, double quantization, paged optimizers).
.. [3] peft ``tuners/lora/layer.py`` (``Linear.forward``: ``lora_B(lora_A(dropout(x))) * scaling``
   with ``x`` cast to the adapter dtype; adapters upcast to fp32 by ``autocast_adapter_dtype``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sympy

from vrammath.errors import InputError, one_of
from vrammath.model import ModelSpec
from vrammath.params import Tensor, param_count, size_values
from vrammath.quant import dequant_buffer_expr, frozen_base_exprs
from vrammath.states import IMPLEMENTATIONS, recipe, tensor_optimizer_expr
from vrammath.symbols import I, L, P, a, a_kv, b, d, h, r, s

LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
"""The LLaMA-style targets (separate projections); the full vocabulary is :data:`ALL_TARGETS`."""
ALL_TARGETS = ("q", "k", "v", "qkv", "o", "gate", "up", "gate_up", "down")
"""Every logical target: ``qkv`` and ``gate_up`` are the fused projections (Phi-3's
``qkv_proj`` and ``gate_up_proj``, GPT-2's ``c_attn``, GPT-NeoX's ``query_key_value``)."""
TARGET_GROUPS: dict[str, tuple[str, ...]] = {
    "all-linear": ALL_TARGETS,
    "attention": ("q", "k", "v", "qkv", "o"),
    "mlp": ("gate", "up", "gate_up", "down"),
}
"""Groups, resolved per architecture to the targets it has (peft's ``all-linear``: every linear
of the decoder layers, not the LM head)."""
MODULE_NAMES: tuple[str, ...] = (
    "c_attn",
    "c_proj",
    "c_fc",
    "query_key_value",
    "dense",
    "dense_h_to_4h",
    "dense_4h_to_h",
)
"""transformers' module names of the GPT blocks, accepted as targets (``*_proj`` names are read
as their target: ``q_proj`` is ``q``). ``c_proj`` names GPT-2's attention output *and* its MLP's
down projection (peft matches both), StarCoder2's MLP down projection only."""
HF_MODULES = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}
FUSED_MODULES = {"qkv": "self_attn.qkv_proj", "gate_up": "mlp.gate_up_proj"}
_GPT2_MODULES = {"qkv": "attn.c_attn", "o": "attn.c_proj", "up": "mlp.c_fc", "down": "mlp.c_proj"}
_NEOX_MODULES = {
    "qkv": "attention.query_key_value",
    "o": "attention.dense",
    "up": "mlp.dense_h_to_4h",
    "down": "mlp.dense_4h_to_h",
}
ADAPTER_DTYPES = ("fp32", "recipe")

# Which tensor each target reads: adapters on the same input share it when nothing copies it.
_INPUT_OF = {
    "q": "attn_in",
    "k": "attn_in",
    "v": "attn_in",
    "o": "attn_out",
    "gate": "mlp_in",
    "up": "mlp_in",
    "down": "mlp_act",
    "qkv": "attn_in",
    "gate_up": "mlp_in",
}


def lora_targets(value: str | Sequence[str]) -> tuple[str, ...]:
    """Validated adapter targets in canonical order, from ``"q,v"``, ``"all-linear"`` or a list.

    Names from :data:`ALL_TARGETS`, the groups of :data:`TARGET_GROUPS` (kept as groups: each
    architecture resolves them to what it has) and transformers' module names (``q_proj`` is
    read as ``q``; the GPT blocks' :data:`MODULE_NAMES` are kept as given). Whether a model has
    a target is checked by :func:`adapted_linears`.

    >>> lora_targets("v,q_proj")
    ('q', 'v')
    >>> lora_targets("mlp,all-linear,qkv_proj")
    ('all-linear', 'mlp', 'qkv')
    >>> lora_targets("q,x")
    Traceback (most recent call last):
    ...
    vrammath.errors.InputError: lora_targets: must be one of q, k, v, qkv, o, gate, up, gate_up, down, all-linear, attention, mlp, c_attn, c_proj, c_fc, query_key_value, dense, dense_h_to_4h, dense_4h_to_h (got 'x')
    >>> lora_targets(None)
    Traceback (most recent call last):
    ...
    vrammath.errors.InputError: lora_targets: must be text or a list of names from q, k, v, qkv, o, gate, up, gate_up, down, all-linear, attention, mlp, c_attn, c_proj, c_fc, query_key_value, dense, dense_h_to_4h, dense_4h_to_h (got None)
    """
    allowed = (*ALL_TARGETS, *TARGET_GROUPS, *MODULE_NAMES)
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(x, str) for x in items):
        raise InputError(
            "lora_targets", "must be text or a list of names from " + ", ".join(allowed), got=value
        )
    names: list[str] = []
    for item in items:
        for raw in str(item).split(","):
            name = raw.strip()
            if name not in MODULE_NAMES:
                name = name.removesuffix("_proj")
            if name not in allowed:
                raise one_of("lora_targets", raw.strip(), allowed)
            names.append(name)
    if not names:
        raise InputError("lora_targets", "must name at least one of " + ", ".join(allowed), got="")
    order = (*TARGET_GROUPS, *ALL_TARGETS, *MODULE_NAMES)
    return tuple(t for t in order if t in names)


@dataclass(frozen=True)
class AdaptedLinear:
    """One adapted projection kind: its target name, HF module, sizes and multiplicity."""

    target: str
    module: str
    in_features: sympy.Expr
    out_features: sympy.Expr
    count: sympy.Expr

    @property
    def lora_a(self) -> Tensor:
        """``lora_A.weight``: (r, in)."""
        return Tensor(f"{self.module}.lora_A.weight", (r, self.in_features), self.count, "adapter")

    @property
    def lora_b(self) -> Tensor:
        """``lora_B.weight``: (out, r)."""
        return Tensor(f"{self.module}.lora_B.weight", (self.out_features, r), self.count, "adapter")

    @property
    def params(self) -> sympy.Expr:
        """Trainable parameters of one such module, r (in + out)."""
        return r * (self.in_features + self.out_features)


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


def target_modules(spec: ModelSpec) -> dict[str, str]:
    """The targets ``spec`` has, each with its transformers module, in :data:`ALL_TARGETS` order.

    LLaMA-style layers have q, k, v, o, gate, up, down; Phi-3 fuses ``qkv_proj`` and
    ``gate_up_proj``; StarCoder2's plain MLP is ``c_fc`` (up) and ``c_proj`` (down); GPT-2's
    block is ``c_attn`` (q, k and v in one Conv1D), ``attn.c_proj``, ``mlp.c_fc``,
    ``mlp.c_proj``; GPT-NeoX's ``query_key_value``, ``dense``, ``dense_h_to_4h``,
    ``dense_4h_to_h``.

    >>> from vrammath.presets import load_model
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


def allowed_targets(spec: ModelSpec) -> tuple[str, ...]:
    """The names :func:`adapted_linears` accepts for ``spec``: its targets, the module names
    that are not ``<target>_proj``, and the groups.

    >>> from vrammath.presets import load_model
    >>> allowed_targets(load_model("gpt2"))
    ('qkv', 'o', 'up', 'down', 'c_attn', 'c_proj', 'c_fc', 'all-linear', 'attention', 'mlp')
    """
    mods = target_modules(spec)
    names = [m.split(".")[-1] for m in mods.values()]
    extra = [n for t, n in zip(mods, names, strict=True) if n != f"{t}_proj"]
    return (*mods, *dict.fromkeys(extra), *TARGET_GROUPS)


def adapted_linears(spec: ModelSpec, targets: str | Sequence[str]) -> list[AdaptedLinear]:
    """The projections LoRA adapts in ``spec`` for ``targets``, with symbolic in/out sizes.

    Each architecture has its own targets (:func:`target_modules`): a name it does not have is
    refused, naming the ones it has, as peft refuses a module name it cannot find. Groups take
    what the architecture has (``all-linear`` on Phi-3: qkv, o, gate_up, down).

    >>> from vrammath.presets import load_model
    >>> [(m.target, m.out_features) for m in adapted_linears(load_model("qwen2-72b"), "k,v")]
    [('k', a_kv*d), ('v', a_kv*d)]
    >>> [(m.module, m.out_features) for m in adapted_linears(load_model("phi-3-mini"), "qkv,mlp")]
    [('self_attn.qkv_proj', d*(a + 2*a_kv)), ('mlp.gate_up_proj', 2*I), ('mlp.down_proj', h)]
    >>> adapted_linears(load_model("phi-3-mini"), "q")
    Traceback (most recent call last):
    ...
    vrammath.errors.InputError: lora_targets: must be one of qkv, o, gate_up, down, all-linear, attention, mlp for phi3 (got 'q')
    """
    mods = target_modules(spec)
    chosen: set[str] = set()
    for name in lora_targets(targets):
        if name in TARGET_GROUPS:
            found = [t for t in mods if t in TARGET_GROUPS[name]]
        else:
            found = [t for t, m in mods.items() if name in (t, m.split(".")[-1])]
        if not found:
            allowed = ", ".join(allowed_targets(spec))
            raise InputError(
                "lora_targets", f"must be one of {allowed} for {spec.model_type}", got=name
            )
        chosen.update(found)
    return [AdaptedLinear(t, m, *_SHAPES[t], L) for t, m in mods.items() if t in chosen]


def adapter_tensors(spec: ModelSpec, targets: str | Sequence[str]) -> list[Tensor]:
    """Every adapter tensor (``lora_A`` and ``lora_B`` of each adapted module), shapes in r."""
    return [t for m in adapted_linears(spec, targets) for t in (m.lora_a, m.lora_b)]


def lora_param_expr(spec: ModelSpec, targets: str | Sequence[str] = ("q", "v")) -> sympy.Expr:
    """Trainable LoRA parameters: ``L r`` times the sum of (in + out) of the adapted matrices."""
    total = sum((m.count * m.params for m in adapted_linears(spec, targets)), sympy.Integer(0))
    return sympy.factor_terms(sympy.expand(total))


def lora_values(spec: ModelSpec, rank: int) -> dict[sympy.Symbol, int]:
    """Substitutions for LoRA expressions: the model symbols, ``P`` and ``r``."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
        raise InputError("lora_rank", "must be a positive integer", got=rank)
    return {**size_values(spec), P: param_count(spec), r: rank}


def lora_param_count(spec: ModelSpec, rank: int, targets: str | Sequence[str] = ("q", "v")) -> int:
    """Exact number of trainable LoRA parameters for a rank and a set of targets.

    >>> from vrammath.presets import load_model
    >>> lora_param_count(load_model("llama-2-70b"), 8, ("q", "k", "v"))
    22282240
    """
    return int(lora_param_expr(spec, targets).subs(lora_values(spec, rank)))


def _adapter_widths(recipe_name: str, adapter_dtype: str) -> tuple[int, int, int, int]:
    rec = recipe(recipe_name)
    if adapter_dtype not in ADAPTER_DTYPES:
        raise one_of("adapter_dtype", adapter_dtype, ADAPTER_DTYPES)
    if adapter_dtype == "fp32":
        return 4, 4, 0, 4
    return rec.weights, rec.gradients, rec.master, rec.state


def lora_state_exprs(
    spec: ModelSpec,
    rank: int,
    targets: str | Sequence[str] = ("q", "v"),
    recipe_name: str = "bf16-mixed",
    optimizer: str = "adamw",
    *,
    adapter_dtype: str = "fp32",
) -> dict[str, sympy.Expr]:
    """Bytes of the adapters' weights, gradients, master copy and optimizer states.

    ``adapter_dtype="fp32"`` is peft's default (``autocast_adapter_dtype=True`` upcasts adapters of
    a 16-bit base to fp32, so there is no separate master copy); ``"recipe"`` gives the adapters
    the recipe's widths (what QLoRA's script does with ``--bf16``: bf16 adapters, fp32 Adam
    states). ``rank`` only decides which tensors 8-bit Adam keeps in 32 bits; the expressions stay
    in ``r``.

    >>> from vrammath.presets import load_model
    >>> lora_state_exprs(load_model("llama-7b"), 8)["optimizer"]
    8*L*r*(a*d + a_kv*d + 2*h)
    """
    w, g, master, state = _adapter_widths(recipe_name, adapter_dtype)
    n = lora_param_expr(spec, targets)
    values = lora_values(spec, rank)
    opt = tensor_optimizer_expr(adapter_tensors(spec, targets), values, optimizer, state)
    return {
        "weights": w * n,
        "gradients": g * n,
        "master": master * n,
        "optimizer": sympy.factor_terms(sympy.expand(opt)),
    }


def lora_step_temp_expr(
    spec: ModelSpec,
    rank: int,
    targets: str | Sequence[str] = ("q", "v"),
    recipe_name: str = "bf16-mixed",
    optimizer: str = "adamw",
    implementation: str = "foreach",
    *,
    adapter_dtype: str = "fp32",
) -> sympy.Expr:
    """Transient bytes of ``optimizer.step()`` over the adapters (PyTorch Adam/AdamW).

    Same rule as :func:`vrammath.states.optimizer_step_temp_expr`, applied to the adapters only:
    foreach materialises one state-sized copy of every adapter, for-loop two copies of the largest.
    """
    if implementation not in IMPLEMENTATIONS:
        raise one_of("implementation", implementation, IMPLEMENTATIONS)
    _, _, _, state = _adapter_widths(recipe_name, adapter_dtype)
    if optimizer not in ("adam", "adamw") or implementation == "fused":
        return sympy.Integer(0)
    if implementation == "foreach":
        return state * lora_param_expr(spec, targets)
    values = lora_values(spec, rank)
    largest = max(adapter_tensors(spec, targets), key=lambda t: int(t.numel.subs(values)))
    return 2 * state * largest.numel


def lora_activation_layer_expr(
    spec: ModelSpec,
    targets: str | Sequence[str] = ("q", "v"),
    *,
    input_bytes: int = 2,
    adapter_bytes: int = 4,
    dropout: bool = False,
    dropout_mask_bytes: int = 1,
) -> sympy.Expr:
    """Bytes the adapters of one layer add to what is kept for backward.

    Explanation
    ===========

    peft computes ``lora_B(lora_A(dropout(x.to(adapter dtype)))) * scaling``. Per adapted module:

    * ``lora_A`` keeps its input for its weight gradient: the module input cast to the adapter
      dtype (a fresh copy when ``input_bytes != adapter_bytes``), or the dropout output plus
      dropout's mask when ``dropout`` is on. ``dropout_mask_bytes`` is 1 for CUDA's fused
      dropout (a bool mask); PyTorch's CPU dropout keeps its mask in the input's dtype
      (``adapter_bytes``), which is what a CPU measurement sees. When neither copies the input, adapters
      reading the same tensor (q, k, v; gate, up) share it: it is counted once per input.
    * ``lora_B`` keeps ``lora_A``'s output: ``adapter_bytes * b s r``.

    The frozen base's linear layers keep nothing for a weight gradient, so these tensors are the
    adapters' own. ``input_bytes`` is the width of the base's hidden states (2 for a bf16 model).

    >>> from vrammath.presets import load_model
    >>> lora_activation_layer_expr(load_model("llama-7b"), ("q", "v"))
    8*b*h*s + 8*b*r*s
    >>> lora_activation_layer_expr(load_model("llama-7b"), ("q", "v"), input_bytes=4)
    4*b*h*s + 8*b*r*s
    """
    copies = dropout or input_bytes != adapter_bytes
    per_input = 0 if copies else input_bytes
    shared: dict[str, sympy.Expr] = {}
    total = sympy.Integer(0)
    for m in adapted_linears(spec, targets):
        total += adapter_bytes * b * s * r
        if copies:
            mask = dropout_mask_bytes if dropout else 0
            total += (adapter_bytes + mask) * b * s * m.in_features
        else:
            shared[_INPUT_OF[m.target]] = per_input * b * s * m.in_features
    total += sum(shared.values(), sympy.Integer(0))
    return sympy.expand(total)


@dataclass(frozen=True)
class Term:
    """One named memory term of a LoRA/QLoRA setup: key, label, expression, note."""

    key: str
    label: str
    expr: sympy.Expr
    note: str = ""


def lora_terms(
    spec: ModelSpec,
    rank: int,
    targets: str | Sequence[str] = ("q", "v"),
    recipe_name: str = "bf16-mixed",
    optimizer: str = "adamw",
    implementation: str = "foreach",
    *,
    quant: str | None = None,
    dropout: bool = False,
    recompute: str = "none",
) -> list[Term]:
    """The whole-model terms of a LoRA (``quant=None``) or QLoRA setup, before any sharding.

    The frozen base sits in the recipe's weight dtype (bf16 around a quantized base) with no
    gradients, master copy or optimizer states; the adapters are fp32 as peft makes them
    (``autocast_adapter_dtype``), with fp32 gradients and the optimizer's states. The adapters'
    own activations are :func:`lora_activation_layer_expr` per layer (one layer's worth, live
    only while it is recomputed, under full recomputation).

    >>> from vrammath.presets import load_model
    >>> [t.key for t in lora_terms(load_model("llama-7b"), 16, "q,v", quant="nf4")]  # doctest: +NORMALIZE_WHITESPACE
    ['weights', 'quant_constants', 'adapter_weights', 'adapter_gradients', 'adapter_optimizer',
     'dequant_buffer', 'adapter_activations', 'step_temporaries']
    """
    rec = recipe(recipe_name)
    chosen = lora_targets(targets)
    base_bytes = 2 if quant is not None else rec.weights
    base = frozen_base_exprs(spec, quant, base_bytes)
    width = {1: "int8", 2: "16-bit", 4: "fp32"}.get(base_bytes, f"{base_bytes}-byte")
    out = [
        Term(
            "weights",
            f"frozen base weights ({quant} codes + 16-bit rest)"
            if quant
            else f"frozen base weights ({width})",
            base["weights"],
            "no gradients, master copy or optimizer states",
        )
    ]
    if quant is not None:
        note = "uint8 absmax per 64 + fp32 per 256 + offset" if quant == "nf4" else ""
        out.append(
            Term(
                "quant_constants",
                f"quantization constants ({quant})",
                base["quant_constants"],
                note,
            )
        )
    states = lora_state_exprs(spec, rank, chosen, recipe_name, optimizer, adapter_dtype="fp32")
    labels = {
        "weights": "adapter weights (fp32)",
        "gradients": "adapter gradients (fp32)",
        "master": "adapter master weights",
        "optimizer": f"adapter optimizer states ({optimizer})",
    }
    for key, expr in states.items():
        if key == "master" and expr == 0:
            continue
        out.append(Term(f"adapter_{key}", labels[key], expr, f"rank {rank} on {','.join(chosen)}"))
    if quant is not None:
        out.append(
            Term(
                "dequant_buffer",
                "dequantization buffer (transient)",
                dequant_buffer_expr(spec, 2),
                "one frozen matrix in bf16 per matmul",
            )
        )
    layer = lora_activation_layer_expr(
        spec, chosen, input_bytes=base_bytes, adapter_bytes=4, dropout=dropout
    )
    if recompute == "full":
        out.append(
            Term(
                "adapter_activations",
                "adapter activations (one layer, recomputed)",
                layer,
                "kept only while a layer is recomputed",
            )
        )
    else:
        out.append(
            Term(
                "adapter_activations",
                "adapter activations",
                L * layer,
                "lora_A inputs" + (" + dropout masks" if dropout else "") + " + lora_A outputs",
            )
        )
    out.append(
        Term(
            "step_temporaries",
            f"optimizer step temporaries ({implementation})",
            lora_step_temp_expr(
                spec, rank, chosen, recipe_name, optimizer, implementation, adapter_dtype="fp32"
            ),
            "transient, during optimizer.step(), adapters only",
        )
    )
    return out


__all__ = [
    "ADAPTER_DTYPES",
    "ALL_TARGETS",
    "FUSED_MODULES",
    "HF_MODULES",
    "LORA_TARGETS",
    "MODULE_NAMES",
    "TARGET_GROUPS",
    "AdaptedLinear",
    "Term",
    "adapted_linears",
    "adapter_tensors",
    "allowed_targets",
    "lora_activation_layer_expr",
    "lora_param_count",
    "lora_param_expr",
    "lora_state_exprs",
    "lora_step_temp_expr",
    "lora_targets",
    "lora_terms",
    "lora_values",
    "target_modules",
]
