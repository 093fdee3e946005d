"""What every activation formula shares: the option names, bytes per element, norms' kept bytes.

The precisions, attention implementations, parallelisms and schedules the formulas of
:mod:`vrammath.terms.activations.model`, :mod:`vrammath.terms.korthikanti.dense`, :mod:`vrammath.terms.activations.layer`,
:mod:`vrammath.terms.activations.gpt` and :mod:`vrammath.terms.activations.peaks` accept, the bytes per element of the
compute dtype, the residual stream and a dropout mask, and the bytes one norm keeps for backward.
Formulas that take the same options share one signature: :class:`LayerOptions` names a layer's,
and :func:`~vrammath.notation.signatures.after` gives a function the parameters of another (a ``*_bytes`` those of its
``*_terms``).

Examples
========

>>> PRECISIONS
('fp32', 'bf16', 'fp16', 'autocast-bf16', 'autocast-fp16')
>>> SDPA_GQA_MAX_HEAD_DIM
256
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Literal, TypeAlias

import sympy

from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError, one_of
from vrammath.notation.symbols import a, b, d, h, s, t

Parallel = Literal["none", "tp", "tp_sp"]
Recompute = Literal["none", "selective", "full"]
Schedule = Literal["1f1b", "interleaved"]
Attention = Literal["eager", "sdpa"]
Precision = Literal["fp32", "bf16", "fp16", "autocast-bf16", "autocast-fp16"]
HfRecompute = Literal["none", "full"]
Device = Literal["cuda", "cpu"]

PARALLEL: tuple[str, ...] = ("none", "tp", "tp_sp")
RECOMPUTE: tuple[str, ...] = ("none", "selective", "full")
SCHEDULES: tuple[str, ...] = ("1f1b", "interleaved")
ATTENTIONS: tuple[str, ...] = ("eager", "sdpa")
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16", "autocast-bf16", "autocast-fp16")
PURE_PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")
HF_RECOMPUTE: tuple[str, ...] = ("none", "full")

Number: TypeAlias = int | sympy.Expr


def _check(field: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise one_of(field, value, allowed)


def _number(field: str, value: object) -> sympy.Expr:
    """An int or a sympy expression as an expression; anything else (a string) is refused."""
    if isinstance(value, int) and not isinstance(value, bool):
        return sympy.Integer(value)
    if isinstance(value, sympy.Expr):
        return value
    raise InputError(field, "must be an int or a sympy expression", got=value)


def _tp_divisors(parallel: str) -> tuple[sympy.Expr, sympy.Expr]:
    """(inner, outer) divisors of Korthikanti et al.'s parallelisms, ``parallel`` checked.

    Tensor parallelism (``"tp"``) splits what lies inside the column/row-parallel regions (1/t)
    and replicates the rest; sequence parallelism (``"tp_sp"``) splits the rest too.

    >>> _tp_divisors("tp")
    (1/t, 1)
    """
    _check("parallel", parallel, PARALLEL)
    inner = 1 / t if parallel in ("tp", "tp_sp") else sympy.Integer(1)
    outer = 1 / t if parallel == "tp_sp" else sympy.Integer(1)
    return inner, outer


def _total(terms: Mapping[str, sympy.Expr]) -> sympy.Expr:
    """The terms summed and expanded: what a ``*_bytes`` function gives of its ``*_terms``."""
    return sympy.expand(sum(terms.values(), sympy.Integer(0)))


#: head_dim above which transformers' SDPA path repeats K/V instead of passing enable_gqa.
SDPA_GQA_MAX_HEAD_DIM = 256


def _precision(precision: str) -> tuple[int, bool]:
    """(compute bytes, autocast?) of a precision name."""
    _check("precision", precision, PRECISIONS)
    if precision == "fp32":
        return 4, False
    return 2, precision.startswith("autocast")


def _pure_precision(precision: str) -> int:
    """Compute bytes of a precision with no autocast, the only ones derived for some layers
    (GPT-2's and GPT-NeoX's blocks); autocast is refused."""
    _check("precision", precision, PURE_PRECISIONS)
    return _precision(precision)[0]


def _residual_bytes(precision: str) -> int:
    """Bytes per element of the residual stream: the parameters' dtype (fp32 under autocast)."""
    compute, autocast = _precision(precision)
    return 4 if autocast else compute


DEVICES: tuple[str, ...] = ("cuda", "cpu")


@dataclass(frozen=True)
class Run:
    """The model and how transformers runs it: the attention implementation and the precision.

    The bases of the options records (:class:`LayerOptions`, :class:`GeluOptions`), each the
    signature of the formulas that read it through :func:`after`."""

    spec: ModelSpec
    attention: Attention = "sdpa"
    precision: Precision = "bf16"


@dataclass(frozen=True)
class LayerOptions(Run):
    """What a decoder layer's formulas read: a :class:`Run` and (keyword-only) the device whose
    kernels run."""

    _: KW_ONLY
    device: Device = "cuda"


@dataclass(frozen=True)
class EagerLayerOptions(LayerOptions):
    """:class:`LayerOptions` with eager attention by default, the one the op-by-op peaks derive."""

    attention: Attention = "eager"


@dataclass(frozen=True)
class GeluOptions(Run):
    """A :class:`Run` with (keyword-only) the GeLU variant GPT-2 runs (None: the spec's) and the
    device, as the formulas that pass them on to GPT-2's block take them."""

    _: KW_ONLY
    gelu: str | None = None
    device: Device = "cuda"


@dataclass(frozen=True)
class HfLayerOptions(GeluOptions):
    """:class:`GeluOptions` and (keyword-only) whether the layer has a sliding window."""

    _: KW_ONLY
    sliding: bool = False


@dataclass(frozen=True)
class ModelOptions(GeluOptions):
    """:class:`GeluOptions` and the recomputation, after the precision: the whole model's."""

    recompute: HfRecompute = "none"


def _dropout_mask_bytes(c: int, device: str) -> int:
    """Bytes per element of a dropout mask: CUDA's fused ``native_dropout`` keeps a bool mask;
    on a CPU dropout multiplies by a noise tensor of the input's dtype (c bytes)."""
    return c if device == "cpu" else 1


def _math_kernel_dropout_kept() -> tuple[sympy.Expr, sympy.Expr]:
    """(Q/K/V, scores) bytes SDPA keeps on a CPU with dropout on the probabilities.

    PyTorch's CPU flash kernel has no dropout, so SDPA runs its math kernel: it upcasts 16-bit
    Q, K and V to fp32, scales Q and K (new tensors), repeats K and V to a heads (GQA), and
    keeps the scaled Q and K and the repeated V (12 a d bytes per token), the fp32 softmax
    output, dropout's fp32 noise and the dropped-out fp32 probabilities (12 a s^2 b); it keeps
    no log-sum-exp (measured on a CPU, fp32, bf16 and autocast alike). On CUDA the flash and
    memory-efficient kernels apply dropout inside and keep only the log-sum-exp.
    """
    return 12 * s * b * a * d, 12 * a * s**2 * b


def _eager_softmax_kept(c: int) -> sympy.Expr:
    """What eager attention keeps of the probabilities (LLaMA's, GPT-NeoX's): the fp32 softmax
    output (``softmax(dtype=float32)``) and its cast back to c bytes, none where c is 4."""
    return (4 + (0 if c == 4 else 2)) * a * s**2 * b


def _norm_kept(spec: ModelSpec, precision: str, device: str) -> sympy.Expr:
    """Bytes one norm of ``spec.norms.kind`` keeps for backward.

    RMSNorm (transformers' LLaMA) upcasts its input to fp32 and keeps it (4sbh), the normalised
    tensor the weight multiplies, in the parameters' dtype (2sbh for pure 16-bit, 4sbh for fp32
    and autocast), and the inverse RMS (4bs). LayerNorm keeps its input (c sbh) and its mean and
    inverse std (S bs each): fp32 on CUDA (S = 4), the input's dtype on a CPU (S = c).
    """
    c, autocast = _precision(precision)
    sb = s * b
    if spec.norms.kind == "rmsnorm":
        normalised = 4 if c == 4 or autocast or spec.norms.weight_fp32 else 2
        return 4 * sb * h + normalised * sb * h + 4 * b * s
    kept = 4 if autocast else c  # under autocast LayerNorm runs on the fp32 residual stream
    stats = kept if device == "cpu" else 4
    return kept * sb * h + 2 * stats * b * s


def _unit_offset_norm_kept() -> sympy.Expr:
    """Bytes one Gemma RMSNorm keeps: it computes in fp32 whatever the dtype.

    Its fp32 input (a copy for 16-bit models, the input itself in fp32), the inverse RMS (4bs),
    the fp32 normalised tensor that multiplies ``1 + weight`` and that fp32 vector (4h): the
    cast back to the model's dtype keeps nothing.
    """
    return 8 * s * b * h + 4 * b * s + 4 * h


__all__ = [
    "ATTENTIONS",
    "DEVICES",
    "HF_RECOMPUTE",
    "PARALLEL",
    "PRECISIONS",
    "PURE_PRECISIONS",
    "RECOMPUTE",
    "SCHEDULES",
    "SDPA_GQA_MAX_HEAD_DIM",
    "Attention",
    "Device",
    "EagerLayerOptions",
    "GeluOptions",
    "HfLayerOptions",
    "HfRecompute",
    "LayerOptions",
    "ModelOptions",
    "Number",
    "Parallel",
    "Precision",
    "Recompute",
    "Run",
    "Schedule",
]
