"""The KV cache of a decoder: its expression, its bytes, its bytes per token.

The KV cache of a decoder keeps, for every layer, one key and one value vector per KV head per
token: ``2 L a_kv d`` elements per token (vLLM's ``cache_engine``), in the cache dtype ``B_kv``.
Grouped-query attention shrinks it by ``a / a_kv`` (MQA is ``a_kv = 1``); ``d`` is the explicit
head dimension. Under tensor parallelism each GPU holds ``max(1, a_kv // t)`` of the heads: once
``t`` exceeds ``a_kv`` the heads are replicated, not split. Sliding-window layers hold at most
``w`` tokens. A paged cache (vLLM) allocates whole blocks of ``B_blk`` tokens, so a sequence of
``T`` tokens holds ``ceil(T / B_blk)`` blocks, its last one partly empty.

Examples
========

>>> from vrammath.model.presets import load_model
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
"""

from __future__ import annotations

import sympy

from vrammath.model.params import size_values
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError, one_of, positive_int
from vrammath.notation.symbols import B_kv, L, T, a, a_kv, b, blk, d, d_n, d_r, d_v, r_kv, t, w_win
from vrammath.notation.units import dtype_bytes
from vrammath.notation.vocab import KV_DTYPES


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
    compressed latent and the one shared RoPE key, :func:`vrammath.serve.kv_cache.mla_kv_elements`), whole on every
    tensor-parallel rank (vLLM and SGLang replicate it; transformers 5 caches the same two
    tensors, as one-head "key" and "value").

    >>> from vrammath.model.presets import load_model
    >>> kv_cache_expr(load_model("deepseek-v3"), tp=True)
    B_kv*L*T*b*(d_r + r_kv)

    >>> from vrammath.model.presets import load_model
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

    >>> from vrammath.model.presets import load_model
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

    >>> from vrammath.model.presets import load_model
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

    >>> from vrammath.model.presets import load_model
    >>> ds, llama = load_model("deepseek-v3"), load_model("llama-3.1-405b")
    >>> kv_bytes_per_token(ds), kv_bytes_per_token(llama)
    (70272, 516096)
    """
    return kv_cache_bytes(spec, 1, 1, kv_dtype, tp=tp, window_layers=0)


__all__ = [
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "kv_cache_expr",
    "kv_dtype_bytes",
    "kv_heads_per_gpu_expr",
    "kv_values",
    "mla_kv_elements",
]
