"""The notation: every symbol vrammath uses, declared once with its assumptions and meaning.

The handbook's notation page is rendered from :func:`notation`, so a symbol added here appears there.

Examples
========

>>> from vrammath.notation.symbols import b, s, h, notation
>>> (b * s * h).free_symbols == {b, s, h}
True
>>> b.is_integer and b.is_positive
True
>>> [row.name for row in notation()][:3]
['P', 'V', 'h']
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy


@dataclass(frozen=True)
class Notation:
    """One row of the notation table: the symbol, its LaTeX, its meaning and its kind."""

    name: str
    symbol: sympy.Symbol
    latex: str
    meaning: str
    kind: str  # "size", "count", "bytes", "ratio"


_TABLE: list[Notation] = []


def _declare(name: str, latex: str, meaning: str, kind: str = "size") -> sympy.Symbol:
    integer = kind in ("size", "count")
    sym = (
        sympy.Symbol(name, positive=True, integer=integer)
        if integer
        else sympy.Symbol(name, positive=True)
    )
    _TABLE.append(Notation(name, sym, latex, meaning, kind))
    return sym


# --- model sizes -----------------------------------------------------------------------------
P = _declare("P", r"\Psi", "number of model parameters (ZeRO's Psi)")
V = _declare("V", "V", "vocabulary size")
h = _declare("h", "h", "hidden size (model width)")
I = _declare("I", "I", "MLP intermediate size (4h in GPT, e.g. 11008 in LLaMA-7B)")  # noqa: E741
L = _declare("L", "L", "number of transformer layers")
a = _declare("a", "a", "number of attention (query) heads")
a_kv = _declare("a_kv", "a_{kv}", "number of key/value heads (GQA; a_kv = a is MHA, 1 is MQA)")
d = _declare("d", "d", "head dimension (head_dim; not always h/a)")
n_pos = _declare("n_pos", "n_{pos}", "number of learned position embeddings (GPT-style models)")

# --- run sizes -------------------------------------------------------------------------------
b = _declare("b", "b", "micro-batch size (sequences per GPU per step)")
s = _declare("s", "s", "sequence length (tokens per sequence)")
N_d = _declare(
    "N_d", "N_d", "data-parallel size (ranks the model states are sharded over)", "count"
)
t = _declare("t", "t", "tensor-parallel size", "count")
p = _declare("p", "p", "pipeline-parallel size (stages)", "count")
m = _declare("m", "m", "model chunks per pipeline stage (interleaved schedule)", "count")
n_mb = _declare("n_mb", "n_{mb}", "micro-batches per step (gradient accumulation)", "count")
r = _declare("r", "r", "LoRA rank")
T = _declare("T", "T", "tokens held in the KV cache per sequence (context length)")
w_win = _declare("w_win", "w", "sliding-window length of windowed attention layers")
blk = _declare("blk", "B_{blk}", "paged KV-cache block size in tokens (vLLM)")

# --- bytes per element -----------------------------------------------------------------------
B_w = _declare("B_w", "B_w", "bytes per element of the weights the model computes with", "bytes")
B_g = _declare("B_g", "B_g", "bytes per element of the gradients", "bytes")
B_m = _declare("B_m", "B_m", "bytes per element of the master weights (0 if none)", "bytes")
B_o = _declare("B_o", "B_o", "bytes per element of one optimizer state tensor", "bytes")
B_a = _declare("B_a", "B_a", "bytes per element of 16-bit activations", "bytes")
B_kv = _declare("B_kv", "B_{kv}", "bytes per element of the KV cache", "bytes")
K = _declare(
    "K", "K", "optimizer-state bytes per parameter, master copy included (ZeRO's K)", "bytes"
)

# --- mixture-of-experts and latent attention -------------------------------------------------
E = _declare("E", "E", "routed experts per MoE layer (n_routed_experts, num_experts)")
k_e = _declare("k_e", "k", "experts each token is routed to (num_experts_per_tok, top-k)")
I_e = _declare("I_e", "I_e", "intermediate size of one routed expert (moe_intermediate_size)")
I_s = _declare("I_s", "I_s", "intermediate size of the shared-expert MLP (all shared experts)")
L_e = _declare("L_e", "L_e", "number of layers whose MLP is a mixture of experts")
r_q = _declare("r_q", "r_q", "query low-rank dimension of latent attention (q_lora_rank)")
r_kv = _declare("r_kv", "r_{kv}", "key/value latent dimension of latent attention (kv_lora_rank)")
d_n = _declare("d_n", "d_n", "per-head query/key dimension without RoPE (qk_nope_head_dim)")
d_r = _declare("d_r", "d_r", "per-head query/key RoPE dimension, one key shared (qk_rope_head_dim)")
d_v = _declare("d_v", "d_v", "per-head value dimension of latent attention (v_head_dim)")
P_e = _declare("P_e", r"\Psi_e", "parameters of the routed experts (all MoE layers)")
n_ep = _declare(
    "n_ep", "e_p", "expert-parallel size (ranks the routed experts are split over)", "count"
)
P_r = _declare(
    "P_r",
    r"\Psi_r",
    "a rank's share of whole tensors: whose optimizer states it owns (ZeroRedundancyOptimizer), "
    "whose gradients it keeps (DeepSpeed ZeRO-1/2)",
)
c_f = _declare(
    "c_f", "c_f", "capacity factor: expert buffer rows over the balanced share b s k / E", "ratio"
)
f_imb = _declare(
    "f_imb",
    "f_{imb}",
    "load imbalance: busiest expert's (rank's) routed rows over the mean",
    "ratio",
)


def notation() -> list[Notation]:
    """Every declared symbol, in declaration order (the handbook's notation table)."""
    return list(_TABLE)


def by_name(name: str) -> sympy.Symbol:
    """The declared symbol called ``name``.

    >>> by_name("h")
    h
    >>> by_name("zz")
    Traceback (most recent call last):
    ...
    KeyError: "unknown symbol 'zz'; known: P, V, h, I, L, a, a_kv, d, n_pos, b, s, N_d, t, p, m, n_mb, r, T, w_win, blk, B_w, B_g, B_m, B_o, B_a, B_kv, K, E, k_e, I_e, I_s, L_e, r_q, r_kv, d_n, d_r, d_v, P_e, n_ep, P_r, c_f, f_imb"
    """
    for row in _TABLE:
        if row.name == name:
            return row.symbol
    known = ", ".join(row.name for row in _TABLE)
    raise KeyError(f"unknown symbol {name!r}; known: {known}")


__all__ = [
    "B_a",
    "B_g",
    "B_kv",
    "B_m",
    "B_o",
    "B_w",
    "E",
    "I",
    "I_e",
    "I_s",
    "K",
    "L",
    "L_e",
    "N_d",
    "Notation",
    "P",
    "P_e",
    "P_r",
    "T",
    "V",
    "a",
    "a_kv",
    "b",
    "blk",
    "by_name",
    "c_f",
    "d",
    "d_n",
    "d_r",
    "d_v",
    "f_imb",
    "h",
    "k_e",
    "m",
    "n_ep",
    "n_mb",
    "n_pos",
    "notation",
    "p",
    "r",
    "r_kv",
    "r_q",
    "s",
    "t",
    "w_win",
]
