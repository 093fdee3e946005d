"""LoRA and QLoRA: trainable low-rank adapters on a frozen, optionally quantized, base model.

LoRA (Hu et al. 2021) freezes every weight ``W`` (out x in) of the adapted linear layers and trains
``B A`` beside it, with ``A`` (r x in) and ``B`` (out x r): ``r (in + out)`` trainable parameters per
adapted matrix. The frozen base keeps its weights in their own dtype and has no gradients, no
master copy and no optimizer states; only the adapters do. QLoRA (Dettmers et al. 2023) stores the
frozen linear weights in 4-bit NormalFloat (NF4) with one absmax per block of 64 and quantizes those
constants again (double quantization), keeps embeddings, norms and the LM head in 16 bits, and
pages the optimizer states to the CPU under memory pressure.

Adapter targets are named by what they adapt: ``q``, ``k``, ``v``, ``o`` (attention projections,
k and v GQA-shaped ``a_kv d``), ``gate``, ``up``, ``down`` (MLP). For the GPT family they are the
paper's logical matrices (q, k, v, o are h x h; ``gate`` does not exist).

Examples
========

>>> from vrammath.presets import load_model
>>> spec = load_model("llama-7b")
>>> lora_param_expr(spec, ("q", "v"))
L*r*(a*d + a_kv*d + 2*h)
>>> lora_param_count(spec, 8, ("q", "v")), lora_param_count(spec, 16, "all-linear")
(4194304, 39976960)
>>> nf4_published_bits_per_param() - 4  # bits of quantization constants per parameter
65/512

References
==========

.. [1] Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", arXiv:2106.09685,
   section 4.2 (GPT-3 175B: 1.2 TB -> 350 GB of training VRAM with r = 4 on q and v).
.. [2] Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs", arXiv:2305.14314,
   section 3 (NF4, block size 64, double quantization: 8/64 + 32/(64*256) = 0.127 bits/param;
   paged optimizers) and the abstract (65B on one 48 GB GPU; > 780 GB for 16-bit finetuning).
.. [3] peft ``tuners/lora/layer.py`` (``Linear.forward``: ``lora_B(lora_A(dropout(x))) * scaling``
   with ``x`` cast to the adapter dtype; adapters upcast to fp32 by ``autocast_adapter_dtype``).
.. [4] bitsandbytes ``functional.quantize_4bit`` (packed uint8 codes, fp32 absmax per block;
   with ``compress_statistics`` the absmax minus its mean is quantized to uint8 in blocks of 256).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sympy

from vrammath.errors import InputError, one_of
from vrammath.model import ModelSpec
from vrammath.params import Tensor, param_count, size_values, tensors
from vrammath.states import IMPLEMENTATIONS, recipe, tensor_optimizer_expr
from vrammath.symbols import I, L, P, a, a_kv, b, d, h, r, s

LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
TARGET_GROUPS: dict[str, tuple[str, ...]] = {
    "all-linear": LORA_TARGETS,
    "attention": ("q", "k", "v", "o"),
    "mlp": ("gate", "up", "down"),
}
HF_MODULES = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}
ADAPTER_DTYPES = ("fp32", "recipe")
QUANTS = ("nf4", "nf4-nodq", "int8")
NF4_BLOCK = 64  # QLoRA's block size for the first-level absmax
NF4_DQ_BLOCK = 256  # block size of the second level (double quantization)

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

# Fused projections (Phi-3's qkv_proj, gate_up_proj): PEFT adapts the whole module, so naming
# any of its parts puts one adapter on it, of the fused width.
FUSED_MODULES = {"qkv": "self_attn.qkv_proj", "gate_up": "mlp.gate_up_proj"}
_FUSED_OF = {"q": "qkv", "k": "qkv", "v": "qkv", "gate": "gate_up", "up": "gate_up"}


def lora_targets(value: str | Sequence[str]) -> tuple[str, ...]:
    """Validated adapter targets in canonical order, from ``"q,v"``, ``"all-linear"`` or a list.

    Hugging Face module names (``q_proj``) are accepted too.

    >>> lora_targets("v,q_proj")
    ('q', 'v')
    >>> lora_targets("all-linear")
    ('q', 'k', 'v', 'o', 'gate', 'up', 'down')
    >>> lora_targets("q,x")
    Traceback (most recent call last):
    ...
    vrammath.errors.InputError: lora_targets: must be one of q, k, v, o, gate, up, down, all-linear, attention, mlp (got 'x')
    """
    allowed = (*LORA_TARGETS, *TARGET_GROUPS)
    items = [value] if isinstance(value, str) else list(value)
    names: list[str] = []
    for item in items:
        for raw in str(item).split(","):
            name = raw.strip().removesuffix("_proj")
            if name in TARGET_GROUPS:
                names += TARGET_GROUPS[name]
            elif name in LORA_TARGETS:
                names.append(name)
            else:
                raise one_of("lora_targets", raw.strip(), allowed)
    if not names:
        raise InputError("lora_targets", "must name at least one of " + ", ".join(allowed), got="")
    return tuple(t for t in LORA_TARGETS if t in names)


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


def _shapes(spec: ModelSpec) -> dict[str, tuple[sympy.Expr, sympy.Expr]]:
    if spec.family == "gpt":
        return {"q": (h, h), "k": (h, h), "v": (h, h), "o": (h, h), "up": (h, I), "down": (I, h)}
    shapes = {
        "q": (h, a * d),
        "k": (h, a_kv * d),
        "v": (h, a_kv * d),
        "o": (a * d, h),
        "gate": (h, I),
        "up": (h, I),
        "down": (I, h),
        "qkv": (h, (a + 2 * a_kv) * d),
        "gate_up": (h, 2 * I),
    }
    if not spec.mlp.gated:  # StarCoder2's plain MLP: c_fc (up) and c_proj (down), no gate
        del shapes["gate"], shapes["gate_up"]
    return shapes


def _fused_targets(spec: ModelSpec, chosen: tuple[str, ...]) -> list[str]:
    """``chosen`` with q/k/v and gate/up folded into the fused modules ``spec`` has."""
    fused = {"qkv": spec.attention.fused_qkv_linear, "gate_up": spec.mlp.fused_gate_up}
    out: list[str] = []
    for target in chosen:
        module = _FUSED_OF.get(target, target)
        name = module if fused.get(module, False) else target
        if name not in out:
            out.append(name)
    return out


def _module(spec: ModelSpec, target: str) -> str:
    """transformers' module name of a target (StarCoder2's plain MLP is c_fc, c_proj)."""
    if target in FUSED_MODULES:
        return FUSED_MODULES[target]
    if not spec.mlp.gated and spec.family != "gpt" and target in ("up", "down"):
        return {"up": "mlp.c_fc", "down": "mlp.c_proj"}[target]
    return HF_MODULES[target]


def adapted_linears(spec: ModelSpec, targets: str | Sequence[str]) -> list[AdaptedLinear]:
    """The projections LoRA adapts in ``spec`` for ``targets``, with symbolic in/out sizes.

    Where ``spec`` fuses projections (Phi-3's ``qkv_proj``, ``gate_up_proj``), naming any part
    adapts the whole fused module once (target ``qkv`` or ``gate_up``), as PEFT does.

    >>> from vrammath.presets import load_model
    >>> [(m.target, m.out_features) for m in adapted_linears(load_model("qwen2-72b"), "k,v")]
    [('k', a_kv*d), ('v', a_kv*d)]
    >>> [(m.module, m.out_features) for m in adapted_linears(load_model("phi-3-mini"), "q,v,up")]
    [('self_attn.qkv_proj', d*(a + 2*a_kv)), ('mlp.gate_up_proj', 2*I)]
    """
    chosen = _fused_targets(spec, lora_targets(targets))
    shapes = _shapes(spec)
    out = []
    for target in chosen:
        if target not in shapes:
            raise one_of("lora_targets", target, tuple(shapes))
        fan_in, fan_out = shapes[target]
        out.append(AdaptedLinear(target, _module(spec, target), fan_in, fan_out, L))
    return out


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


# ----------------------------------------------------------------------------------------------
# Quantized frozen base (QLoRA's NF4 with double quantization, LLM.int8)
# ----------------------------------------------------------------------------------------------


def _check_quant(quant: str) -> None:
    if quant not in QUANTS:
        raise one_of("quant", quant, QUANTS)


def nf4_published_bits_per_param(double_quant: bool = True) -> sympy.Expr:
    """Bits per parameter of NF4 as QLoRA publishes it: 4 + the quantization constants.

    Block size 64 with fp32 constants costs 32/64 = 0.5 bits; double quantization stores them in
    8 bits with one fp32 constant per 256 of them: 8/64 + 32/(64 * 256) = 0.127 bits.

    >>> nf4_published_bits_per_param(False), float(nf4_published_bits_per_param() - 4)
    (9/2, 0.126953125)
    """
    four = sympy.Integer(4)
    if double_quant:
        return four + sympy.Rational(8, NF4_BLOCK) + sympy.Rational(32, NF4_BLOCK * NF4_DQ_BLOCK)
    return four + sympy.Rational(32, NF4_BLOCK)


def quantized_tensors(spec: ModelSpec) -> list[Tensor]:
    """The tensors a 4-/8-bit load quantizes: every linear weight inside the decoder layers.

    Embeddings, the LM head (transformers keeps ``lm_head`` out of bitsandbytes' conversion),
    norms and biases stay in 16 bits.
    """
    return [
        t
        for t in tensors(spec)
        if t.component in ("attention", "mlp") and len(t.shape) == 2 and t.count == L
    ]


def quant_tensor_exprs(tensor: Tensor, quant: str) -> tuple[sympy.Expr, sympy.Expr]:
    """(codes, constants) bytes of one quantized tensor, as bitsandbytes stores it.

    * ``nf4``: ``ceil(n/2)`` packed codes; a uint8 absmax per 64, an fp32 absmax per 256 of those
      and the fp32 mean subtracted before (double quantization).
    * ``nf4-nodq``: ``ceil(n/2)`` codes and an fp32 absmax per 64.
    * ``int8`` (LLM.int8): ``n`` int8 codes and one fp32 scale per output row (``SCB``).

    The 16-entry NF4 code table and the 256-entry dynamic map (at most 1 KiB each) are ignored.

    >>> from vrammath.symbols import h
    >>> w = Tensor("w", (h, h), L, "attention")
    >>> quant_tensor_exprs(w, "nf4")
    (ceiling(h**2/2), ceiling(h**2/64) + 4*ceiling(ceiling(h**2/64)/256) + 4)
    """
    _check_quant(quant)
    n = tensor.numel
    if quant == "int8":
        return n, 4 * tensor.shape[0]
    codes = sympy.ceiling(n / 2)
    blocks = sympy.ceiling(n / NF4_BLOCK)
    if quant == "nf4":
        return codes, blocks + 4 * sympy.ceiling(blocks / NF4_DQ_BLOCK) + 4
    return codes, 4 * blocks


def frozen_base_exprs(
    spec: ModelSpec, quant: str | None = None, base_bytes: int = 2
) -> dict[str, sympy.Expr]:
    """Bytes of the frozen base: ``weights`` (16-bit parts + codes) and ``quant_constants``.

    Without quantization the whole base sits in its dtype: ``base_bytes * P``.

    >>> from vrammath.presets import load_model
    >>> frozen_base_exprs(load_model("llama-7b"))
    {'weights': 2*P, 'quant_constants': 0}
    >>> from vrammath.params import size_values
    >>> from vrammath.states import state_values
    >>> e = frozen_base_exprs(load_model("llama-7b"), "nf4")
    >>> spec = load_model("llama-7b")
    >>> [int(v.subs(state_values(spec))) for v in e.values()]
    [3762823168, 102769536]
    """
    if quant is None:
        return {"weights": base_bytes * P, "quant_constants": sympy.Integer(0)}
    _check_quant(quant)
    codes = sympy.Integer(0)
    consts = sympy.Integer(0)
    numel = sympy.Integer(0)
    values = size_values(spec)
    for t in quantized_tensors(spec):
        c, k = quant_tensor_exprs(t, quant)
        if quant != "int8" and int(t.numel.subs(values)) % 2 == 0:
            c = t.numel / 2  # ceil(n/2) of an even size, written plainly
        codes += t.count * c
        consts += t.count * k
        numel += t.count * t.numel
    return {
        "weights": base_bytes * P + sympy.factor_terms(sympy.expand(codes - base_bytes * numel)),
        "quant_constants": consts,
    }


def dequant_buffer_expr(spec: ModelSpec, compute_bytes: int = 2) -> sympy.Expr:
    """Transient bytes of dequantizing one frozen matrix for a matmul (forward or backward).

    bitsandbytes' ``MatMul4Bit`` dequantizes the whole weight to the compute dtype, one layer at
    a time: the largest quantized matrix in ``compute_bytes``.

    >>> from vrammath.presets import load_model
    >>> dequant_buffer_expr(load_model("llama-7b"))
    2*I*h
    """
    values = size_values(spec)
    largest = max(quantized_tensors(spec), key=lambda t: int(t.numel.subs(values)))
    return compute_bytes * largest.numel


# ----------------------------------------------------------------------------------------------
# The terms of one fine-tuning setup (what vrammath.estimate composes)
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# The papers' claims, reproduced
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """A published memory figure, vrammath's parts of it, and what the reproduction assumes."""

    source: str
    claim: str
    published_bytes: int
    parts: dict[str, int]
    assumptions: tuple[str, ...]

    @property
    def bytes(self) -> int:
        """vrammath's total for the claim."""
        return sum(self.parts.values())

    @property
    def relative_error(self) -> float:
        """(vrammath - published) / published."""
        return (self.bytes - self.published_bytes) / self.published_bytes


def lora_gpt3_claims() -> tuple[Claim, Claim, Claim]:
    """LoRA's GPT-3 175B figures: 1.2 TB of training VRAM full-finetuned, 350 GB with LoRA.

    The paper gives totals, not a breakdown. It says the saving is the optimizer states of the
    frozen weights, "up to 2/3" for Adam: weights, Adam's m and v, all 16-bit (6 bytes/param,
    1.05 TB; 8 with 16-bit gradients too, 1.40 TB -- 1.2 TB sits between). With LoRA (r = 4 on q
    and v, 18.9M trainable parameters) what stays is the 16-bit weights: 2 bytes/param, 349 GB.
    Activations are not in either figure.

    >>> full6, full8, lora = lora_gpt3_claims()
    >>> round(full6.bytes / 1e12, 2), round(full8.bytes / 1e12, 2), round(lora.bytes / 1e9, 1)
    (1.05, 1.4, 349.4)
    """
    from vrammath.presets import load_model

    spec = load_model("gpt-175b")
    psi = param_count(spec)
    targets = ("q", "v")
    n_lora = lora_param_count(spec, 4, targets)
    source = "Hu et al. 2021 (arXiv:2106.09685), section 4.2"
    common = (
        "GPT-3 175B as in conf/models/gpt-175b.json (h 12288, L 96, v 51200)",
        "GB/TB decimal; activations, buffers and fragmentation not counted",
    )
    full6 = Claim(
        source,
        "full fine-tuning with Adam: 1.2 TB (lower reading: 16-bit weights, m, v)",
        int(1.2e12),
        {"weights (fp16)": 2 * psi, "adam m, v (fp16)": 4 * psi},
        (*common, "the paper's 'up to 2/3' saving: weights + m + v, all 16-bit, no gradients"),
    )
    full8 = Claim(
        source,
        "full fine-tuning with Adam: 1.2 TB (upper reading: + fp16 gradients)",
        int(1.2e12),
        {"weights (fp16)": 2 * psi, "gradients (fp16)": 2 * psi, "adam m, v (fp16)": 4 * psi},
        (*common, "weights, gradients, m and v all 16-bit (8 bytes/param)"),
    )
    lora = Claim(
        source,
        "LoRA r=4 on q and v: 350 GB",
        int(350e9),
        {
            "frozen weights (fp16)": 2 * psi,
            "adapters: weights, gradients, adam m, v (fp16)": 8 * n_lora,
        },
        (*common, f"r = 4 on W_q and W_v: {n_lora:,} trainable parameters (2 x 2 x L x r x h)"),
    )
    return full6, full8, lora


def qlora_65b_claims(batch: int = 1, seq: int = 512, rank: int = 64) -> tuple[Claim, Claim]:
    """QLoRA's LLaMA-65B figures: > 780 GB for 16-bit finetuning, < 48 GB with QLoRA.

    * 16-bit finetuning: 16-bit weights and gradients, Adam's m and v in fp32: 12 bytes/param
      (no fp32 master copy), 65.29B parameters -> 783 GB.
    * QLoRA as the paper's Guanaco-65B script runs it: NF4 + double quantization on every decoder
      linear (exact bitsandbytes storage), embeddings / LM head / norms in bf16, LoRA r = 64 on all
      linear layers with bf16 adapters and gradients and ``paged_adamw_32bit`` (fp32 m, v), gradient
      checkpointing, micro-batch 1 x 512 tokens (the setting of the paper's Figure 6). Activations
      are the checkpointed layer inputs plus one layer recomputed plus the loss, from
      :mod:`vrammath.activations` for a full fine-tune (an upper bound for a frozen base), plus
      the adapters' own; the dequantization buffer of one matrix is added. Paged optimizer states
      (6.4 GB) may move to the CPU when the GPU runs out, so the claim fits even with little
      headroom. CUDA context and allocator overhead are not counted.

    >>> full, q = qlora_65b_claims()
    >>> round(full.bytes / 1e9, 1), round(q.bytes / 1e9, 1), q.bytes < 48e9
    (783.4, 45.5, True)
    """
    from vrammath.activations import hf_activation_bytes, hf_layer_bytes
    from vrammath.presets import load_model

    spec = load_model("llama-65b")
    psi = param_count(spec)
    source = "Dettmers et al. 2023 (arXiv:2305.14314), abstract and section 3"
    full = Claim(
        source,
        "16-bit finetuning of LLaMA-65B: more than 780 GB",
        int(780e9),
        {"weights (bf16)": 2 * psi, "gradients (bf16)": 2 * psi, "adam m, v (fp32)": 8 * psi},
        (
            "LLaMA-65B, 65,285,660,672 parameters (conf/models/llama-65b.json)",
            "12 bytes/param: 16-bit weights and gradients, fp32 Adam states, no master copy",
            "GB decimal; activations not counted",
        ),
    )
    values = {**lora_values(spec, rank), b: batch, s: seq}
    base = frozen_base_exprs(spec, "nf4", 2)
    adapters = lora_state_exprs(
        spec, rank, "all-linear", "bf16-mixed", "adamw", adapter_dtype="recipe"
    )
    acts = (
        hf_activation_bytes(spec, "sdpa", "bf16", "full")
        + hf_layer_bytes(spec, "sdpa", "bf16")
        + lora_activation_layer_expr(
            spec, "all-linear", input_bytes=2, adapter_bytes=2, dropout=True
        )
    )

    def num(expr: sympy.Expr) -> int:
        return int(sympy.ceiling(expr.subs(values)))

    parts = {
        "NF4 codes + bf16 embeddings, head, norms": num(base["weights"]),
        "quantization constants (double quant)": num(base["quant_constants"]),
        "adapter weights (bf16)": num(adapters["weights"]),
        "adapter gradients (bf16)": num(adapters["gradients"]),
        "paged AdamW 32-bit states": num(adapters["optimizer"]),
        "activations (checkpointed) + one layer + loss": num(acts),
        "dequantization buffer": num(dequant_buffer_expr(spec, 2)),
    }
    qlora = Claim(
        source,
        "QLoRA finetuning of LLaMA-65B on one 48 GB GPU",
        int(48e9),
        parts,
        (
            "NF4, block 64, double quantization on every decoder linear; bf16 elsewhere",
            f"LoRA r = {rank} on all linear layers, dropout 0.05, bf16 adapters (qlora.py --bf16)",
            "paged_adamw_32bit: fp32 m and v, pageable to CPU memory",
            f"gradient checkpointing, micro-batch {batch} x {seq} tokens, SDPA attention",
            "not measurable here: bitsandbytes' 4-bit kernels need CUDA",
            "GB decimal; CUDA context, cuBLAS workspace and fragmentation not counted",
        ),
    )
    return full, qlora


__all__ = [
    "ADAPTER_DTYPES",
    "HF_MODULES",
    "LORA_TARGETS",
    "NF4_BLOCK",
    "NF4_DQ_BLOCK",
    "QUANTS",
    "TARGET_GROUPS",
    "AdaptedLinear",
    "Claim",
    "Term",
    "adapted_linears",
    "adapter_tensors",
    "dequant_buffer_expr",
    "frozen_base_exprs",
    "lora_activation_layer_expr",
    "lora_gpt3_claims",
    "lora_param_count",
    "lora_param_expr",
    "lora_state_exprs",
    "lora_step_temp_expr",
    "lora_targets",
    "lora_terms",
    "lora_values",
    "nf4_published_bits_per_param",
    "qlora_65b_claims",
    "quant_tensor_exprs",
    "quantized_tensors",
]
