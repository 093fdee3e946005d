"""Weights in their serving format: 16-bit, LLM.int8, GPTQ/AWQ int4, NF4, fp8 or MXFP4, one GPU's
share.

The bytes of the weights a server holds, codes and quantization constants apart, whole or
one GPU's share under Megatron-style tensor parallelism as vLLM shards them.

Examples
========

>>> from vrammath.model.presets import load_model
>>> serving_weight_bytes(load_model("llama-2-7b"), "int4")
{'weights': 3762823168, 'quant_constants': 126484480}

References
==========

.. [1] Frantar et al. 2022, "GPTQ", arXiv:2210.17323; Lin et al. 2023, "AWQ", arXiv:2306.00978
   (4-bit weights with one fp16 scale and a 4-bit zero point per group of 128 inputs).
.. [2] vLLM, ``vllm/model_executor/models/mixtral.py`` (``MixtralMoE``: the router is a
   ``ReplicatedLinear`` built with ``quant_config=None``, the experts a ``FusedMoE`` built with
   the checkpoint's ``quant_config``), ``vllm/model_executor/layers/quantization/gptq.py``,
   ``awq.py`` and ``bitsandbytes.py`` (``BitsAndBytesMoEMethod``): a quantized serving
   checkpoint quantizes every linear layer of the decoder, routed experts included; GPTQModel /
   AutoAWQ leave ``lm_head`` and the embeddings in 16 bits.
.. [3] fp8 checkpoints as vLLM loads them (``vllm/model_executor/layers/quantization/fp8.py``,
   ``compressed_tensors/schemes/compressed_tensors_w8a8_fp8.py``): e4m3 codes, one byte per
   weight, with fp32 ``weight_scale`` per output channel (llm-compressor's FP8-Dynamic), per
   matrix (per-tensor checkpoints; a static scheme's fp32 ``input_scale`` per matrix, a few
   kilobytes in all, is not counted) or per 128 x 128 block (``weight_block_size``, DeepSeek-V3
   and Qwen3's FP8 releases). On GPUs without fp8 kernels vLLM repacks them for Marlin.
.. [4] OCP Microscaling Formats (MX) v1.0: MXFP4 is e2m1 values, two per byte, with one e8m0
   scale byte per 32 elements; gpt-oss ships its routed experts in it and every other weight
   in bf16 (its ``quantization_config``: ``modules_to_not_convert`` attention, router,
   embeddings and head).
"""

from __future__ import annotations

import sympy

from vrammath.model.params import Tensor, param_count, size_values, tensors
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError, one_of, positive_int
from vrammath.notation.symbols import P, a, a_kv, t
from vrammath.notation.vocab import SERVE_WEIGHTS
from vrammath.serve.kv_cache import kv_heads_per_gpu_expr
from vrammath.terms.lora.quant import kind_rule, quant_tensor_exprs

INT4_GROUP = 128  # GPTQ / AWQ default group size
FP8_BLOCK = 128  # weight_block_size of block-scaled fp8 checkpoints
MXFP4_BLOCK = 32  # elements per e8m0 scale (OCP MX)

#: What a quantized serving checkpoint (GPTQ / AWQ int4, bitsandbytes NF4 and LLM.int8, as vLLM
#: loads them; sources in the module's references) does with each kind of parameter: quantize
#: its matrices, or keep them in 16 bits. Biases (1-D) stay in 16 bits whatever the kind.
#: A kind not named here is refused rather than guessed.
SERVE_QUANT_RULES: dict[str, bool] = {
    "embedding": False,  # the input embedding is a lookup table, not a linear layer
    "positions": False,
    "attention": True,  # q/k/v/o, fused qkv, MLA's five projections
    "mlp": True,
    "shared_experts": True,
    "experts": True,  # every routed expert's gate/up/down matrices (FusedMoE with quant_config)
    "router": False,  # vLLM builds the router with quant_config=None
    "norms": False,
    "head": False,  # lm_head is excluded by GPTQModel, AutoAWQ and bitsandbytes
}


#: what MXFP4 quantizes as gpt-oss ships it, the routed experts only (all else stays 16-bit)
MXFP4_RULES: dict[str, bool] = {
    **dict.fromkeys(SERVE_QUANT_RULES, False),
    "experts": True,
}


def _in_out(spec: ModelSpec, tensor: Tensor) -> tuple[sympy.Expr, sympy.Expr]:
    # nn.Linear stores (out, in); GPT-2's own Conv1D module stores (in, out).
    if spec.conv1d:
        return tensor.shape[0], tensor.shape[1]
    return tensor.shape[1], tensor.shape[0]


def serve_matrices(
    spec: ModelSpec, rules: dict[str, bool] = SERVE_QUANT_RULES
) -> list[tuple[Tensor, bool]]:
    """Every parameter tensor as a serving checkpoint stores it, with whether ``rules`` (by
    default :data:`SERVE_QUANT_RULES`) quantize it.

    A stacked expert tensor ``(E, out, in)`` is ``E`` matrices ``(out, in)``, each quantized on
    its own (its own groups, its own row scales), as a checkpoint stores one per expert.

    >>> from vrammath.model.presets import load_model
    >>> [(m.name, m.shape, m.count, q) for m, q in serve_matrices(load_model("mixtral-8x7b"))
    ...  if m.component in ("experts", "router")]  # doctest: +NORMALIZE_WHITESPACE
    [('mlp.gate.weight', (E, h), L_e, False),
     ('mlp.experts.gate_up_proj', (2*I_e, h), E*L_e, True),
     ('mlp.experts.down_proj', (h, I_e), E*L_e, True)]
    """
    out: list[tuple[Tensor, bool]] = []
    for tensor in tensors(spec):
        rule = kind_rule(rules, tensor, "weights", "serving-format")
        quantized = rule and len(tensor.shape) >= 2
        stored = tensor
        if tensor.component == "experts" and len(tensor.shape) == 3:
            experts, rows, cols = tensor.shape
            stored = Tensor(tensor.name, (rows, cols), tensor.count * experts, tensor.component)
        out.append((stored, quantized))
    return out


def _tp_share(tensor: Tensor) -> sympy.Expr:
    """Fraction of a tensor one GPU holds under Megatron-style tensor parallelism (vLLM)."""
    name = tensor.name
    if tensor.component == "norms" or name.endswith("o_proj.bias") or "down_proj.bias" in name:
        return sympy.Integer(1)  # replicated
    # vLLM replicates the MoE router, Qwen2-MoE's shared-expert gate and MLA's down-projections
    replicated = ("mlp.gate.weight", "shared_expert_gate", "q_a_proj", "kv_a_proj_with_mqa")
    if any(part in name for part in replicated):
        return sympy.Integer(1)
    if ".k_proj." in name or ".v_proj." in name:
        return kv_heads_per_gpu_expr() / a_kv
    if ".qkv_proj." in name:  # fused (Phi-3): Q split over t, K and V as their heads are
        return (a / t + 2 * kv_heads_per_gpu_expr()) / (a + 2 * a_kv)
    if "c_proj.bias" in name:
        return sympy.Integer(1)
    return 1 / t


def serving_weight_exprs(
    spec: ModelSpec, weights: str = "bf16", *, tp: bool = False, group: int = INT4_GROUP
) -> dict[str, sympy.Expr]:
    """Bytes of the weights (codes + 16-bit parts) and of their quantization constants.

    * ``fp16`` / ``bf16``: 2 bytes per parameter.
    * ``int8``: bitsandbytes LLM.int8: int8 codes and an fp32 scale per output row.
    * ``int4``: GPTQ/AWQ layout: packed 4-bit codes, an fp16 scale and a packed 4-bit zero
      point per ``group`` inputs of every output (2.5 bytes per group; GPTQ's optional ``g_idx``,
      4 bytes per input row, is not counted).
    * ``nf4``: bitsandbytes NF4 with double quantization (see :mod:`vrammath.terms.lora.quant`).
    * ``fp8``, ``fp8-tensor``, ``fp8-block``: one byte per weight and an fp32 scale per output
      channel, per matrix, or per block of 128 x 128.
    * ``mxfp4``: half a byte per weight and one scale byte per 32 inputs of every output, for
      the routed experts only (:data:`MXFP4_RULES`; a model without routed experts is refused).

    What is quantized follows :data:`SERVE_QUANT_RULES` (MXFP4 apart): every linear layer of the decoder,
    routed experts included (each expert's matrices on their own); embeddings, the LM head, the
    router, norms and biases stay in 16 bits. With ``tp`` each GPU holds ``1/t`` of every
    sharded matrix (an expert's intermediate dimension too, as vLLM's tensor-parallel MoE
    splits it), a full copy of the norms, the router (and of row-parallel biases), and
    ``max(1, a_kv // t)`` heads of k and v.

    >>> from vrammath.model.presets import load_model
    >>> serving_weight_exprs(load_model("llama-7b"))
    {'weights': 2*P, 'quant_constants': 0}
    """
    if weights not in SERVE_WEIGHTS:
        raise one_of("weights", weights, SERVE_WEIGHTS)
    positive_int("group", group)
    if weights in ("fp16", "bf16") and not tp:
        return {"weights": 2 * P, "quant_constants": sympy.Integer(0)}
    if weights == "mxfp4" and spec.experts is None:
        raise InputError(
            "weights",
            "mxfp4 quantizes routed experts only, as gpt-oss ships it; "
            f"{spec.name} has none (its weights would all stay in 16 bits)",
            weights,
        )
    codes = sympy.Integer(0)
    consts = sympy.Integer(0)
    rules = MXFP4_RULES if weights == "mxfp4" else SERVE_QUANT_RULES
    for tensor, quantized in serve_matrices(spec, rules):
        share = _tp_share(tensor) if tp else sympy.Integer(1)
        if not quantized or weights in ("fp16", "bf16"):
            codes += tensor.count * share * 2 * tensor.numel
            continue
        c, k = _quantized(spec, tensor, weights, group)
        codes += tensor.count * share * c
        consts += tensor.count * share * k
    return {
        "weights": sympy.factor_terms(sympy.expand(codes)),
        "quant_constants": sympy.factor_terms(sympy.expand(consts)),
    }


def _quantized(
    spec: ModelSpec, tensor: Tensor, weights: str, group: int
) -> tuple[sympy.Expr, sympy.Expr]:
    """Bytes of one quantized matrix: its codes and its quantization constants."""
    fan_in, fan_out = _in_out(spec, tensor)
    if weights == "int4":
        return tensor.numel / 2, fan_out * sympy.ceiling(fan_in / group) * sympy.Rational(5, 2)
    if weights == "fp8":
        return tensor.numel, 4 * fan_out
    if weights == "fp8-tensor":
        return tensor.numel, sympy.Integer(4)
    if weights == "fp8-block":
        blocks = sympy.ceiling(fan_out / FP8_BLOCK) * sympy.ceiling(fan_in / FP8_BLOCK)
        return tensor.numel, 4 * blocks
    if weights == "mxfp4":
        return tensor.numel / 2, fan_out * sympy.ceiling(fan_in / MXFP4_BLOCK)
    return quant_tensor_exprs(tensor, "nf4" if weights == "nf4" else "int8")


def serving_weight_bytes(
    spec: ModelSpec, weights: str = "bf16", *, tp: int = 1, group: int = INT4_GROUP
) -> dict[str, int]:
    """:func:`serving_weight_exprs` evaluated for one GPU (rounded up).

    >>> from vrammath.model.presets import load_model
    >>> serving_weight_bytes(load_model("llama-2-70b"), "bf16", tp=8)["weights"]
    17246470144
    """
    exprs = serving_weight_exprs(spec, weights, tp=tp > 1, group=group)
    values = {**size_values(spec), P: param_count(spec), t: positive_int("tp", tp)}
    return {k: int(sympy.ceiling(v.subs(values))) for k, v in exprs.items()}


__all__ = [
    "FP8_BLOCK",
    "INT4_GROUP",
    "MXFP4_BLOCK",
    "MXFP4_RULES",
    "SERVE_QUANT_RULES",
    "SERVE_WEIGHTS",
    "serve_matrices",
    "serving_weight_bytes",
    "serving_weight_exprs",
]
