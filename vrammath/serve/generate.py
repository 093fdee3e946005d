"""What transformers' ``generate()`` holds at its peaks: the prefill and the last decode step.

Serving with the Hugging Face path (``model.generate``, greedy, the default ``DynamicCache``)
allocates, besides the weights, the KV cache and the transients of one forward: the whole prompt
at once in the prefill, one token per sequence in each decode step. The peak of each forward is
the largest of a few points, every one of which is a sum of the tensors alive there, listed op by
op from a log of every storage the real ``generate()`` creates and frees
(``vrammath.measure.generate``, transformers 5.24, PyTorch 2.13):

* in the last decoder layer (the cache of every earlier layer is already full): RoPE applied to
  Q and to K (``apply_rotary_pos_emb`` makes ``q * cos``, ``rotate_half(q)`` and its product
  with ``sin`` before summing them), the cache update (``DynamicLayer.update`` concatenates: the
  layer's old and new K and V are alive together), the second norm (fp32 upcast, its product
  with the inverse RMS, the mean and ``rsqrt``) and the SwiGLU MLP (``act(gate) * up``: three
  intermediate-size tensors);
* after the forward: the last token's logits (``logits_to_keep=1``), their fp32 copy
  (``next_token_logits``), and in a decode step the previous step's fp32 copy, still bound.

Alongside them ``generate()`` keeps the prompt-length position ids, the ids and attention mask
(grown by one token per step), the token embeddings of the step and RoPE's ``cos``/``sin``.

Exact for LLaMA, Mistral (without a sliding window) and Qwen2 layers in 16-bit weights with SDPA
attention, greedy search that runs every step (no end-of-sequence token ends it early);
other families are refused by name. Symbols: ``b`` sequences, ``s`` prompt tokens, ``T`` tokens in
the cache after the step.

Examples
========

>>> from vrammath.model.presets import load_model
>>> peaks = generate_peaks(load_model("llama-3.1-8b"), prompt=4096, new_tokens=256)
>>> peaks.prefill_point, peaks.decode_point
('MLP', 'cache update')
>>> round(peaks.prefill_bytes / 2**30, 3), round(peaks.decode_bytes / 2**30, 3)
(0.955, 0.54)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import sympy

from vrammath.model.params import size_values
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError, one_of, positive_int
from vrammath.notation.symbols import I, L, T, V, a, a_kv, b, d, h, s

#: the families whose decoders have the parts the points below follow, op for op
GENERATE_FAMILIES = ("llama", "mistral", "qwen2")
#: the weight dtypes measured; in fp32 the norms skip their upcasts, which moves the points
GENERATE_DTYPES = ("bf16", "fp16")


def check_generate_model(spec: ModelSpec) -> None:
    """Refuse, by name, a model whose ``generate()`` peaks are not derived here.

    >>> from vrammath.model.presets import load_model
    >>> check_generate_model(load_model("qwen3-8b"))
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: model: transformers' generate() peaks are derived for llama, mistral, qwen2 decoders (dense, RMSNorm, SwiGLU, no sliding window, no q/k norm) (got 'qwen3-8b')
    """
    att, emb = spec.attention, spec.embeddings
    plain = (
        spec.experts is None
        and spec.latent is None
        and att.sliding_window is None
        and att.qk_norm == "none"
        and not att.fused_qkv
        and att.rotary_dim is None
        and att.softcap is None
        and att.dropout == 0
        and spec.norms.kind == "rmsnorm"
        and spec.norms.placement == "pre"
        and not spec.norms.unit_offset
        and not spec.norms.weight_fp32
        and not spec.norms.parallel_residual
        and spec.mlp.gated
        and spec.mlp.activation == "silu"
        and not spec.mlp.fused_gate_up
        and not emb.scaled
        and not emb.learned_positions
        and emb.logit_softcap is None
        and not spec.conv1d
    )
    if not plain:
        raise InputError(
            "model",
            f"transformers' generate() peaks are derived for {', '.join(GENERATE_FAMILIES)} "
            "decoders (dense, RMSNorm, SwiGLU, no sliding window, no q/k norm)",
            spec.name,
        )


def _layer_points(
    spec: ModelSpec, c: int, tok: sympy.Expr, per_seq: sympy.Expr, cached: sympy.Expr
) -> dict[str, sympy.Expr]:
    """The points of the last decoder layer, above what the step holds outside the layers.

    ``tok`` tokens pass through the layer (``per_seq`` per sequence); the cache holds ``cached``
    tokens per sequence after the step. The earlier layers' caches are full, and the layer's
    input (the previous layer's output) is a tensor of its own unless the model has one layer.
    """
    kv_half = c * b * a_kv * d  # one of K or V, per cached token
    full = 2 * kv_half * cached
    old = 2 * kv_half * (cached - per_seq)
    outside = (L - 1) * full + (c * tok * h if spec.layers > 1 else 0)
    q, kv_new, normed = c * tok * a * d, 2 * c * tok * a_kv * d, c * tok * h
    norm = 8 * tok * h + 8 * tok  # fp32 input, its product with the inverse RMS, mean and rsqrt
    # the input norm, SDPA and o_proj are never the largest: the second norm holds more than
    # the first (a full cache, the residual), RoPE on Q more than SDPA (2 c a d >= 4 a bytes
    # per token), and o_proj wins over RoPE on Q only where h > 2 a d, where the second norm
    # holds more than it
    points = {
        "RoPE on Q": old + normed + q + kv_new + 3 * q,
        "RoPE on K": old + normed + 2 * q + kv_new + 3 * c * tok * a_kv * d,
        "cache update": normed + q + kv_new + kv_half * (2 * cached + cached - per_seq),
        "second norm": full + normed + norm,
        "MLP": full + 2 * normed + 3 * c * tok * I,
    }
    return {name: sympy.expand(outside + expr) for name, expr in points.items()}


def _scalars(special_tokens: int) -> sympy.Expr:
    """The special-token ids ``generate()`` turns into int64 tensors (8 bytes each), and the
    bool of its right-padding check, made for batches of two or more (``Min(b - 1, 1)``)."""
    return 8 * special_tokens + sympy.Min(b - 1, 1)


@lru_cache(maxsize=64)
def prefill_points(
    spec: ModelSpec, dtype: str = "bf16", special_tokens: int = 2
) -> dict[str, sympy.Expr]:
    """Bytes alive at each candidate peak of the prefill, activations and cache (no weights).

    >>> from vrammath.model.presets import load_model
    >>> prefill_points(load_model("llama-7b"))["MLP"]
    6*I*b*s + 4*L*a_kv*b*d*s + 4*b*d*s + 8*b*h*s + 16*b*s + 8*b + Min(1, b - 1) + 16
    """
    c = _dtype_bytes(dtype)
    # unfinished_sequences, the position ids and the ids' clone
    held = (
        _scalars(special_tokens) + 8 * b + 16 * b * s + c * b * s * h + 2 * c * b * s * d
    )  # + embeddings, cos/sin
    points = {k: held + v for k, v in _layer_points(spec, c, b * s, s, s).items()}
    cache = 2 * c * b * a_kv * d * s * L
    # the last token's logits, their fp32 copy, the argmax, the ids and mask grown by one token
    # and the stopping check's two per-sequence tensors
    points["logits"] = (
        _scalars(special_tokens) + 8 * b * s + 25 * b + 16 * b * (s + 1) + cache + (c + 4) * b * V
    )
    return {k: sympy.expand(v) for k, v in points.items()}


@lru_cache(maxsize=64)
def decode_points(
    spec: ModelSpec, dtype: str = "bf16", special_tokens: int = 2
) -> dict[str, sympy.Expr]:
    """Bytes alive at each candidate peak of a decode step whose cache ends at ``T`` tokens.

    >>> from vrammath.model.presets import load_model
    >>> decode_points(load_model("llama-7b"))["cache update"]
    4*L*T*a_kv*b*d + 2*T*a_kv*b*d + 16*T*b + 4*V*b + 2*a*b*d + 2*a_kv*b*d + 4*b*d + 6*b*h + 8*b*s + 32*b + Min(1, b - 1) + 16
    """
    c = _dtype_bytes(dtype)
    # the prompt-length position ids, the previous step's fp32 logits, its argmax, the ids and
    # the mask (T tokens each), unfinished_sequences, this step's ids and position ids
    held = (
        _scalars(special_tokens)
        + 8 * b * s
        + 4 * b * V
        + 32 * b
        + 16 * b * T
        + c * b * h
        + 2 * c * b * d
    )
    points = {k: held + v for k, v in _layer_points(spec, c, b, 1, T).items()}
    cache = 2 * c * b * a_kv * d * T * L
    # the step's logits and their fp32 copy while the previous copy is still bound; the mask
    # has grown to T + 1
    points["logits"] = (
        _scalars(special_tokens) + 8 * b * s + (8 + c) * b * V + 32 * b + 8 * b * (2 * T + 1)
    ) + cache
    return {k: sympy.expand(v) for k, v in points.items()}


@dataclass(frozen=True)
class GeneratePeaks:
    """The prefill's and the last decode step's peaks (bytes above the weights) and where."""

    prefill_bytes: int
    prefill_point: str
    decode_bytes: int
    decode_point: str
    cache_bytes: int

    @property
    def peak_bytes(self) -> int:
        """The larger of the two peaks."""
        return max(self.prefill_bytes, self.decode_bytes)


def generate_peaks(
    spec: ModelSpec,
    *,
    prompt: int,
    new_tokens: int,
    batch: int = 1,
    dtype: str = "bf16",
    special_tokens: int = 2,
) -> GeneratePeaks:
    """The peaks of ``generate(max_new_tokens=new_tokens)`` over ``batch`` prompts of ``prompt``
    tokens: the prefill, and the last of the ``new_tokens - 1`` decode steps (the cache holds
    ``prompt + new_tokens - 1`` tokens after it; with one new token there is no decode step).
    ``cache_bytes`` is the DynamicCache at the end. ``special_tokens`` counts the token ids
    ``generate()`` holds as tensors (bos and pad by default; each eos id adds 8 bytes).

    >>> from vrammath.model.presets import load_model
    >>> generate_peaks(load_model("qwen2-7b"), prompt=1, new_tokens=1).prefill_point
    'logits'
    """
    check_generate_model(spec)
    prompt = positive_int("prompt", prompt)
    new_tokens = positive_int("new_tokens", new_tokens)
    batch = positive_int("batch", batch)
    sizes = {**size_values(spec), b: batch, s: prompt, T: prompt + new_tokens - 1}

    def largest(points: dict[str, sympy.Expr]) -> tuple[int, str]:
        values = {name: int(expr.subs(sizes)) for name, expr in points.items()}
        name = max(values, key=lambda k: values[k])
        return values[name], name

    pre, pre_at = largest(prefill_points(spec, dtype, special_tokens))
    decode = decode_points(spec, dtype, special_tokens)
    dec, dec_at = largest(decode) if new_tokens > 1 else (0, "none")
    cache = int((2 * _dtype_bytes(dtype) * b * a_kv * d * T * L).subs(sizes))
    return GeneratePeaks(pre, pre_at, dec, dec_at, cache)


def _dtype_bytes(dtype: str) -> int:
    if dtype not in GENERATE_DTYPES:
        raise one_of("dtype", dtype, GENERATE_DTYPES)
    return 2
