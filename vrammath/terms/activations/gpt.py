"""Activation bytes of the GPT blocks: GPT-2's and GPT-NeoX's layers as transformers runs them.

GPT-2 (LayerNorm, fused ``Conv1D`` QKV, a GeLU MLP, dropout everywhere) and GPT-NeoX (Pythia:
LayerNorm with bias, RoPE on part of each head, a plain GeLU MLP), tensor group by tensor group,
and the tensors each GeLU variant keeps (:data:`GELU_KEPT`). :func:`vrammath.terms.activations.layer.hf_layer_terms`
passes these architectures on to them.

Examples
========

>>> GELU_KEPT["gelu_new"]
4
"""

from __future__ import annotations

import sympy

from vrammath.model.spec import ModelSpec
from vrammath.notation.signatures import after
from vrammath.notation.symbols import I, a, b, h, s
from vrammath.terms.activations.parts import (
    ATTENTIONS,
    DEVICES,
    Attention,
    Device,
    LayerOptions,
    Precision,
    _check,
    _dropout_mask_bytes,
    _eager_softmax_kept,
    _math_kernel_dropout_kept,
    _norm_kept,
    _pure_precision,
)

GELU_KEPT: dict[str, int] = {"gelu": 1, "gelu_pytorch_tanh": 1, "gelu_new": 4, "gelu_fast": 7}
"""I-sized tensors each GeLU variant of transformers keeps for backward (besides its output).

``gelu`` and ``gelu_pytorch_tanh`` are single PyTorch ops that keep their input; ``gelu_new`` (GPT-2's
config) is written in Python, ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, and autograd keeps
x, the tanh output, 0.5x and 1 + tanh (measured); ``gelu_fast``,
``0.5 x (1 + tanh(0.79788456 x (1 + 0.044715 x x)))``, keeps x, 0.044715x, 0.79788456x, the
inner sum, the tanh output, 0.5x and 1 + tanh (measured with GPT-NeoX).
"""


def gpt2_layer_terms(
    spec: ModelSpec,
    attention: Attention = "eager",
    precision: Precision = "bf16",
    *,
    gelu: str | None = None,
    device: Device = "cuda",
) -> dict[str, sympy.Expr]:
    """Bytes one ``GPT2Block`` of transformers keeps for backward, per tensor group.

    Explanation
    ===========

    transformers' GPT-2 block: LayerNorm, a fused ``c_attn`` producing Q, K, V, attention with
    dropout on the probabilities, ``c_proj`` and a residual dropout, LayerNorm, a GeLU MLP
    (``c_fc``, ``c_proj``) and dropout. With c the compute bytes, M the bytes of a dropout mask
    and S those of a LayerNorm statistic:

    * ``norms`` -- each LayerNorm keeps its input (c sbh), its mean and inverse std (S bs each).
    * ``inputs`` -- the inputs of ``c_attn`` and ``c_fc`` (the norms' outputs, c sbh each).
    * ``qkv`` -- Q, K, V: 3c sbh (contiguous copies ``matmul`` makes of the head views).
    * ``scores`` -- eager: the softmax output (c as^2b) and, with ``attn_pdrop`` > 0, the
      dropout mask and the dropped-out probabilities, (2c + M) as^2b; SDPA (flash, CUDA): the
      log-sum-exp, 4asb; SDPA on a CPU with ``attn_pdrop`` > 0 runs the math kernel
      (``activation_parts._math_kernel_dropout_kept``: fp32 Q, K, V and 12 as^2b).
    * ``output`` -- the merged heads (``c_proj``'s input, c sbh) and, with ``resid_pdrop`` > 0,
      the residual dropout mask.
    * ``mlp`` -- the GeLU's kept tensors (:data:`GELU_KEPT`), its output (``c_proj``'s input) and,
      with ``resid_pdrop`` > 0, the dropout mask: (k + 1) c sbI + M sbh.

    Each dropout is read on its own: at probability 0 PyTorch's dropout returns its input and
    keeps nothing.

    On CUDA dropout is the fused ``native_dropout`` and keeps a bool mask (M = 1), and LayerNorm's
    statistics are fp32 (S = 4). On a CPU dropout multiplies by a noise tensor of the input's dtype
    (M = c) and LayerNorm keeps its statistics in the input's dtype (S = c); ``device="cpu"`` gives
    what the CPU measurement sees. With ``gelu_pytorch_tanh`` (k = 1), c = 2 and M = 1 this is
    Korthikanti et al.'s 34sbh + 5as^2b plus the LayerNorm statistics (16bs).

    Examples
    ========

    >>> from vrammath.model.presets import load_model
    >>> from vrammath.terms.korthikanti.dense import korthikanti_layer_bytes
    >>> from vrammath.notation.symbols import I, h
    >>> layer = sum(gpt2_layer_terms(load_model("gpt2"), gelu="gelu_pytorch_tanh").values())
    >>> layer.subs(I, 4 * h) - korthikanti_layer_bytes()
    16*b*s

    Parameters
    ==========

    spec : ModelSpec
        A GPT-2 model (LayerNorm, plain GeLU MLP, any dropouts).
    attention : "eager" or "sdpa"
    precision : str
        ``"fp32"``, ``"bf16"`` or ``"fp16"`` (autocast is not derived for GPT-2).
    gelu : one of :data:`GELU_KEPT`, optional
        Overrides the spec's ``mlp.activation`` (the config's ``activation_function``).
    device : "cuda" or "cpu"
        Whose dropout and LayerNorm kernels (see above).

    See Also
    ========

    vrammath.terms.activations.layer.hf_layer_terms, vrammath.terms.korthikanti.dense.korthikanti_layer_terms
    """
    _check("attention", attention, ATTENTIONS)
    c = _pure_precision(precision)
    gelu = spec.mlp.activation if gelu is None else gelu
    _check("gelu", gelu, tuple(GELU_KEPT))
    _check("device", device, DEVICES)
    M = _dropout_mask_bytes(c, device)
    sb = s * b
    qkv = 3 * c * sb * h
    if attention == "eager":
        scores = c * a * s**2 * b  # the softmax output (c: GPT-2 does not upcast)
        if spec.attention.dropout > 0:  # dropout's mask and the dropped-out probabilities
            scores += (M + c) * a * s**2 * b
    elif device == "cpu" and spec.attention.dropout > 0:
        _, scores = _math_kernel_dropout_kept()
        qkv = 12 * sb * h  # the math kernel's fp32 Q, K, V (a d = h in GPT-2)
    else:
        scores = 4 * a * s * b
    resid = M * sb * h if spec.mlp.dropout > 0 else sympy.Integer(0)
    return {
        "norms": 2 * _norm_kept(spec, precision, device),
        "inputs": 2 * c * sb * h,
        "qkv": qkv,
        "scores": sympy.expand(scores),
        "output": c * sb * h + resid,
        "mlp": (GELU_KEPT[gelu] + 1) * c * sb * I + resid,
        "weight_casts": sympy.Integer(0),
    }


@after(LayerOptions)
def neox_layer_terms(layer: LayerOptions) -> dict[str, sympy.Expr]:
    """Bytes one ``GPTNeoXLayer`` of transformers keeps for backward, per tensor group.

    Explanation
    ===========

    GPT-NeoX (Pythia, GPT-NeoX-20B): LayerNorm with bias, one ``query_key_value`` projection,
    RoPE on the first ``rotary_dim`` dimensions of each head, ``dense``, and a plain GeLU MLP
    (``dense_h_to_4h``, ``dense_4h_to_h``); with ``use_parallel_residual`` both norms read the
    same layer input. Dropout is 0 (the reader refuses more). With c the compute bytes and S the
    bytes of a LayerNorm statistic (:func:`gpt2_layer_terms`):

    * ``norms`` -- each LayerNorm keeps its input (c sbh) and two statistics (S bs each); with the
      parallel residual both inputs are the same tensor, kept once.
    * ``inputs`` -- the inputs of ``query_key_value`` and ``dense_h_to_4h``: 2c sbh.
    * ``qkv`` -- Q and K after RoPE (the ``cat`` of rotated and passed dimensions, c sbh each)
      and V; V is a view of the fused projection's output, so SDPA keeps that whole (b, s, 3h)
      output (3c sbh) and one more c sbh (measured on a CPU), while eager attention's
      ``matmul`` keeps a contiguous copy of V (c sbh).
    * ``scores`` -- as LLaMA's: eager keeps the fp32 softmax output and its 16-bit cast; SDPA
      the log-sum-exp, 4asb.
    * ``output`` -- ``dense``'s input, c sbh.
    * ``mlp`` -- the GeLU's kept tensors (:data:`GELU_KEPT`) and its output: (k + 1) c sbI.

    Examples
    ========

    >>> from vrammath.model.readers import from_hf_config
    >>> spec = from_hf_config({"model_type": "gpt_neox", "hidden_size": 64,
    ...     "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
    ...     "vocab_size": 100})
    >>> neox_layer_terms(spec, "sdpa", "bf16")["qkv"]
    12*b*h*s

    References
    ==========

    .. [1] transformers ``models/gpt_neox/modeling_gpt_neox.py`` (v5).
    """
    spec, attention, precision, device = layer.spec, layer.attention, layer.precision, layer.device
    _check("attention", attention, ATTENTIONS)
    c = _pure_precision(precision)
    _check("device", device, DEVICES)
    sb = s * b
    norm = _norm_kept(spec, precision, device)
    stats = norm - c * sb * h
    norms = norm + stats if spec.norms.parallel_residual else 2 * norm
    kept_v = 4 * c * sb * h if attention == "sdpa" else c * sb * h
    scores = _eager_softmax_kept(c) if attention == "eager" else 4 * a * s * b
    return {
        "norms": sympy.expand(norms),
        "inputs": 2 * c * sb * h,
        "qkv": sympy.expand(2 * c * sb * h + kept_v),
        "scores": sympy.expand(scores),
        "output": c * sb * h,
        "mlp": (GELU_KEPT[spec.mlp.activation] + 1) * c * sb * I,
        "weight_casts": sympy.Integer(0),
    }


__all__ = ["GELU_KEPT", "gpt2_layer_terms", "neox_layer_terms"]
