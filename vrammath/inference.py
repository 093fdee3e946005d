"""Serving memory: weights in their storage format, the KV cache, and what fits on one GPU.

The KV cache of a decoder keeps, for every layer, one key and one value vector per KV head per
token: ``2 L a_kv d`` elements per token (vLLM's ``cache_engine``), in the cache dtype ``B_kv``.
Grouped-query attention shrinks it by ``a / a_kv`` (MQA is ``a_kv = 1``); ``d`` is the explicit
head dimension. Under tensor parallelism each GPU holds ``max(1, a_kv // t)`` of the heads: once
``t`` exceeds ``a_kv`` the heads are replicated, not split. Sliding-window layers hold at most
``w`` tokens. A paged cache (vLLM) allocates whole blocks of ``B_blk`` tokens, so a sequence of
``T`` tokens holds ``ceil(T / B_blk)`` blocks, its last one partly empty.

Examples
========

>>> from vrammath.presets import load_model
>>> kv_cache_expr(load_model("llama-2-7b"))
2*B_kv*L*T*a_kv*b*d
>>> kv_bytes_per_token(load_model("llama-2-7b")) // 1024, kv_bytes_per_token(load_model("llama-2-70b")) // 1024
(512, 320)
>>> kv_bytes_per_token(load_model("llama-2-70b"), tp=16) // 1024  # 8 KV heads over 16 GPUs: 1 each
40

References
==========

.. [1] Kwon et al. 2023, "Efficient Memory Management for Large Language Model Serving with
   PagedAttention" (vLLM), arXiv:2309.06180; ``vllm/worker/cache_engine.py`` (per-token bytes
   ``2 * L * n_kv * d_head * dtype``; heads per GPU ``max(1, n_kv // t)``).
.. [2] Ainslie et al. 2023, "GQA", arXiv:2305.13245; Shazeer 2019, "Fast Transformer Decoding:
   One Write-Head is All You Need" (MQA), arXiv:1911.02150.
.. [3] Jiang et al. 2023, "Mistral 7B", arXiv:2310.06825 (sliding-window attention).
.. [4] Frantar et al. 2022, "GPTQ", arXiv:2210.17323; Lin et al. 2023, "AWQ", arXiv:2306.00978
   (4-bit weights with one fp16 scale and a 4-bit zero point per group of 128 inputs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from vrammath.errors import InputError, one_of, positive_int
from vrammath.fields import MAX_COUNT, MAX_TOKENS, check_bounds, option
from vrammath.model import ModelSpec
from vrammath.params import Tensor, param_count, size_values, tensors
from vrammath.presets import GPU, gpu
from vrammath.quant import quant_tensor_exprs, quantized_tensors
from vrammath.symbols import B_kv, L, P, T, a, a_kv, b, blk, d, d_n, d_r, d_v, r_kv, t, w_win
from vrammath.units import dtype_bytes
from vrammath.vocab import KV_DTYPES, SERVE_WEIGHTS, KvDtype, ServeWeights, check

INT4_GROUP = 128  # GPTQ / AWQ default group size


def kv_heads_per_gpu_expr() -> sympy.Expr:
    """KV heads one GPU holds under tensor parallelism: ``max(1, a_kv // t)`` (vLLM).

    >>> kv_heads_per_gpu_expr().subs({a_kv: 8, t: 16})
    1
    """
    return sympy.Max(1, sympy.floor(a_kv / t))


def kv_cache_expr(
    spec: ModelSpec,
    *,
    tp: bool = False,
    paged: bool = False,
    window_layers: int | None = None,
    keep_window_minus_one: bool = False,
) -> sympy.Expr:
    """Bytes of the KV cache for ``b`` sequences of ``T`` tokens, as an expression.

    * ``tp``: per GPU under tensor parallelism (``a_kv`` becomes ``max(1, a_kv // t)``).
    * ``paged``: whole blocks of ``B_blk`` tokens per sequence (vLLM's PagedAttention).
    * ``window_layers``: how many layers use a sliding window of ``w`` tokens (default: all of
      them when the model has a ``sliding_window``, else none).
    * ``keep_window_minus_one``: transformers' ``DynamicSlidingWindowLayer`` keeps ``w - 1``
      tokens between steps; a static or paged cache holds ``w``.

    Latent attention (DeepSeek-V2/V3) caches ``r_kv + d_r`` elements per token and layer (the
    compressed latent and the one shared RoPE key, :func:`mla_kv_elements`), whole on every
    tensor-parallel rank (vLLM and SGLang replicate it; transformers 5 caches the same two
    tensors, as one-head "key" and "value").

    >>> from vrammath.presets import load_model
    >>> kv_cache_expr(load_model("deepseek-v3"), tp=True)
    B_kv*L*T*b*(d_r + r_kv)

    >>> from vrammath.presets import load_model
    >>> kv_cache_expr(load_model("mistral-7b"))
    2*B_kv*L*a_kv*b*d*Min(T, w_win)
    >>> kv_cache_expr(load_model("llama-2-7b"), tp=True, paged=True)
    2*B_kv*L*b*blk*d*ceiling(T/blk)*Max(1, floor(a_kv/t))
    """
    heads = kv_heads_per_gpu_expr() if tp else a_kv
    n_win = _window_layers(spec, window_layers)
    window = w_win - 1 if keep_window_minus_one else w_win

    def held(tokens: sympy.Expr) -> sympy.Expr:
        return blk * sympy.ceiling(tokens / blk) if paged else tokens

    per_token_layer = 2 * heads * d * B_kv * b
    if spec.latent is not None:
        per_token_layer = mla_kv_elements(spec) * B_kv * b
    if n_win == 0:
        return L * per_token_layer * held(T)
    win = held(sympy.Min(T, window))
    if n_win == spec.layers:
        return L * per_token_layer * win
    return per_token_layer * ((L - n_win) * held(T) + n_win * win)


def mla_kv_elements(spec: ModelSpec, *, decompressed: bool = False) -> sympy.Expr:
    """Elements one token adds to one layer's cache under latent attention.

    Compressed (``r_kv + d_r``): what transformers 5.24's ``DeepseekV3Attention`` caches
    ("cache read / write is performed while latent KV is still compressed") and what vLLM's and
    SGLang's MLA backends keep. ``decompressed``: the per-head keys ``a (d_n + d_r)`` and values
    ``a d_v`` that a cache of expanded K/V would hold (the Hub's original remote
    ``modeling_deepseek.py`` caches these).

    >>> from vrammath.presets import load_model
    >>> spec = load_model("deepseek-v3")
    >>> mla_kv_elements(spec), mla_kv_elements(spec, decompressed=True)
    (d_r + r_kv, a*(d_n + d_r + d_v))
    >>> [int(e.subs(size_values(spec))) for e in _ + ()]
    [576, 40960]
    """
    if spec.latent is None:
        raise InputError("model", "has no latent attention (MLA)", got=spec.name)
    if decompressed:
        return a * (d_n + d_r + d_v)
    return r_kv + d_r


def _window_layers(spec: ModelSpec, window_layers: int | None) -> int:
    if window_layers is None:
        return spec.attention.window_layers if spec.sliding_window is not None else 0
    if isinstance(window_layers, bool) or not isinstance(window_layers, int):
        raise InputError("window_layers", f"must be an integer 0..{spec.layers}", got=window_layers)
    if not 0 <= window_layers <= spec.layers:
        raise InputError("window_layers", f"must be an integer 0..{spec.layers}", got=window_layers)
    if window_layers and spec.sliding_window is None:
        raise InputError("window_layers", "needs a model with a sliding_window", got=window_layers)
    return window_layers


def kv_dtype_bytes(kv_dtype: str) -> int:
    """Bytes per element of a KV-cache dtype.

    >>> kv_dtype_bytes("fp8-e4m3")
    1
    """
    if kv_dtype not in KV_DTYPES:
        raise one_of("kv_dtype", kv_dtype, KV_DTYPES)
    return int(dtype_bytes(kv_dtype))


def kv_values(
    spec: ModelSpec,
    *,
    batch: int = 1,
    context: int = 1,
    kv_dtype: str = "fp16",
    tp: int = 1,
    block: int = 16,
) -> dict[sympy.Symbol, int]:
    """Substitutions for :func:`kv_cache_expr`: model sizes, ``b``, ``T``, ``B_kv``, ``t``,
    ``B_blk`` and the window ``w`` (the context itself when the model has none)."""
    positive_int("batch", batch)
    positive_int("context", context)
    positive_int("tp", tp)
    positive_int("block", block)
    return {
        **size_values(spec),
        b: batch,
        T: context,
        B_kv: kv_dtype_bytes(kv_dtype),
        t: tp,
        blk: block,
        w_win: spec.sliding_window if spec.sliding_window is not None else context,
    }


def kv_cache_bytes(
    spec: ModelSpec,
    batch: int = 1,
    context: int = 1,
    kv_dtype: str = "fp16",
    *,
    tp: int = 1,
    block: int | None = None,
    window_layers: int | None = None,
    keep_window_minus_one: bool = False,
) -> int:
    """Exact KV-cache bytes on one GPU (``block=None``: unpaged, exactly ``T`` tokens).

    >>> from vrammath.presets import load_model
    >>> kv_cache_bytes(load_model("llama-2-7b"), 1, 4096) == 4096 * 512 * 1024
    True
    >>> kv_cache_bytes(load_model("llama-2-7b"), 1, 17, block=16) == 32 * 512 * 1024
    True
    """
    if block is not None:
        positive_int("block", block)  # 0 is refused, not read as unpaged
    expr = kv_cache_expr(
        spec,
        tp=tp > 1,
        paged=block is not None,
        window_layers=window_layers,
        keep_window_minus_one=keep_window_minus_one,
    )
    values = kv_values(
        spec, batch=batch, context=context, kv_dtype=kv_dtype, tp=tp, block=block or 1
    )
    return int(expr.subs(values))


def kv_bytes_per_token(spec: ModelSpec, kv_dtype: str = "fp16", *, tp: int = 1) -> int:
    """KV bytes one token adds on one GPU (no window): ``2 L max(1, a_kv // t) d B_kv``, or
    ``L (r_kv + d_r) B_kv`` under latent attention.

    >>> from vrammath.presets import load_model
    >>> ds, llama = load_model("deepseek-v3"), load_model("llama-3.1-405b")
    >>> kv_bytes_per_token(ds), kv_bytes_per_token(llama)
    (70272, 516096)
    """
    return kv_cache_bytes(spec, 1, 1, kv_dtype, tp=tp, window_layers=0)


# ----------------------------------------------------------------------------------------------
# Weights in their serving format
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# What fits: one serving setup on one GPU
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Serve:
    """One serving setup: model, weight format, KV cache, parallelism, and the GPU's budget.

    ``gpu_util`` is the fraction of the GPU the server may use for weights + KV cache (vLLM's
    ``gpu_memory_utilization``, default 0.9); the rest is the stated runtime reserve (CUDA context,
    activations of the forward pass, allocator slack). ``block=None`` is an unpaged cache. Each
    field is declared once with its CLI flag and bounds (:mod:`vrammath.fields`).

    >>> from vrammath.presets import load_model
    >>> Serve(load_model("llama-2-70b"), tp=3)
    Traceback (most recent call last):
    ...
    vrammath.errors.InputError: tp: must divide the attention heads (64) (got 3)
    """

    model: ModelSpec
    context: int = field(
        default=4096,
        metadata=option(
            "--context", f"tokens per sequence (1..{MAX_TOKENS})", low=1, high=MAX_TOKENS
        ),
    )
    batch: int = field(
        default=1,
        metadata=option(
            "--batch", f"sequences (1..{MAX_TOKENS})", low=1, high=MAX_TOKENS, short="-b"
        ),
    )
    weights: ServeWeights = field(
        default="bf16",
        metadata=option(
            "--weights", "weight format: " + ", ".join(SERVE_WEIGHTS), choices=SERVE_WEIGHTS
        ),
    )
    kv_dtype: KvDtype = field(
        default="bf16",
        metadata=option("--kv-dtype", "KV-cache dtype: " + ", ".join(KV_DTYPES), choices=KV_DTYPES),
    )
    tp: int = field(
        default=1,
        metadata=option(
            "--tp",
            "tensor-parallel GPUs (divides the heads; KV heads replicated past their count)",
            low=1,
            high=MAX_COUNT,
        ),
    )
    block: int | None = field(
        default=16,
        metadata=option(
            "--block", f"paged KV block size in tokens (1..{MAX_COUNT})", low=1, high=MAX_COUNT
        ),
    )
    gpu: str | None = field(
        default=None, metadata=option("--gpu", "GPU preset to check the fit against", kind="gpu")
    )
    gpu_util: float = field(
        default=0.9,
        metadata=option(
            "--gpu-util",
            "fraction of the GPU for weights + KV (vLLM's gpu_memory_utilization; default 0.9)",
            kind="fraction",
        ),
    )
    group: int = field(
        default=INT4_GROUP,
        metadata=option(None, "int4 quantization group size", low=1, high=MAX_COUNT),
    )

    def __post_init__(self) -> None:
        if not isinstance(self.model, ModelSpec):
            raise InputError(
                "model", "must be a ModelSpec (see vrammath.load_model)", type(self.model).__name__
            )
        check_bounds(self)
        check("weights", self.weights, SERVE_WEIGHTS)
        check("kv_dtype", self.kv_dtype, KV_DTYPES)
        if self.gpu is not None:
            if not isinstance(self.gpu, str):
                raise InputError("gpu", "must be a GPU preset name", self.gpu)
            gpu(self.gpu)
        if (
            isinstance(self.gpu_util, bool)
            or not isinstance(self.gpu_util, int | float)
            or not 0 < self.gpu_util <= 1
        ):
            raise InputError("gpu_util", "must be a number in (0, 1]", got=self.gpu_util)
        spec = self.model
        if self.tp > spec.heads or spec.heads % self.tp:
            raise InputError("tp", f"must divide the attention heads ({spec.heads})", self.tp)
        if spec.kv_heads % self.tp and self.tp % spec.kv_heads:
            raise InputError(
                "tp",
                f"must divide the KV heads ({spec.kv_heads}) or be a multiple of them (each KV "
                "head is then replicated, as vLLM does)",
                self.tp,
            )


@dataclass(frozen=True)
class ServeEstimate:
    """Weights, KV cache and reserve on one GPU for a :class:`Serve`, and the fit."""

    setup: Serve
    weights_bytes: int
    quant_constants_bytes: int
    kv_bytes: int
    kv_expr: sympy.Expr
    per_token_bytes: int
    block_bytes: int | None

    @property
    def gpu_spec(self) -> GPU | None:
        """The GPU preset, if named."""
        return None if self.setup.gpu is None else gpu(self.setup.gpu)

    @property
    def reserve_bytes(self) -> int:
        """The stated runtime reserve, ``(1 - gpu_util)`` of the GPU (0 without a GPU)."""
        spec = self.gpu_spec
        return 0 if spec is None else spec.bytes - int(spec.bytes * self.setup.gpu_util)

    @property
    def total_bytes(self) -> int:
        """Weights + constants + KV cache (the reserve is not in it)."""
        return self.weights_bytes + self.quant_constants_bytes + self.kv_bytes

    @property
    def kv_budget_bytes(self) -> int | None:
        """What is left for the KV cache after the weights and the reserve."""
        spec = self.gpu_spec
        if spec is None:
            return None
        return spec.bytes - self.reserve_bytes - self.weights_bytes - self.quant_constants_bytes

    def fits(self) -> bool | None:
        """Whether weights + KV cache fit within ``gpu_util`` of the GPU."""
        budget = self.kv_budget_bytes
        return None if budget is None else self.kv_bytes <= budget

    def _seq_bytes(self, context: int) -> int:
        s = self.setup
        return kv_cache_bytes(s.model, 1, context, s.kv_dtype, tp=s.tp, block=s.block)

    def max_batch(self, context: int | None = None) -> int | None:
        """Most sequences of ``context`` tokens (default the setup's) whose cache fits."""
        budget = self.kv_budget_bytes
        if budget is None:
            return None
        per_seq = self._seq_bytes(self.setup.context if context is None else context)
        return max(budget, 0) // per_seq

    def max_context(self, batch: int | None = None, limit: int = 1 << 24) -> int | None:
        """Longest context (tokens per sequence) for ``batch`` sequences; ``limit`` if even that
        fits (all-sliding-window models stop growing), None without a GPU."""
        budget = self.kv_budget_bytes
        if budget is None:
            return None
        n = self.setup.batch if batch is None else batch
        if n * self._seq_bytes(1) > budget:
            return 0
        if n * self._seq_bytes(limit) <= budget:
            return limit
        lo, hi = 1, limit  # lo fits, hi does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if n * self._seq_bytes(mid) <= budget:
                lo = mid
            else:
                hi = mid
        return lo

    @property
    def total_with_reserve_bytes(self) -> int:
        """All of the GPU the server takes (weights + constants + KV cache + the runtime reserve)."""
        return self.total_bytes + self.reserve_bytes

    def as_dict(self) -> dict[str, object]:
        """Machine-readable form, bytes as integers (see :func:`vrammath.report.serve_dict`)."""
        from vrammath.report import serve_dict

        return serve_dict(self)

    def table(self) -> str:
        """Plain-text breakdown (see :func:`vrammath.report.serve_table`)."""
        from vrammath.report import serve_table

        return serve_table(self)


def serve_warnings(setup: Serve) -> tuple[str, ...]:
    """What a serving setup is allowed to do but should be told: the model's own warnings, and a
    context longer than the model was trained for.

    >>> from vrammath.presets import load_model
    >>> serve_warnings(Serve(load_model("gpt2"), context=2048))
    ("context 2048 exceeds the model's max_position_embeddings (1024)",)
    """
    out = list(getattr(setup.model, "warnings", ()))
    if setup.context > setup.model.max_positions:
        out.append(
            f"context {setup.context} exceeds the model's max_position_embeddings "
            f"({setup.model.max_positions})"
        )
    return tuple(out)


def serve(setup: Serve) -> ServeEstimate:
    """Evaluate a serving setup on one GPU.

    >>> from vrammath.presets import load_model
    >>> est = serve(Serve(load_model("llama-2-7b"), context=4096, batch=8, gpu="A100-80GB"))
    >>> est.kv_bytes == 8 * 4096 * 512 * 1024, est.max_batch()
    (True, 29)
    """
    spec = setup.model
    w = serving_weight_bytes(spec, setup.weights, tp=setup.tp, group=setup.group)
    expr = kv_cache_expr(spec, tp=setup.tp > 1, paged=setup.block is not None)
    values = kv_values(
        spec,
        batch=setup.batch,
        context=setup.context,
        kv_dtype=setup.kv_dtype,
        tp=setup.tp,
        block=setup.block or 1,
    )
    per_token = kv_bytes_per_token(spec, setup.kv_dtype, tp=setup.tp)
    return ServeEstimate(
        setup=setup,
        weights_bytes=w["weights"],
        quant_constants_bytes=w["quant_constants"],
        kv_bytes=int(expr.subs(values)),
        kv_expr=expr,
        per_token_bytes=per_token,
        block_bytes=None if setup.block is None else per_token * setup.block,
    )


__all__ = [
    "INT4_GROUP",
    "KV_DTYPES",
    "SERVE_WEIGHTS",
    "Serve",
    "ServeEstimate",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "kv_cache_expr",
    "kv_dtype_bytes",
    "kv_heads_per_gpu_expr",
    "kv_values",
    "serve",
    "serve_warnings",
    "serving_weight_bytes",
    "serving_weight_exprs",
]
