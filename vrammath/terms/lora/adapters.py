"""LoRA: trainable low-rank adapters on a frozen (optionally quantized) base, and their terms.

LoRA (Hu et al. 2021) freezes every weight ``W`` (out x in) of the adapted linear layers and trains
``B A`` beside it, with ``A`` (r x in) and ``B`` (out x r): ``r (in + out)`` trainable parameters per
adapted matrix. The frozen base keeps its weights in their own dtype and has no gradients, no
master copy and no optimizer states; only the adapters do. QLoRA (Dettmers et al. 2023) stores the
frozen linear weights in NF4 (:mod:`vrammath.terms.lora.quant`) and pages the optimizer states to the CPU
under memory pressure. The term table (:data:`vrammath.compose.table.TERMS`) composes these expressions
into the rows of a fine-tuning setup, as it composes every other setup.

Adapter targets are named by what they adapt (``q``, ``k``, ``v``, ``o``, ``gate``, ``up``,
``down``; ``qkv``, ``gate_up`` where an architecture fuses them; ``router`` and ``experts`` on
mixture-of-experts models): :mod:`vrammath.terms.lora.targets` says what each name adapts in a given model,
as peft does it.

Examples
========

>>> from vrammath.model.presets import load_model
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
from dataclasses import KW_ONLY, dataclass

import sympy

from vrammath.model.params import param_count, size_values
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError, one_of
from vrammath.notation.signatures import after
from vrammath.notation.symbols import L, P, b, r, s
from vrammath.terms.lora.linears import AdaptedLinear, adapted_linears, adapter_tensors
from vrammath.terms.states import IMPLEMENTATIONS, recipe, tensor_optimizer_expr

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

    >>> from vrammath.model.presets import load_model
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


@dataclass(frozen=True)
class Adapters:
    """LoRA adapters of rank ``rank`` on ``targets`` of ``spec``, trained under the recipe
    ``recipe_name`` with ``optimizer``; ``adapter_dtype`` (keyword-only) is peft's ``"fp32"`` or
    the ``"recipe"``'s widths. What :func:`lora_state_exprs` takes."""

    spec: ModelSpec
    rank: int
    targets: str | Sequence[str] = ("q", "v")
    recipe_name: str = "bf16-mixed"
    optimizer: str = "adamw"
    _: KW_ONLY
    adapter_dtype: str = "fp32"


@dataclass(frozen=True)
class AdapterStep(Adapters):
    """:class:`Adapters` and the optimizer step's ``implementation`` (after ``optimizer``).
    What :func:`lora_step_temp_expr` takes."""

    implementation: str = "foreach"


@after(Adapters)
def lora_state_exprs(lora: Adapters) -> dict[str, sympy.Expr]:
    """Bytes of the adapters' weights, gradients, master copy and optimizer states.

    ``adapter_dtype="fp32"`` is peft's default (``autocast_adapter_dtype=True`` upcasts adapters of
    a 16-bit base to fp32, so there is no separate master copy); ``"recipe"`` gives the adapters
    the recipe's widths (what QLoRA's script does with ``--bf16``: bf16 adapters, fp32 Adam
    states). ``rank`` only decides which tensors 8-bit Adam keeps in 32 bits; the expressions stay
    in ``r``.

    >>> from vrammath.model.presets import load_model
    >>> lora_state_exprs(load_model("llama-7b"), 8)["optimizer"]
    8*L*r*(a*d + a_kv*d + 2*h)
    """
    spec, targets = lora.spec, lora.targets
    w, g, master, state = _adapter_widths(lora.recipe_name, lora.adapter_dtype)
    n = lora_param_expr(spec, targets)
    values = lora_values(spec, lora.rank)
    opt = tensor_optimizer_expr(adapter_tensors(spec, targets), values, lora.optimizer, state)
    return {
        "weights": w * n,
        "gradients": g * n,
        "master": master * n,
        "optimizer": sympy.factor_terms(sympy.expand(opt)),
    }


@after(AdapterStep)
def lora_step_temp_expr(step: AdapterStep) -> sympy.Expr:
    """Transient bytes of ``optimizer.step()`` over the adapters (PyTorch Adam/AdamW).

    Same rule as :func:`vrammath.terms.states.optimizer_step_temp_expr`, applied to the adapters only:
    foreach materialises one state-sized copy of every adapter, for-loop two copies of the largest.
    """
    spec, targets, implementation = step.spec, step.targets, step.implementation
    if implementation not in IMPLEMENTATIONS:
        raise one_of("implementation", implementation, IMPLEMENTATIONS)
    _, _, _, state = _adapter_widths(step.recipe_name, step.adapter_dtype)
    if step.optimizer not in ("adam", "adamw") or implementation == "fused":
        return sympy.Integer(0)
    if implementation == "foreach":
        return state * lora_param_expr(spec, targets)
    values = lora_values(spec, step.rank)
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

    >>> from vrammath.model.presets import load_model
    >>> lora_activation_layer_expr(load_model("llama-7b"), ("q", "v"))
    8*b*h*s + 8*b*r*s
    >>> lora_activation_layer_expr(load_model("llama-7b"), ("q", "v"), input_bytes=4)
    4*b*h*s + 8*b*r*s
    """
    copies = dropout or input_bytes != adapter_bytes
    per_input = 0 if copies else input_bytes
    shared: dict[tuple[str, sympy.Expr], sympy.Expr] = {}
    total = sympy.Integer(0)
    for m in adapted_linears(spec, targets):
        share = m.count / L  # a module only some layers have (MoE layers: L_e of L)
        if m.wraps_parameter:
            if dropout:
                raise InputError(
                    "lora_dropout",
                    "must be off for adapters on router/experts "
                    "(peft's ParamWrapper refuses dropout)",
                    got=True,
                )
            total += share * _wrapped_bytes(spec, m, input_bytes, adapter_bytes)
            continue
        total += share * adapter_bytes * b * s * m.inner
        if copies:
            mask = dropout_mask_bytes if dropout else 0
            total += share * (adapter_bytes + mask) * b * s * m.in_features
        else:
            key = (_INPUT_OF.get(m.target, m.module), m.count)
            shared[key] = share * per_input * b * s * m.in_features
    total += sum(shared.values(), sympy.Integer(0))
    return sympy.expand(total)


def _wrapped_bytes(
    spec: ModelSpec, m: AdaptedLinear, input_bytes: int, adapter_bytes: int
) -> sympy.Expr:
    """Bytes one MoE layer keeps for an adapted parameter (peft's ``ParamWrapper``).

    peft adds the adapter to the weight itself for the forward pass (``W + s B A`` through
    ``torch.nn.utils.parametrize``), so the merged weight (in the parameter's dtype) is what the
    matmul keeps, and the matmul now keeps its input too, since its weight needs a gradient:

    * router: merged ``(E, h)`` weight and the input ``b s h`` (fp32 both where the router
      computes in fp32, DeepSeek-V3);
    * experts: the merged ``(E, out, in)`` weight, the factors ``A``, ``B`` cast to the
      weight's dtype (``baddbmm``'s operands), and the grouped matmul's input rows ``b s k``.
    """
    ex = spec.experts
    assert ex is not None
    if m.target == "router":
        width = 4 if ex.router_fp32 else input_bytes
        return width * m.in_features * m.out_features + width * b * s * m.in_features
    casts = input_bytes if input_bytes != adapter_bytes else 0
    rows = b * s * ex.top_k
    return (
        input_bytes * m.experts * m.in_features * m.out_features
        + casts * m.inner * (m.in_features + m.out_features)
        + input_bytes * rows * m.in_features
    )


__all__ = [
    "ADAPTER_DTYPES",
    "AdapterStep",
    "Adapters",
    "lora_activation_layer_expr",
    "lora_param_count",
    "lora_param_expr",
    "lora_state_exprs",
    "lora_step_temp_expr",
    "lora_values",
]
