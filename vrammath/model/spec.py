"""ModelSpec: a decoder described by its parts, read from a Hugging Face config.json.

A :class:`ModelSpec` is a name, a ``model_type``, a layer count and four small frozen records:

* :class:`Embeddings` -- vocabulary, width, tied head, learned positions, embedding dropout;
* :class:`Attention` -- heads, KV heads, head dimension, biases, fused QKV, sliding window,
  dropout; its :attr:`~Attention.kind` is MHA, GQA or MQA;
* :class:`MLP` -- intermediate size, gated or plain, activation function, biases, dropout;
* :class:`Norms` -- RMSNorm or LayerNorm, their placement and whether the residual is parallel;

and, for mixture-of-experts and latent-attention models, two optional parts:

* :class:`Experts` -- routed experts, top-k, shared experts, router, and which layers have them;
* :class:`LatentAttention` -- multi-head latent attention (DeepSeek-V2/V3): low-rank q and kv.

Formulas read the part they depend on (``spec.mlp.gated``, ``spec.norms.kind``,
``spec.embeddings.learned_positions``), never the architecture's name. Each Hugging Face
``model_type`` has one reader in :mod:`vrammath.model.readers` that maps its config keys to these parts;
:func:`~vrammath.model.readers.from_hf_config` dispatches to it. A key that changes memory and is not modelled is refused
with an :class:`InputError`; a key no reader knows is reported in ``ModelSpec.warnings``.

Examples
========

>>> from vrammath.model.readers import from_hf_config
>>> spec = from_hf_config({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
...     "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 32000}, name="llama-7b")
>>> spec.attention.head_dim, spec.attention.kind, spec.mlp.gated, spec.norms.kind
(128, 'MHA', True, 'rmsnorm')
>>> spec.head_dim, spec.kv_heads, spec.tied_embeddings  # flat read-only views of the parts
(128, 32, False)
>>> from_hf_config({"model_type": "mamba"})
Traceback (most recent call last):
...
vrammath.notation.errors.InputError: model_type: must be one of deepseek_v3, gemma, gemma2, gemma3_text, gpt2, gpt_neox, llama, mistral, mixtral, olmo2, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe, starcoder2 (any other: measure it exactly with `vrammath derive CONFIG.json`, needs the 'measure' extra) (got 'mamba')
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

AttentionKind = Literal["MHA", "GQA", "MQA"]
NormKind = Literal["rmsnorm", "layernorm"]
QKNorm = Literal["none", "head", "projection"]
NormPlacement = Literal["pre", "sandwich", "post"]


@dataclass(frozen=True)
class Embeddings:
    """The token embedding (``vocab`` x ``hidden``), learned positions, and the LM head's tie.

    ``dropout`` is the probability applied to the embedding output (GPT-2's ``embd_pdrop``);
    ``scaled``: the embedding output is multiplied by sqrt(hidden) (Gemma); ``logit_softcap``:
    the logits pass through ``cap * tanh(logits / cap)`` (Gemma-2's ``final_logit_softcapping``).
    """

    vocab: int
    hidden: int
    tied: bool
    learned_positions: bool
    max_positions: int
    dropout: float = 0.0
    scaled: bool = False
    logit_softcap: float | None = None


@dataclass(frozen=True)
class Attention:
    """Self-attention: head counts and sizes, biases, and what the kernels keep.

    ``fused_qkv``: Q, K and V come from one projection (GPT-2's ``c_attn``, a ``Conv1D``).
    ``fused_qkv_linear``: Q, K and V come from one ``nn.Linear`` (Phi-3's ``qkv_proj``).
    ``qk_norm``: an RMSNorm on the queries and keys before RoPE, over each head (``head``:
    Qwen3, Gemma-3 with the model's norm kind) or over the whole projection (``projection``:
    OLMo-2), or ``none``.
    ``rope_fp32``: RoPE's cos and sin stay fp32 (OLMo-2 does not cast them to the activations').
    ``sliding_window``: the window in tokens, with ``window_layers`` layers using it (the rest
    attend to the whole sequence); ``last_layer_slides`` says whether the top layer is one of
    them (the layer whose backward starts first, which sets the phase peaks). ``softcap``: the
    scores pass through ``cap * tanh(scores / cap)`` (Gemma-2's ``attn_logit_softcapping``).
    ``rotary_dim``: the head dimensions RoPE rotates when not all of them (GPT-NeoX's
    ``rotary_pct``), None for all. ``dropout`` is on the attention probabilities,
    ``output_dropout`` after the output projection.

    >>> Attention(heads=64, kv_heads=8, head_dim=128, qkv_bias=True, o_bias=False).kind
    'GQA'
    """

    heads: int
    kv_heads: int
    head_dim: int
    qkv_bias: bool
    o_bias: bool
    fused_qkv: bool = False
    sliding_window: int | None = None
    window_layers: int = 0
    last_layer_slides: bool = True
    softcap: float | None = None
    rotary_dim: int | None = None
    dropout: float = 0.0
    output_dropout: float = 0.0
    fused_qkv_linear: bool = False
    qk_norm: QKNorm = "none"
    frame_mask: bool = False
    """The model also builds a boolean (1, 1, s, s) sliding-window mask it never uses (Qwen2-MoE),
    held through the layers."""
    rope_fp32: bool = False

    @property
    def kind(self) -> AttentionKind:
        """``MHA`` (a KV head per query head), ``MQA`` (one KV head) or ``GQA`` (in between)."""
        if self.kv_heads == self.heads:
            return "MHA"
        return "MQA" if self.kv_heads == 1 else "GQA"


@dataclass(frozen=True)
class MLP:
    """The feed-forward block: ``gated`` (gate, up, down: SwiGLU) or plain (up, down).

    ``activation`` is the config's function name (``silu``, ``gelu_new``, ...); ``dropout`` is
    applied to the block's output (GPT-2's ``resid_pdrop``). ``fused_gate_up``: gate and up
    come from one ``nn.Linear`` of width 2I (Phi-3's ``gate_up_proj``).
    """

    intermediate: int
    gated: bool
    activation: str
    bias: bool
    dropout: float = 0.0
    fused_gate_up: bool = False


@dataclass(frozen=True)
class Norms:
    """The normalisation layers: ``rmsnorm`` (weight) or ``layernorm`` (weight and bias).

    ``placement`` is where each block's norms sit (``pre``: before attention and before the MLP;
    ``sandwich``: Gemma-2's four, before and after each of them; ``post``: on the output of
    attention and of the MLP, before the residual add, as OLMo-2); ``unit_offset``: the norm
    computes in fp32 and scales by ``1 + weight`` (Gemma); ``parallel_residual`` would add
    attention and MLP to the same residual (GPT-NeoX). ``weight_fp32``: the RMSNorm weight
    multiplies the fp32 normalised tensor before the cast back (OLMo-2), rather than the tensor
    cast back first (LLaMA).
    """

    kind: NormKind
    placement: NormPlacement = "pre"
    unit_offset: bool = False
    parallel_residual: bool = False
    weight_fp32: bool = False


# ---------------------------------------------------------------------------------------------
# Mixture-of-experts and latent attention (the optional parts)
# ---------------------------------------------------------------------------------------------

Scoring = Literal["softmax", "sigmoid"]
MoeBlock = Literal["top-k", "deepseek-v3"]


@dataclass(frozen=True)
class Experts:
    """The mixture-of-experts MLP of the layers listed in ``layers``.

    ``count`` routed experts of intermediate size ``intermediate`` (gated SiLU, as every reader
    here has), ``top_k`` of them per token; ``shared_intermediate`` is the intermediate size of
    the always-on shared-expert MLP (0: none; DeepSeek's ``n_shared_experts * moe_intermediate``,
    Qwen2-MoE's ``shared_expert_intermediate_size``), ``shared_gate`` its sigmoid gate
    (Qwen2-MoE: a ``Linear(h, 1)``). ``router_bias``: the router keeps a per-expert
    ``e_score_correction_bias`` buffer (DeepSeek-V3; not a parameter). ``router_fp32``: the
    router's weight is kept in fp32 whatever the model's dtype (DeepSeek-V3's
    ``_keep_in_fp32_modules_strict``). ``layers`` are the 0-based indices of the MoE layers; the
    other layers have the dense :class:`MLP`.

    How transformers runs the block: ``block`` is ``top-k`` (Mixtral's and Qwen's router and
    experts) or ``deepseek-v3`` (``DeepseekV3MoE``: sigmoid scores, group-limited top-k, an fp32
    router input); ``routing_weight_bytes`` the bytes of each routing weight the combine keeps
    (Mixtral's and DeepSeek-V3's stay fp32, Qwen's are cast to the model's 16-bit dtype);
    ``expert_names`` one expert's gate, up and down projections as a quantized base names them
    (Mixtral's ``w1``, ``w3``, ``w2``); ``peft_v4_names`` the names transformers 4 gave them,
    which peft 0.21.2 rewrites onto the 3-D experts (None: peft keeps the model's own names, as
    on Qwen2-MoE).

    >>> Experts(count=8, top_k=2, intermediate=14336, layers=tuple(range(32))).active_fraction
    Fraction(1, 4)
    """

    count: int
    top_k: int
    intermediate: int
    layers: tuple[int, ...]
    shared_intermediate: int = 0
    shared_gate: bool = False
    router_bias: bool = False
    router_fp32: bool = False
    norm_topk: bool = False
    scoring: Scoring = "softmax"
    groups: int = 1
    groups_chosen: int = 1
    """The groups chosen in DeepSeek-V3's group-limited routing (``topk_group`` of ``n_group``)."""
    block: MoeBlock = "top-k"
    routing_weight_bytes: int = 2
    expert_names: tuple[str, str, str] = ("gate", "up", "down")
    peft_v4_names: tuple[str, str, str] | None = None

    @property
    def active_fraction(self) -> Fraction:
        """Routed experts a token uses, as a fraction of all of them (``top_k / count``)."""
        return Fraction(self.top_k, self.count)


@dataclass(frozen=True)
class LatentAttention:
    """Multi-head latent attention (DeepSeek-V2/V3): queries and keys/values through low ranks.

    ``q_rank`` (``q_lora_rank``; None: a full ``q_proj``), ``kv_rank`` (``kv_lora_rank``),
    ``nope_dim`` / ``rope_dim`` (per-head query/key dimensions without and with RoPE; the RoPE
    key is one head shared by all), ``v_dim`` (per-head value dimension). The compressed cache
    holds ``kv_rank + rope_dim`` elements per token and layer.

    >>> LatentAttention(q_rank=1536, kv_rank=512, nope_dim=128, rope_dim=64, v_dim=128).cached
    576
    """

    q_rank: int | None
    kv_rank: int
    nope_dim: int
    rope_dim: int
    v_dim: int

    @property
    def cached(self) -> int:
        """The elements cached per token per layer (the latent plus the shared RoPE key)."""
        return self.kv_rank + self.rope_dim


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of a decoder-only transformer, as far as memory is concerned.

    All sizes are element counts. ``warnings`` holds one line per config key that no reader knows
    (the estimate ignores it; the CLI prints them).
    """

    name: str
    model_type: str
    layers: int
    embeddings: Embeddings
    attention: Attention
    mlp: MLP
    norms: Norms
    warnings: tuple[str, ...] = ()
    experts: Experts | None = None
    latent: LatentAttention | None = None
    mtp_layers: int = 0
    """Multi-token-prediction modules in the checkpoint that transformers does not build
    (DeepSeek-V3's ``num_nextn_predict_layers``): counted apart, never in the model's total."""

    # Flat read-only views of the parts, for callers written before the parts existed.

    @property
    def hidden(self) -> int:
        """Model width h (the embedding's)."""
        return self.embeddings.hidden

    @property
    def vocab(self) -> int:
        """Vocabulary size V."""
        return self.embeddings.vocab

    @property
    def tied_embeddings(self) -> bool:
        """The LM head shares the token embedding's weight."""
        return self.embeddings.tied

    @property
    def learned_positions(self) -> bool:
        """A learned position embedding (GPT-2); RoPE models have none."""
        return self.embeddings.learned_positions

    @property
    def max_positions(self) -> int:
        """Positions the model is configured for (rows of a learned position embedding)."""
        return self.embeddings.max_positions

    def past_context(self, field: str, tokens: int) -> str | None:
        """A line when ``tokens`` (the setup's ``field``) runs past the positions the model is
        configured for, else None."""
        limit = self.max_positions
        if tokens <= limit:
            return None
        return f"{field} {tokens} exceeds the model's max_position_embeddings ({limit})"

    def context_warnings(self, field: str, tokens: int) -> tuple[str, ...]:
        """The model's own warnings, and :meth:`past_context`'s line (``setup_warnings`` and
        ``serve_warnings``)."""
        past = self.past_context(field, tokens)
        return self.warnings + (() if past is None else (past,))

    @property
    def heads(self) -> int:
        """Query heads a."""
        return self.attention.heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads a_kv."""
        return self.attention.kv_heads

    @property
    def head_dim(self) -> int:
        """Head dimension d (not always hidden / heads)."""
        return self.attention.head_dim

    @property
    def qkv_bias(self) -> bool:
        """Q, K and V projections have biases."""
        return self.attention.qkv_bias

    @property
    def o_bias(self) -> bool:
        """The attention output projection has a bias."""
        return self.attention.o_bias

    @property
    def sliding_window(self) -> int | None:
        """The sliding-window size in tokens, or None."""
        return self.attention.sliding_window

    @property
    def intermediate(self) -> int:
        """MLP intermediate size I."""
        return self.mlp.intermediate

    @property
    def gated_mlp(self) -> bool:
        """Three MLP matrices (gate, up, down) rather than two."""
        return self.mlp.gated

    @property
    def mlp_bias(self) -> bool:
        """The MLP's linear layers have biases."""
        return self.mlp.bias

    @property
    def conv1d(self) -> bool:
        """Whether this is GPT-2's block (a fused QKV with learned positions), whose ``Conv1D``
        layers store their weights (in, out) where ``nn.Linear`` stores (out, in)."""
        return self.attention.fused_qkv and self.embeddings.learned_positions

    @property
    def norm(self) -> NormKind:
        """``rmsnorm`` (weight only) or ``layernorm`` (weight and bias)."""
        return self.norms.kind


__all__ = [
    "MLP",
    "Attention",
    "Embeddings",
    "Experts",
    "LatentAttention",
    "ModelSpec",
    "Norms",
]
