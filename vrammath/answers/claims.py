"""The papers' published memory figures for LoRA and QLoRA, reproduced from vrammath's terms.

Each :class:`Claim` holds a figure as its paper states it, vrammath's parts of it and what the
reproduction assumes; the handbook glues them beside the paper's text.

Examples
========

>>> full6, full8, lora = lora_gpt3_claims()
>>> lora.published_bytes, round(lora.relative_error, 3)
(350000000000, -0.002)

References
==========

.. [1] Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", arXiv:2106.09685,
   section 4.2 (GPT-3 175B: 1.2 TB -> 350 GB of training VRAM with r = 4 on q and v).
.. [2] Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs", arXiv:2305.14314,
   section 3 and the abstract (65B on one 48 GB GPU; > 780 GB for 16-bit finetuning).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from vrammath.model.params import param_count
from vrammath.model.presets import load_model
from vrammath.notation.symbols import L, b, h, s
from vrammath.terms.activations.layer import hf_layer_bytes
from vrammath.terms.activations.model import hf_activation_bytes
from vrammath.terms.lora.adapters import (
    lora_activation_layer_expr,
    lora_state_exprs,
    lora_values,
)
from vrammath.terms.lora.linears import AdaptedLinear
from vrammath.terms.lora.quant import dequant_buffer_expr, frozen_base_exprs


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

    spec = load_model("gpt-175b")
    psi = param_count(spec)
    # the paper's own GPT-3 has separate W_q and W_v (h x h), not transformers' fused c_attn
    paper = [AdaptedLinear(t, f"W_{t}", h, h, L) for t in ("q", "v")]
    n_lora = int(sum(m.count * m.params for m in paper).subs(lora_values(spec, 4)))
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
      :mod:`vrammath.terms.activations.model` for a full fine-tune (an upper bound for a frozen base), plus
      the adapters' own; the dequantization buffer of one matrix is added. Paged optimizer states
      (6.4 GB) may move to the CPU when the GPU runs out, so the claim fits even with little
      headroom. CUDA context and allocator overhead are not counted.

    >>> full, q = qlora_65b_claims()
    >>> round(full.bytes / 1e9, 1), round(q.bytes / 1e9, 1), q.bytes < 48e9
    (783.4, 45.5, True)
    """

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


__all__ = ["Claim", "lora_gpt3_claims", "qlora_65b_claims"]
