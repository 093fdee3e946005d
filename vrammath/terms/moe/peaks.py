"""Phase peaks of a mixture-of-experts model as transformers 5.24 trains it, op by op.

Explanation
===========

The MoE block of Mixtral, Qwen2-MoE and Qwen3-MoE (grouped-matmul experts, bf16; DeepSeek-V3's,
which routes differently and runs its shared experts last, is :mod:`vrammath.terms.moe.deepseek`,
composed here the same way) allocates and
frees, op by op, the tensors listed here as *steps*: each step is the bytes one op adds to what
is alive, less what is freed by the time it returns (read off the live tensors listed at every
op of transformers' modules on small configs, tests/test_moe_training.py; the whole step is
checked against PyTorch's count by the validation matrix's MoE rows, and its independence of
the routing by tests/measure/test_moe.py). The peak inside the block is the
largest running sum of the steps -- a sympy ``Max`` left unevaluated, which the numbers decide,
so which op peaks (the SiLU product's backward, the combine's permuted copy, the shared expert)
follows the sizes. With ``N = b s`` tokens and ``S = N k`` routed rows:

* forward, saving (no recomputation, or a layer recomputed for backward): the router's logits
  ``2 N E``, their fp32 copy (freed after the softmax), the probabilities, top-k values and
  indices, (``norm_topk``) the sum and the normalised copy, the sort's two int64 ``S``-vectors,
  the gather index, the gathered rows ``2 S h``, the sorted weights, the histogram's input and
  bins, the offsets, gate/up ``4 S I_e``, SiLU and product ``2 S I_e`` each, the down output
  ``2 S h``, the weighted rows and their un-permuted copy (``w S h`` each; ``w`` = 4 for
  Mixtral's fp32 routing weights, 2 for Qwen's bf16 ones), the inverse permutation and the
  ``arange`` it is filled from, the per-token sum ``w N h`` (and Mixtral's cast to bf16);
* forward, not saving (inside a non-reentrant checkpoint): the same ops, each tensor freed as
  soon as no Python name holds it (gate/up and SiLU after the product, the product after the
  down projection, ...);
* backward: the combine's backward (Mixtral's fp32 upcast ``4 N h``, the expanded gradient
  ``w S h``, the scatter of the permutation ``2 w S h``), the weighting's two products and
  Mixtral's cast, the down projection's gradient ``2 S I_e``, SiLU's and the product's
  gradients ``2 S I_e`` each, the concatenated ``4 S I_e``, the gathered rows' gradient
  ``2 S h``, the scatter-adds back to the tokens. The expert weights' gradients appear
  on the way (down, then gate/up) and enter as their share of the per-GPU gradient total G;
  Qwen2-MoE first back-propagates its shared expert's sigmoid gate, and after the router its
  shared MLP. The router's own backward (tensors of N E and N k elements, after every S-row
  tensor is freed) enters by its net effect only.

:func:`moe_phase_candidates` composes them with the rest of the step at the topmost MoE layer
(forward; backward with the fewest gradients made) and the bottommost one (backward, with the
most activations freed and gradients made); under full recomputation also the recomputation of
the layer, which stops once the last tensor backward needs -- the inverse permutation -- is
saved again. Under expert parallelism (``ep`` > 1) a rank's grouped buffers hold the rows its
local experts receive from the EP group after the all-to-all: ``S`` when the router balances
the load (taken here), more on the rank of an overloaded expert. Not here, as for dense layers: a final norm's backward, which can peak with a
vocabulary small next to ``h`` (none of the presets').

Examples
========

>>> from vrammath.model.presets import load_model
>>> steps = moe_forward_steps(load_model("mixtral-8x7b"))
>>> len(steps), steps[0]
(24, 2*E*b*s)

References
==========

.. [1] transformers 5.24 ``integrations/moe.py`` (``grouped_mm_experts_forward``) and
   ``models/{mixtral,qwen2_moe,qwen3_moe}/modeling_*.py`` (routers, sparse MoE blocks).
"""

from __future__ import annotations

from typing import Literal

import sympy

from vrammath.model.params import _in_layer, tensors
from vrammath.model.spec import ModelSpec
from vrammath.notation.symbols import E, I_e, I_s, P, V, b, h, k_e, s
from vrammath.terms.moe.deepseek import (
    deepseek_backward_steps,
    deepseek_forward_steps,
    deepseek_recompute_steps,
)
from vrammath.terms.moe.params import moe_mlp_kept_exprs

#: One op's step, as a pair (the bytes it adds less the bytes freed, and the parameters
#: whose gradients it creates).
Step = tuple[sympy.Expr, sympy.Expr]

_Z = sympy.Integer(0)


def _sizes() -> tuple[sympy.Expr, sympy.Expr]:
    n = b * s
    return n, n * k_e


def _weight_bytes(spec: ModelSpec) -> int:
    """Bytes of a routing weight: Mixtral's stay fp32, Qwen's are cast to bf16 (DeepSeek-V3's
    block is :mod:`vrammath.terms.moe.deepseek`' own)."""
    assert spec.experts is not None
    return spec.experts.routing_weight_bytes


def _router_forward(spec: ModelSpec, *, saving: bool) -> list[sympy.Expr]:
    ex = spec.experts
    assert ex is not None
    n, _ = _sizes()
    w = _weight_bytes(spec)
    steps = [2 * n * E, 4 * n * E, 4 * n * E, 12 * n * k_e - 4 * n * E]  # logits .. topk
    if ex.norm_topk:
        steps += [4 * n, 4 * n * k_e]  # the sum, the normalised copy
    if w == 2:
        cast = 2 * n * k_e
        if saving:
            steps += [cast, -4 * n * k_e]  # to bf16; the fp32 top-k values go
        elif ex.norm_topk:
            steps += [cast - 4 * n * k_e - 4 * n, -4 * n * k_e - 4 * n * E]
        else:
            steps += [cast, -4 * n * k_e - 4 * n * E]
    elif not saving:  # Mixtral: the sum, its copy and the probabilities are not saved
        steps += [-4 * n * k_e - 4 * n - 4 * n * E]
    return steps


def _shared_forward(spec: ModelSpec, *, saving: bool) -> list[sympy.Expr]:
    ex = spec.experts
    assert ex is not None
    if not ex.shared_intermediate:
        return []
    n, _ = _sizes()
    mid = 2 * n * I_s
    if saving:  # gate, SiLU, up, product, down (all kept)
        return [mid, mid, mid, mid, 2 * n * h]
    return [mid, mid, -mid, mid, mid, -2 * mid, 2 * n * h, -mid]


def moe_forward_steps(spec: ModelSpec, *, saving: bool = True) -> list[sympy.Expr]:
    """The bytes each op of one MoE block's forward adds (less what it frees), from the block's
    entry to its last allocation; ``saving=False`` inside a non-reentrant checkpoint.

    >>> from vrammath.model.presets import load_model
    >>> steps = moe_forward_steps(load_model("qwen3-30b-a3b"), saving=False)
    >>> sympy.expand(sum(steps[:18]))  # at the product: gate/up, SiLU and product alive
    2*E*b*s + 8*E + 8*I_e*b*k_e*s + 2*b*h*k_e*s + 32*b*k_e*s
    """
    n, rows = _sizes()
    w = _weight_bytes(spec)
    steps = _shared_forward(spec, saving=saving) + _router_forward(spec, saving=saving)
    gather_index = 8 * rows
    steps += [16 * rows, gather_index, 2 * rows * h]
    steps.append(w * rows - (0 if saving else gather_index))  # sorted weights; the index goes
    steps += [4 * rows, 4 * E, 4 * E]  # histogram input and bins, offsets
    mid = 2 * rows * I_e
    steps += [2 * mid, mid, mid]  # gate/up, SiLU, product
    if saving:
        steps += [2 * rows * h]
    else:
        steps += [-3 * mid, 2 * rows * h, -mid]
    weighted = w * rows * h
    steps += [weighted, 8 * rows, 8 * rows, weighted - 8 * rows, -weighted, w * n * h]
    if w == 4:
        steps.append(2 * n * h)  # Mixtral's fp32 sum cast to bf16
    return [sympy.expand(x) for x in steps]


def _recompute_stop(spec: ModelSpec) -> int:
    """How many forward steps a recomputation runs: up to the ``arange`` that fills the inverse
    permutation (the last tensor backward unpacks); the weighted rows' copy is never made."""
    return len(moe_forward_steps(spec)) - (5 if _weight_bytes(spec) == 4 else 4)


def _backward_head(spec: ModelSpec) -> list[Step]:
    """Steps before the first op that needs a saved tensor (a recomputation starts after them)."""
    _, rows = _sizes()
    w = _weight_bytes(spec)
    n = b * s
    if w == 4:  # Mixtral: the bf16 cast's and the sum's backward
        return [(4 * n * h, _Z), (4 * rows * h, _Z)]
    if spec.experts is not None and spec.experts.shared_gate:
        return []  # Qwen2-MoE's first op, the gate's product, unpacks saved tensors
    return [(2 * rows * h, _Z)]


def _backward_rest(spec: ModelSpec, *, recomputed: bool = False) -> list[Step]:
    ex = spec.experts
    assert ex is not None
    n, rows = _sizes()
    w = _weight_bytes(spec)
    out: list[Step] = []
    if ex.shared_gate:  # sigmoid(gate(x)) * shared(x)
        out += [
            (2 * n * h, _Z),
            (2 * n * h, _Z),
            (2 * n, _Z),
            (-4 * n * h, _Z),
            (2 * n, _Z),
            (-4 * n, h),
            (2 * n * h, _Z),
            (-2 * n, _Z),
            (2 * rows * h, _Z),  # the sum's backward
        ]
    big = w * rows * h
    # the permutation's backward (zeros, then the scatter), Mixtral freeing its fp32 upcast
    out += [(big - (4 * n * h if w == 4 else 0), _Z), (big, _Z)]
    out += [(-big - 8 * rows, _Z), (big, _Z)]  # the weighting's two products
    # the down output and the sorted weights the weighting saved: freed by the squeeze, or
    # in a recomputed layer as soon as the weighting's backward has unpacked them
    saved = w * rows + 2 * rows * h
    early, late = (saved, 0) if recomputed else (0, saved)
    if w == 4:  # Mixtral: the cast of the rows' gradient, the weights' gradient
        out += [(2 * rows * h - early, _Z), (4 * rows - big, _Z), (-2 * big - late, _Z)]
    else:
        out += [(2 * rows - early, _Z), (-2 * big - late, _Z)]
    mid = 2 * rows * I_e
    out += [
        (_Z, E * h * I_e),  # down_proj's gradient
        (mid, _Z),
        (-2 * rows * h - mid, _Z),
        (mid, _Z),
        (mid, _Z),  # SiLU's and the product's gradients
        (-mid, _Z),
        (-mid, _Z),  # the concatenated gradient; gate/up's output and the up gradient go
        (-2 * mid, _Z),
        (_Z, 2 * E * h * I_e),  # gate_up_proj's gradient
        (2 * rows * h, _Z),
        (-2 * mid - 4 * E - 2 * rows * h, _Z),
        (w * rows, _Z),
        (w * rows, _Z),
        (2 * n * h - 2 * w * rows - 8 * rows, _Z),
        (2 * n * h, _Z),
    ]
    if ex.shared_intermediate:
        out += _shared_backward(spec)
    return [(sympy.expand(x), sympy.expand(g)) for x, g in out]


def _shared_backward(spec: ModelSpec) -> list[Step]:
    """Qwen2-MoE: the scatter-add joins the gate's input gradient, the router back-propagates
    (its saved tensors freed, its input gradient joined: net ``-4 N E - 8 N k``), then the
    shared expert's MLP (down, the product's two gradients, up, SiLU, gate)."""
    n, rows = _sizes()
    mid = 2 * n * I_s
    steps: list[tuple[sympy.Expr, sympy.Expr]] = [
        (-2 * rows * h - 8 * rows, _Z),
        (-4 * n * h, _Z),
        (-4 * n * E - 8 * n * k_e, E * h),  # the router, its weight's gradient
        (_Z, h * I_s),  # down_proj's gradient
        (mid, _Z),
        (-2 * n * h - mid, _Z),
        (mid, _Z),
        (mid, _Z),
        (-3 * mid, _Z),
        (_Z, h * I_s),  # up_proj's
        (2 * n * h, _Z),
        (2 * n * h - mid, _Z),
        (-4 * n * h, _Z),
        (mid, _Z),
        (-2 * mid, _Z),
        (_Z, h * I_s),  # gate_proj's
        (2 * n * h, _Z),
    ]
    return steps


def moe_backward_steps(spec: ModelSpec) -> list[Step]:
    """The (bytes, new gradient parameters) of each op of one MoE block's backward, from the
    incoming gradient to the scatter-add back to the tokens (the router's backward excluded).

    >>> from vrammath.model.presets import load_model
    >>> steps = moe_backward_steps(load_model("mixtral-8x7b"))
    >>> sympy.expand(sum(x for x, _ in steps[:14]))  # at the SiLU product's backward
    4*I_e*b*k_e*s - 2*b*h*k_e*s - 8*b*k_e*s
    >>> sum(g for _, g in steps)  # the expert weights' gradients made on the way
    3*E*I_e*h
    """
    return _backward_head(spec) + _backward_rest(spec)


def _running(
    steps: list[Step], start: sympy.Expr, grads: sympy.Expr, G: sympy.Expr
) -> list[sympy.Expr]:
    """The live bytes after each step: ``start`` plus the steps so far, the gradients made by
    then entering as their share of G."""
    # each step expanded once, then summed: a sum of expanded polynomials is expanded (Add
    # collects like terms), so no running total is expanded again (seconds on DeepSeek-V3)
    out = []
    live = sympy.expand(start + G * grads / P)
    for x, g in steps:
        live = live + sympy.expand(x + G * g / P)
        out.append(live)
    return out


def moe_block_kept(spec: ModelSpec) -> sympy.Expr:
    """What one MoE block keeps for backward (router, experts, shared; not its output)."""

    kept = moe_mlp_kept_exprs(spec)
    return sympy.expand(kept["router"] + kept["experts"] + kept["shared"])


def moe_phase_candidates(
    spec: ModelSpec,
    *,
    before: sympy.Expr,
    dense_layer: dict[str, sympy.Expr],
    G: sympy.Expr,
    recompute: Literal["none", "full"],
) -> dict[str, list[sympy.Expr]]:
    """The forward and backward peak candidates inside the MoE blocks (see the module).

    ``before`` is what forward left, less the loss's buffers and what exists only after the
    last layer (final norm, head input); ``dense_layer`` the terms of a dense layer
    (:func:`vrammath.terms.activations.layer.hf_layer_terms`), whose attention side a MoE layer shares; G
    the per-GPU gradient total. The candidates are taken at the topmost MoE layer (forward,
    and backward with the fewest gradients made) and the bottommost one (backward, the most
    activations freed and gradients made): in between, the bytes move linearly from one to
    the other.
    """

    ex = spec.experts
    assert ex is not None
    n = b * s
    kept = moe_block_kept(spec)
    attention_side = sum(dense_layer.values(), _Z) - dense_layer["mlp"]
    moe_layer = attention_side + kept
    dense_kept = sum(dense_layer.values(), _Z)
    numel = {
        moe: sympy.Add(*(t.numel for t in tensors(spec) if _in_layer(t, moe)))
        for moe in (True, False)
    }
    head = V * h + h  # the head's (or tied embedding's) and the final norm's gradients
    # Qwen2-MoE's model also builds a sliding-window mask it never uses: a boolean (1, 1, s, s)
    # held by the model's frame through the layers (SDPA cannot take it as is_causal)
    frame_mask = s**2 if spec.attention.frame_mask else 0
    forward: list[sympy.Expr] = []
    backward: list[sympy.Expr] = []
    if not ex.layers:
        return {"forward": forward, "backward": backward}
    for i in sorted({max(ex.layers), min(ex.layers)}, reverse=True):
        above = range(i + 1, spec.layers)
        moe_above = sum(1 for j in above if j in ex.layers)
        dense_above = len(above) - moe_above
        # what the layers above keep (their checkpoints under recomputation), their gradients
        if recompute == "none":
            freed = moe_above * moe_layer + dense_above * dense_kept
        else:
            freed = len(above) * 2 * n * h
        grads = head + moe_above * numel[True] + dense_above * numel[False]
        if i == max(ex.layers):
            forward += _forward_candidates(spec, before - freed, i, frame_mask, recompute)
        backward += _backward_candidates(
            spec, before - freed, grads, G, attention_side, moe_layer, recompute
        )
    return {"forward": forward, "backward": backward}


def _forward_candidates(
    spec: ModelSpec,
    alive: sympy.Expr,
    index: int,
    frame_mask: sympy.Expr | int,
    recompute: Literal["none", "full"],
) -> list[sympy.Expr]:
    """The running bytes of layer ``index``'s block in forward; ``alive`` is what forward
    leaves less what the layers above add."""
    n = b * s
    if recompute == "none":
        # alive at the block's entry and not kept: inputs_embeds, the layer's input (the same
        # tensor in the first layer), its residual (bf16 N h each), the (1, s) position ids
        frames = (6 if index else 4) * n * h + 8 * s
        entry = alive - moe_block_kept(spec) + frames + frame_mask
    else:  # the checkpoints, the residual and the block's input (not saved)
        entry = alive + 4 * n * h + frame_mask
    if spec.experts is not None and spec.experts.block == "deepseek-v3":
        steps = deepseek_forward_steps(spec, saving=recompute == "none")
    else:
        steps = moe_forward_steps(spec, saving=recompute == "none")
    entry = sympy.expand(entry)
    return [entry + x for x in _prefix(steps)]


def _backward_candidates(
    spec: ModelSpec,
    alive: sympy.Expr,
    grads: sympy.Expr,
    G: sympy.Expr,
    attention_side: sympy.Expr,
    moe_layer: sympy.Expr,
    recompute: Literal["none", "full"],
) -> list[sympy.Expr]:
    """The running bytes of one MoE layer's block in backward (and in its recomputation);
    ``alive`` is what forward left less what the layers above kept, ``grads`` the parameters
    whose gradients exist when the block's backward starts."""
    n = b * s
    start = alive + 2 * n * h  # the incoming gradient
    if (
        spec.experts is not None and spec.experts.block == "deepseek-v3"
    ):  # its own block: vrammath.terms.moe.deepseek
        if recompute == "none":
            return _running(deepseek_backward_steps(spec), start, grads, G)
        # the first backward op (the shared experts' down projection) unpacks: the
        # recomputation starts at once and stops after the shared experts' product
        recomputing = start + attention_side + 2 * n * h + G * grads / P
        recomputing = sympy.expand(recomputing)
        out = [recomputing + x for x in _prefix(deepseek_recompute_steps(spec))]
        steps = deepseek_backward_steps(spec, recomputed=True)
        return out + _running(steps, start + moe_layer, grads, G)
    if recompute == "none":
        return _running(moe_backward_steps(spec), start, grads, G)
    head_bytes = sum((x for x, _ in _backward_head(spec)), _Z)
    upcast = 4 * n * h if _weight_bytes(spec) == 4 else 0  # freed as the recompute starts
    start += head_bytes - upcast
    # inside the recomputation: the layer's attention side and residual, then the block's
    # saving forward up to the inverse permutation
    saving = moe_forward_steps(spec)[: _recompute_stop(spec)]
    recomputing = start + attention_side + 2 * n * h + G * grads / P
    recomputing = sympy.expand(recomputing)
    out = [recomputing + x for x in _prefix(saving)]
    steps = _backward_rest(spec, recomputed=True)
    if upcast:
        steps = [(steps[0][0] + upcast, steps[0][1]), *steps[1:]]
    return out + _running(steps, start + moe_layer, grads, G)


def _prefix(steps: list[sympy.Expr]) -> list[sympy.Expr]:
    out, total = [], _Z
    for x in steps:
        total = total + sympy.expand(x)  # expanded terms sum to an expanded total
        out.append(total)
    return out


__all__ = [
    "Step",
    "moe_backward_steps",
    "moe_block_kept",
    "moe_forward_steps",
    "moe_phase_candidates",
]
