"""Weights in their serving format: 16-bit, LLM.int8, GPTQ/AWQ int4 or NF4, one GPU's share.

The bytes of the weights a server holds, codes and quantization constants apart, whole or
one GPU's share under Megatron-style tensor parallelism as vLLM shards them.

Examples
========

>>> from vrammath.presets import load_model
>>> serving_weight_bytes(load_model("llama-2-7b"), "int4")
{'weights': 3762823168, 'quant_constants': 126484480}

References
==========

.. [1] Frantar et al. 2022, "GPTQ", arXiv:2210.17323; Lin et al. 2023, "AWQ", arXiv:2306.00978
   (4-bit weights with one fp16 scale and a 4-bit zero point per group of 128 inputs).
"""

from __future__ import annotations

import sympy

from vrammath.errors import one_of, positive_int
from vrammath.kv_cache import kv_heads_per_gpu_expr
from vrammath.model import ModelSpec
from vrammath.params import Tensor, param_count, size_values, tensors
from vrammath.quant import quant_tensor_exprs, quantized_tensors
from vrammath.symbols import P, a, a_kv, t
from vrammath.vocab import SERVE_WEIGHTS

INT4_GROUP = 128  # GPTQ / AWQ default group size


def _in_out(spec: ModelSpec, tensor: Tensor) -> tuple[sympy.Expr, sympy.Expr]:
    # nn.Linear stores (out, in); GPT-2's own Conv1D module stores (in, out).
    if spec.model_type == "gpt2":
        return tensor.shape[0], tensor.shape[1]
    return tensor.shape[1], tensor.shape[0]


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
    * ``nf4``: bitsandbytes NF4 with double quantization (see :mod:`vrammath.quant`).

    Embeddings, the LM head and norms stay in 16 bits. With ``tp`` each GPU holds ``1/t`` of every
    sharded matrix, a full copy of the norms (and of row-parallel biases), and
    ``max(1, a_kv // t)`` heads of k and v.

    >>> from vrammath.presets import load_model
    >>> serving_weight_exprs(load_model("llama-7b"))
    {'weights': 2*P, 'quant_constants': 0}
    """
    if weights not in SERVE_WEIGHTS:
        raise one_of("weights", weights, SERVE_WEIGHTS)
    positive_int("group", group)
    if weights in ("fp16", "bf16") and not tp:
        return {"weights": 2 * P, "quant_constants": sympy.Integer(0)}
    quantized = (
        {q.name for q in quantized_tensors(spec)} if weights not in ("fp16", "bf16") else set()
    )
    codes = sympy.Integer(0)
    consts = sympy.Integer(0)
    for tensor in tensors(spec):
        share = _tp_share(tensor) if tp else sympy.Integer(1)
        if tensor.name not in quantized:
            codes += tensor.count * share * 2 * tensor.numel
            continue
        if weights == "int4":
            fan_in, fan_out = _in_out(spec, tensor)
            c = tensor.numel / 2
            k = fan_out * sympy.ceiling(fan_in / group) * sympy.Rational(5, 2)
        else:
            c, k = quant_tensor_exprs(tensor, "nf4" if weights == "nf4" else "int8")
        codes += tensor.count * share * c
        consts += tensor.count * share * k
    return {
        "weights": sympy.factor_terms(sympy.expand(codes)),
        "quant_constants": sympy.factor_terms(sympy.expand(consts)),
    }


def serving_weight_bytes(
    spec: ModelSpec, weights: str = "bf16", *, tp: int = 1, group: int = INT4_GROUP
) -> dict[str, int]:
    """:func:`serving_weight_exprs` evaluated for one GPU (rounded up).

    >>> from vrammath.presets import load_model
    >>> serving_weight_bytes(load_model("llama-2-70b"), "bf16", tp=8)["weights"]
    17246470144
    """
    exprs = serving_weight_exprs(spec, weights, tp=tp > 1, group=group)
    values = {**size_values(spec), P: param_count(spec), t: positive_int("tp", tp)}
    return {k: int(sympy.ceiling(v.subs(values))) for k, v in exprs.items()}


__all__ = ["INT4_GROUP", "SERVE_WEIGHTS", "serving_weight_bytes", "serving_weight_exprs"]
