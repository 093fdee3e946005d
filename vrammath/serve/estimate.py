"""Serving memory: what fits on one GPU -- a serving setup and its estimate.

A :class:`Serve` names the model, the weights' format (:mod:`vrammath.serve.weights`), the
KV cache (:mod:`vrammath.serve.kv_cache`), the parallelism and the GPU's budget; :func:`serve` adds
them up. The names of those two modules are also importable from here.

Examples
========

>>> from vrammath.model.presets import load_model
>>> est = serve(Serve(load_model("llama-2-7b")))
>>> est.weights_bytes, est.kv_bytes, est.total_bytes
(13476831232, 2147483648, 15624314880)
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from vrammath.model.presets import GPU, gpu
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError, warn_context
from vrammath.notation.fields import MAX_COUNT, MAX_TOKENS, check_bounds, declared
from vrammath.notation.vocab import KV_DTYPES, SERVE_WEIGHTS, KvDtype, ServeWeights, check
from vrammath.serve.kv_cache import (
    kv_bytes_per_token,
    kv_cache_bytes,
    kv_cache_expr,
)
from vrammath.serve.weights import INT4_GROUP, serving_weight_bytes

# ----------------------------------------------------------------------------------------------
# What fits: one serving setup on one GPU
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Serve:
    """One serving setup: model, weight format, KV cache, parallelism, and the GPU's budget.

    ``gpu_util`` is the fraction of the GPU the server may use for weights + KV cache (vLLM's
    ``gpu_memory_utilization``, default 0.9); the rest is the stated runtime reserve (CUDA context,
    activations of the forward pass, allocator slack). ``block=None`` is an unpaged cache. Each
    field is declared once with its CLI flag and bounds (:mod:`vrammath.notation.fields`).

    >>> from vrammath.model.presets import load_model
    >>> Serve(load_model("llama-2-70b"), tp=3)
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: tp: must divide the attention heads (64) (got 3)
    """

    model: ModelSpec
    context: int = declared(
        4096, "--context", f"tokens per sequence (1..{MAX_TOKENS})", low=1, high=MAX_TOKENS
    )
    batch: int = declared(
        1, "--batch", f"sequences (1..{MAX_TOKENS})", low=1, high=MAX_TOKENS, short="-b"
    )
    weights: ServeWeights = declared("bf16", "--weights", "weight format", choices=SERVE_WEIGHTS)
    kv_dtype: KvDtype = declared(
        "bf16",
        "--kv-dtype",
        "KV-cache dtype (--kv-cache-dtype, vLLM's name, also takes fp8, fp8_e4m3, fp8_e5m2, "
        "bfloat16, float16)",
        choices=KV_DTYPES,
        short="--kv-cache-dtype",
    )
    tp: int = declared(
        1,
        "--tp",
        "tensor-parallel GPUs (divides the heads; KV heads replicated past their count; "
        "--tensor-parallel-size, vLLM's name, is the same)",
        low=1,
        high=MAX_COUNT,
        short="--tensor-parallel-size",
    )
    block: int | None = declared(
        16, "--block", f"paged KV block size in tokens (1..{MAX_COUNT})", low=1, high=MAX_COUNT
    )
    gpu: str | None = declared(None, "--gpu", "GPU preset to check the fit against", kind="gpu")
    gpu_util: float = declared(
        0.9,
        "--gpu-util",
        "fraction of the GPU for weights + KV (vLLM's gpu_memory_utilization; default 0.9)",
        kind="fraction",
    )
    group: int = declared(INT4_GROUP, None, "int4 quantization group size", low=1, high=MAX_COUNT)

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
        fits (all-sliding-window models stop growing), None without a GPU. An answer past the
        model's positions comes with a :class:`~vrammath.notation.errors.ContextWarning`."""
        budget = self.kv_budget_bytes
        if budget is None:
            return None
        n = self.setup.batch if batch is None else batch
        if n * self._seq_bytes(1) > budget:
            return 0
        lo = limit
        if n * self._seq_bytes(limit) > budget:
            lo, hi = 1, limit  # lo fits, hi does not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if n * self._seq_bytes(mid) <= budget:
                    lo = mid
                else:
                    hi = mid
        spec = self.setup.model
        warn_context(spec.name, spec.past_context("max_context", lo))
        return lo

    @property
    def total_with_reserve_bytes(self) -> int:
        """All of the GPU the server takes (weights + constants + KV cache + the runtime reserve)."""
        return self.total_bytes + self.reserve_bytes


def serve_warnings(setup: Serve) -> tuple[str, ...]:
    """What a serving setup is allowed to do but should be told: the model's own warnings, and a
    context longer than the model was trained for.

    >>> from vrammath.model.presets import load_model
    >>> serve_warnings(Serve(load_model("gpt2"), context=2048))
    ("context 2048 exceeds the model's max_position_embeddings (1024)",)
    """
    return setup.model.context_warnings("context", setup.context)


def serve(setup: Serve) -> ServeEstimate:
    """Evaluate a serving setup on one GPU.

    >>> from vrammath.model.presets import load_model
    >>> est = serve(Serve(load_model("llama-2-7b"), context=4096, batch=8, gpu="A100-80GB"))
    >>> est.kv_bytes == 8 * 4096 * 512 * 1024, est.max_batch()
    (True, 29)
    """
    spec = setup.model
    warn_context(spec.name, spec.past_context("context", setup.context))
    w = serving_weight_bytes(spec, setup.weights, tp=setup.tp, group=setup.group)
    kv_bytes = kv_cache_bytes(
        spec, setup.batch, setup.context, setup.kv_dtype, tp=setup.tp, block=setup.block
    )
    per_token = kv_bytes_per_token(spec, setup.kv_dtype, tp=setup.tp)
    return ServeEstimate(
        setup=setup,
        weights_bytes=w["weights"],
        quant_constants_bytes=w["quant_constants"],
        kv_bytes=kv_bytes,
        kv_expr=kv_cache_expr(spec, tp=setup.tp > 1, paged=setup.block is not None),
        per_token_bytes=per_token,
        block_bytes=None if setup.block is None else per_token * setup.block,
    )


__all__ = [
    "Serve",
    "ServeEstimate",
    "serve",
    "serve_warnings",
]
