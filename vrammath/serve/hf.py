"""Serving with transformers' ``generate()``: weights, DynamicCache and the peaks, on one GPU.

``serve --engine hf`` answers what ``model.generate(ids, max_new_tokens=N)`` holds for a batch
of prompts: the weights as loaded (parameters in 16 bits and RoPE's two fp32 ``inv_freq``
buffers, ``d / 2`` each), and the larger of the prefill's and the last decode step's peaks
(:mod:`vrammath.serve.generate`: cache, activations, logits, all exact against the real
``generate()``). ``--context`` is the tokens per sequence at the end, prompt plus new tokens.

On a GPU the answer adds what the process holds outside its tensors that the presets know: the
CUDA context and the cuBLAS and cuBLASLt workspaces of one stream. The caching allocator's
rounding and the blocks it keeps cached are not counted: the tensor bytes are a floor for
``torch.cuda.max_memory_allocated``.

Examples
========

>>> from vrammath.model.presets import load_model
>>> from vrammath.serve.estimate import Serve
>>> est = hf_serve(Serve(load_model("llama-3.1-8b"), context=4096, batch=8, gpu="H100-80GB"))
>>> est.peaks.prefill_point, est.fits(), est.max_batch()
('MLP', True, 68)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vrammath.model.presets import GPU, gpu
from vrammath.notation.errors import InputError, warn_context
from vrammath.notation.fields import MAX_TOKENS, check_bounds, declared
from vrammath.serve.estimate import Serve
from vrammath.serve.generate import GENERATE_DTYPES, GeneratePeaks, generate_peaks
from vrammath.serve.weights import serving_weight_bytes

#: what every ``--engine hf`` answer assumes, said with it
HF_ASSUMPTIONS = (
    "greedy search, every step run: sampling's logits processors (temperature, top-k, top-p) "
    "add (batch, vocab) fp32 tensors at each step's end, and each eos id 8 bytes",
    "prompts without padding (a padded batch makes a (b, 1, s, s) mask and repeats K and V)",
    "tensor bytes: the caching allocator's rounding and cached blocks are not counted",
)


@dataclass(frozen=True)
class Hf:
    """The ``generate()`` call's own setting that changes its memory."""

    new_tokens: int = declared(
        128,
        "--new-tokens",
        "with --engine hf: max_new_tokens of generate(); the prompt is --context minus these "
        "(default {default})",
        low=1,
        high=MAX_TOKENS,
    )

    def __post_init__(self) -> None:
        check_bounds(self)


def rope_buffer_bytes(head_dim: int) -> int:
    """RoPE's ``inv_freq`` and ``original_inv_freq`` buffers: ``d / 2`` fp32 values each.

    >>> rope_buffer_bytes(128)
    512
    """
    return 2 * (head_dim // 2) * 4


@dataclass(frozen=True)
class HfServeEstimate:
    """A ``generate()`` batch on one GPU: weights, buffers, the peaks, and the fit."""

    setup: Serve
    new_tokens: int
    weights_bytes: int
    buffer_bytes: int
    peaks: GeneratePeaks

    @property
    def prompt(self) -> int:
        """Prompt tokens per sequence."""
        return self.setup.context - self.new_tokens

    @property
    def total_bytes(self) -> int:
        """The peak tensor bytes, the weights, buffers and larger peak together."""
        return self.weights_bytes + self.buffer_bytes + self.peaks.peak_bytes

    @property
    def gpu_spec(self) -> GPU | None:
        """The GPU preset, if named."""
        return None if self.setup.gpu is None else gpu(self.setup.gpu)

    @property
    def outside_bytes(self) -> int:
        """The CUDA context and one stream's cuBLAS and cuBLASLt workspaces (0 without a GPU)."""
        card = self.gpu_spec
        if card is None:
            return 0
        return card.context_bytes + card.cublas_workspace_bytes + card.cublaslt_workspace_bytes

    def fits(self) -> bool | None:
        """Whether the peak tensor bytes and what is outside them fit the GPU's usable memory."""
        card = self.gpu_spec
        return None if card is None else self.total_bytes + self.outside_bytes <= card.usable

    def max_batch(self, limit: int = 1 << 20) -> int | None:
        """Most sequences of this prompt and these new tokens that fit (None without a GPU)."""
        card = self.gpu_spec
        if card is None:
            return None
        room = card.usable - self.outside_bytes - self.weights_bytes - self.buffer_bytes

        def fits(n: int) -> bool:
            return self._peaks(n).peak_bytes <= room

        if not fits(1):
            return 0
        lo, hi = 1, 2
        while hi <= limit and fits(hi):
            lo, hi = hi, hi * 2
        if hi > limit:
            return limit
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo

    def _peaks(self, batch: int) -> GeneratePeaks:
        s = self.setup
        return generate_peaks(
            s.model, prompt=self.prompt, new_tokens=self.new_tokens, batch=batch, dtype=s.weights
        )

    def as_dict(self) -> dict[str, Any]:
        """The figures, bytes as integers."""
        card = self.gpu_spec
        p = self.peaks
        return {
            "prompt_tokens": self.prompt,
            "new_tokens": self.new_tokens,
            "weights_bytes": self.weights_bytes,
            "buffer_bytes": self.buffer_bytes,
            "prefill_peak_bytes": p.prefill_bytes,
            "prefill_peak_at": p.prefill_point,
            "decode_peak_bytes": p.decode_bytes,
            "decode_peak_at": p.decode_point,
            "kv_cache_bytes": p.cache_bytes,
            "total_bytes": self.total_bytes,
            "gpu": None
            if card is None
            else {
                "name": card.name,
                "usable_bytes": card.usable,
                "outside_tensors_bytes": self.outside_bytes,
                "fits": self.fits(),
                "max_batch": self.max_batch(),
            },
        }


def hf_serve(setup: Serve, hf: Hf | None = None) -> HfServeEstimate:
    """Evaluate a serving setup as transformers' ``generate()`` runs it (greedy, one GPU).

    >>> from vrammath.model.presets import load_model
    >>> hf_serve(Serve(load_model("llama-3.1-8b"), context=100), Hf(new_tokens=100))
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: new_tokens: must be less than the context (100): the prompt is the rest (got 100)
    """
    hf = hf or Hf()
    spec = setup.model
    if setup.weights not in GENERATE_DTYPES:
        raise InputError(
            "weights",
            f"with --engine hf must be one of {', '.join(GENERATE_DTYPES)} (quantized "
            "generate() is not modelled)",
            setup.weights,
        )
    if setup.kv_dtype != setup.weights:
        raise InputError(
            "kv_dtype",
            f"with --engine hf is the weights' dtype ({setup.weights}): DynamicCache keeps "
            "keys and values in the model's dtype",
            setup.kv_dtype,
        )
    if setup.tp != 1:
        raise InputError("tp", "with --engine hf must be 1 (one GPU)", setup.tp)
    if hf.new_tokens >= setup.context:
        raise InputError(
            "new_tokens",
            f"must be less than the context ({setup.context}): the prompt is the rest",
            hf.new_tokens,
        )
    warn_context(spec.name, spec.past_context("context", setup.context))
    peaks = generate_peaks(
        spec,
        prompt=setup.context - hf.new_tokens,
        new_tokens=hf.new_tokens,
        batch=setup.batch,
        dtype=setup.weights,
    )
    weights = serving_weight_bytes(spec, setup.weights)["weights"]
    return HfServeEstimate(setup, hf.new_tokens, weights, rope_buffer_bytes(spec.head_dim), peaks)


__all__ = ["HF_ASSUMPTIONS", "Hf", "HfServeEstimate", "hf_serve", "rope_buffer_bytes"]
