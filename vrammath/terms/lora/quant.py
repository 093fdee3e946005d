"""Storage formats of a quantized frozen base: NF4 with double quantization, NF4 without, LLM.int8.

QLoRA (Dettmers et al. 2023) stores the frozen linear weights in 4-bit NormalFloat (NF4) with one
absmax per block of 64 and quantizes those constants again (double quantization); LLM.int8 keeps
int8 codes and one fp32 scale per output row. Embeddings, norms and the LM head stay in 16 bits.
The same storage serves fine-tuning (:mod:`vrammath.terms.lora.adapters`) and serving (:mod:`vrammath.serve.estimate`).

Examples
========

>>> nf4_published_bits_per_param() - 4  # bits of quantization constants per parameter
65/512
>>> from vrammath.model.presets import load_model
>>> dequant_buffer_expr(load_model("llama-7b"))
2*I*h

References
==========

.. [1] Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs", arXiv:2305.14314,
   section 3 (NF4, block size 64, double quantization: 8/64 + 32/(64*256) = 0.127 bits/param).
.. [2] bitsandbytes ``functional.quantize_4bit`` (packed uint8 codes, fp32 absmax per block;
   with ``compress_statistics`` the absmax minus its mean is quantized to uint8 in blocks of 256).
.. [3] Dettmers et al. 2022, "LLM.int8(): 8-bit Matrix Multiplication for Transformers at Scale",
   arXiv:2208.07339 (int8 codes with a per-row scale).
"""

from __future__ import annotations

import sympy

from vrammath.model.params import Tensor, fp32_param_expr, size_values, tensors
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError, one_of
from vrammath.notation.symbols import E, I_e, L_e, P, h

QUANTS = ("nf4", "nf4-nodq", "int8")
NF4_BLOCK = 64  # QLoRA's block size for the first-level absmax
NF4_DQ_BLOCK = 256  # block size of the second level (double quantization)


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


#: What a 4-/8-bit load in transformers 5 (``replace_with_bnb_linear``) does with each kind of
#: parameter: quantize it (an ``nn.Linear`` weight of the decoder) or keep it in the load dtype.
#: Routed experts are 3-D parameters and the router a custom module, so both stay 16-bit (see
#: :func:`quantized_tensors`); a kind not named here is refused rather than guessed.
QLORA_QUANT_RULES: dict[str, bool] = {
    "embedding": False,
    "positions": False,
    "attention": True,
    "mlp": True,
    "shared_experts": True,
    "experts": False,
    "router": False,
    "norms": False,
    "head": False,
}


def kind_rule(rules: dict[str, bool], tensor: Tensor, field: str, what: str) -> bool:
    """Whether ``rules`` quantize ``tensor``'s kind of parameter; a kind without a rule is
    refused by name (``field`` and ``what`` name the format in the message), never guessed."""
    if tensor.component not in rules:
        raise InputError(
            field,
            f"no {what} rule for the parameter kind {tensor.component!r} ({tensor.name}); "
            f"kinds with a rule: {', '.join(rules)}",
        )
    return rules[tensor.component]


def quantized_tensors(spec: ModelSpec, *, experts: bool = False) -> list[Tensor]:
    """The tensors a 4-/8-bit load quantizes: the ``nn.Linear`` weights inside the decoder layers.

    transformers replaces every ``nn.Linear`` (and GPT-2's ``Conv1D``) but the LM head with a
    bitsandbytes layer: attention (MLA's five projections too), dense MLPs, shared experts and
    Qwen2-MoE's shared-expert gate. Embeddings, the LM head, norms and biases stay in 16 bits.

    So do a mixture-of-experts model's routed experts and router in transformers 5: the experts
    are 3-D parameters and the router a custom module, none an ``nn.Linear``, so
    ``replace_with_bnb_linear`` leaves them in the load dtype. ``experts=True`` is the layout of
    transformers 4, where each expert was three ``nn.Linear`` (``w1``, ``w3``, ``w2`` or
    ``gate_proj``, ``up_proj``, ``down_proj``), each quantized on its own: ``E L_e`` tensors of
    each shape. (The router, ``E h`` per layer, is left in 16 bits in both.)

    >>> from vrammath.model.presets import load_model
    >>> spec = load_model("mixtral-8x7b")
    >>> [t.name for t in quantized_tensors(spec)]  # doctest: +NORMALIZE_WHITESPACE
    ['self_attn.q_proj.weight', 'self_attn.k_proj.weight', 'self_attn.v_proj.weight',
     'self_attn.o_proj.weight']
    >>> [(t.name, t.shape, t.count) for t in quantized_tensors(spec, experts=True)][4:]
    [('mlp.experts.w1.weight', (I_e, h), E*L_e), ('mlp.experts.w3.weight', (I_e, h), E*L_e), ('mlp.experts.w2.weight', (h, I_e), E*L_e)]
    """
    out = [
        t
        for t in tensors(spec)
        if kind_rule(QLORA_QUANT_RULES, t, "quant", "quantization") and len(t.shape) == 2
    ]
    ex = spec.experts
    if experts and ex is not None:
        names = ex.expert_names
        out += [
            Tensor(f"mlp.experts.{name}.weight", shape, E * L_e, "experts")
            for name, shape in zip(names, ((I_e, h), (I_e, h), (h, I_e)), strict=True)
        ]
    return out


def quant_tensor_exprs(tensor: Tensor, quant: str) -> tuple[sympy.Expr, sympy.Expr]:
    """(codes, constants) bytes of one quantized tensor, as bitsandbytes stores it.

    * ``nf4``: ``ceil(n/2)`` packed codes; a uint8 absmax per 64, an fp32 absmax per 256 of those
      and the fp32 mean subtracted before (double quantization).
    * ``nf4-nodq``: ``ceil(n/2)`` codes and an fp32 absmax per 64.
    * ``int8`` (LLM.int8): ``n`` int8 codes and one fp32 scale per output row (``SCB``).

    The 16-entry NF4 code table and the 256-entry dynamic map (at most 1 KiB each) are ignored.

    >>> from vrammath.notation.symbols import L
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
    spec: ModelSpec, quant: str | None = None, base_bytes: int = 2, *, experts: bool = False
) -> dict[str, sympy.Expr]:
    """Bytes of the frozen base: ``weights`` (16-bit parts + codes) and ``quant_constants``.

    Without quantization the whole base sits in its dtype: ``base_bytes * P``, but for
    parameters transformers keeps in fp32 (DeepSeek-V3's routers). ``experts``
    quantizes a mixture-of-experts model's routed experts too (see :func:`quantized_tensors`).

    >>> from vrammath.model.presets import load_model
    >>> frozen_base_exprs(load_model("llama-7b"))
    {'weights': 2*P, 'quant_constants': 0}
    >>> from vrammath.model.params import size_values
    >>> from vrammath.terms.states import state_values
    >>> e = frozen_base_exprs(load_model("llama-7b"), "nf4")
    >>> spec = load_model("llama-7b")
    >>> [int(v.subs(state_values(spec))) for v in e.values()]
    [3762823168, 102769536]
    """
    # DeepSeek-V3's routers stay fp32 in a 16-bit (and in a quantized) base: custom modules
    fp32 = (4 - base_bytes) * fp32_param_expr(spec) if 0 < base_bytes < 4 else sympy.Integer(0)
    if quant is None:
        return {"weights": base_bytes * P + fp32, "quant_constants": sympy.Integer(0)}
    _check_quant(quant)
    codes = sympy.Integer(0)
    consts = sympy.Integer(0)
    numel = sympy.Integer(0)
    values = size_values(spec)
    for t in quantized_tensors(spec, experts=experts):
        c, k = quant_tensor_exprs(t, quant)
        if quant != "int8" and int(t.numel.subs(values)) % 2 == 0:
            c = t.numel / 2  # ceil(n/2) of an even size, written plainly
        codes += t.count * c
        consts += t.count * k
        numel += t.count * t.numel
    return {
        "weights": base_bytes * P
        + fp32
        + sympy.factor_terms(sympy.expand(codes - base_bytes * numel)),
        "quant_constants": consts,
    }


def dequant_buffer_expr(
    spec: ModelSpec, compute_bytes: int = 2, *, experts: bool = False
) -> sympy.Expr:
    """Transient bytes of dequantizing one frozen matrix for a matmul (forward or backward).

    bitsandbytes' ``MatMul4Bit`` dequantizes the whole weight to the compute dtype, one layer at
    a time: the largest quantized matrix in ``compute_bytes``.

    >>> from vrammath.model.presets import load_model
    >>> dequant_buffer_expr(load_model("llama-7b"))
    2*I*h
    """
    values = size_values(spec)
    quantized = quantized_tensors(spec, experts=experts)
    largest = max(quantized, key=lambda t: int(t.numel.subs(values)))
    return compute_bytes * largest.numel


__all__ = [
    "NF4_BLOCK",
    "NF4_DQ_BLOCK",
    "QLORA_QUANT_RULES",
    "QUANTS",
    "dequant_buffer_expr",
    "frozen_base_exprs",
    "kind_rule",
    "nf4_published_bits_per_param",
    "quant_tensor_exprs",
    "quantized_tensors",
]
