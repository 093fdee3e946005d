"""DeepSeek-V3's MoE block op by op, as transformers 5.24 trains it (bf16, grouped matmul).

Explanation
===========

``DeepseekV3MoE`` routes first (``DeepseekV3TopkRouter``: an fp32 copy of the input, fp32 logits,
sigmoid scores, the correction bias, the group scores -- each group's top two, summed -- the
``topk_group`` best groups masked in, the top-k experts, their scores gathered, normalised
(``norm_topk_prob``) and scaled by ``routed_scaling_factor``), then runs the routed experts
(``grouped_mm_experts_forward``, the same ops as Mixtral's with fp32 routing weights) and only
then the shared experts, whose output is added last. Each list here holds, op by op, the bytes
the op adds to what is alive less what is freed by the time it returns; a step of the backward
lists is ``(bytes, parameters whose gradients it creates)``. With ``N = b s`` tokens, ``S = N k``
routed rows, ``G`` groups (``n_group``) of which ``g`` are chosen (``topk_group``):

* :func:`deepseek_forward_steps` -- from the block's entry to its output; ``saving=False`` inside a
  non-reentrant checkpoint, where each tensor is freed once no Python name holds it (the fp32
  input copy after the logits, the group top-k's outputs after their sum, ...). The router's
  selection keeps nothing for backward (no gradient reaches it) and is freed when the router
  returns (``-9 N E - 24 N G - 8 N g - 4 N k``);
* :func:`deepseek_backward_steps` -- from the output's gradient: the shared experts first (their
  three weight gradients, ``h I_s`` each), the combine (the fp32 upcast ``4 N h``, the expanded
  and scattered rows ``4 S h`` each), the weighting, the grouped matmuls' gradients (down, then
  gate/up), the scatter back to the tokens, the router (normalisation, sigmoid, the fp32 weight's
  gradient ``4 E h``, the input's fp32 gradient cast back); ``recomputed=True`` for a layer
  recomputed under full checkpointing, where each saved tensor is freed as soon as its op has
  unpacked it;
* :func:`deepseek_recompute_steps` -- the recomputation of the block when backward reaches a
  checkpointed layer, which stops once the shared experts' product (the last tensor saved) is
  saved again: the down projection and the output are never recomputed.

Every list was read off PyTorch's own count (``MemTracker`` after each op) at sixteen random
sizes, each step fitted exactly by integer coefficients (tests/measure/test_latent_attention.py
replays it). The saving forward sums to the block's kept bytes and output
(:func:`vrammath.terms.moe.params.moe_mlp_kept_exprs`) plus what the block frees as it returns.

Examples
========

>>> from vrammath.model.presets import load_model
>>> spec = load_model("deepseek-v3")
>>> steps = deepseek_forward_steps(spec)
>>> len(steps), steps[0], steps[4]
(43, 4*b*h*s, 192*b*s)

References
==========

.. [1] transformers 5.24 ``models/deepseek_v3/modeling_deepseek_v3.py`` (``DeepseekV3TopkRouter``,
   ``DeepseekV3MoE``) and ``integrations/moe.py`` (``grouped_mm_experts_forward``).
"""

from __future__ import annotations

import sympy

from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError
from vrammath.notation.symbols import E, I_e, I_s, b, h, k_e, s

#: One backward op, as the pair (bytes added less bytes freed, parameters whose gradients it makes).
Step = tuple[sympy.Expr, sympy.Expr]

_Z = sympy.Integer(0)


def _sizes(spec: ModelSpec) -> tuple[sympy.Expr, sympy.Expr, int, int, bool]:
    ex = spec.experts
    if ex is None or ex.block != "deepseek-v3":
        raise InputError("model", "must be a deepseek_v3 model", got=spec.name)
    n = b * s
    return n, n * k_e, ex.groups, ex.groups_chosen, ex.norm_topk


def _router_forward(spec: ModelSpec, *, saving: bool) -> list[sympy.Expr]:
    n, rows, G, g, norm = _sizes(spec)
    steps: list[sympy.Expr] = [4 * n * h, 4 * n * E]  # the fp32 input copy, the logits
    if saving:
        steps += [4 * n * E, 4 * n * E, 24 * n * G, 4 * n * G]  # sigmoid, + bias, top-2, sum
    else:  # the input copy goes after the logits, the top-2 after their sum
        steps += [4 * n * E - 4 * n * h, 4 * n * E, 24 * n * G, -12 * n * G]
    steps += [12 * n * g - 8 * n * G, 4 * n * G - 4 * n * g]  # group top-k, the group mask
    steps += [4 * n * E, n * E, n * E, 3 * n * E]  # the expert mask, as bool, negated, applied
    steps.append(12 * rows - (4 if saving else 5) * n * E)  # the top-k experts
    if norm:  # the sum, + 1e-20, the normalised copy
        steps += [4 * n, 4 * n, 4 * rows - 4 * n]
    if saving or not norm:
        steps.append(4 * rows)  # * routed_scaling_factor
    if saving:  # the router returns: its selection's tensors go
        steps.append(-9 * n * E - 24 * n * G - 8 * n * g - 4 * rows)
    else:
        steps.append(-12 * n * E - 8 * n * G - 8 * n * g - 4 * rows - (4 * n if norm else 0))
    return steps


def _experts_forward(*, saving: bool, rows: sympy.Expr, n: sympy.Expr) -> list[sympy.Expr]:
    mid = 2 * rows * I_e
    steps: list[sympy.Expr] = [16 * rows, 8 * rows, 2 * rows * h]  # sort, gather index, rows
    steps += [4 * rows if saving else -4 * rows, 4 * rows, 4 * E, 4 * E]  # weights, histogram
    steps += [2 * mid, mid, mid]  # gate/up, SiLU, product
    if saving:
        steps += [2 * rows * h]
    else:
        steps += [-3 * mid, 2 * rows * h, -mid]
    steps += [4 * rows * h, 8 * rows, 8 * rows, 4 * rows * h - 8 * rows, -4 * rows * h]
    steps += [4 * n * h, 2 * n * h]  # the fp32 sum per token, its bf16 cast
    if saving:
        steps.append(-4 * n * h - 12 * rows - 4 * rows * h - 4 * E)
    else:
        steps.append(-4 * n * h - 32 * rows - 8 * rows * h - 8 * E)
    return steps


def _shared_forward(n: sympy.Expr, *, saving: bool) -> list[sympy.Expr]:
    mid = 2 * n * I_s
    if saving:  # gate, SiLU, up, product, down, the output
        return [mid, mid, mid, mid, 2 * n * h, 2 * n * h]
    return [mid, mid, -mid, mid, mid, -2 * mid, 2 * n * h, 2 * n * h - mid]


def deepseek_forward_steps(spec: ModelSpec, *, saving: bool = True) -> list[sympy.Expr]:
    """The bytes each op of one DeepSeek-V3 MoE block's forward adds (less what it frees), from
    the block's entry to its output (router, routed experts, shared experts, the sum).

    >>> from vrammath.model.presets import load_model
    >>> spec = load_model("deepseek-v3")
    >>> from vrammath.terms.moe.params import moe_mlp_kept_exprs
    >>> kept = moe_mlp_kept_exprs(spec)
    >>> sympy.expand(sum(deepseek_forward_steps(spec)) - sum(kept.values()))
    4*E*b*s + 4*b*h*s + 4*b*k_e*s

    Beyond what the block keeps and its output: the logits and the scaled weights the router
    returned and the two outputs summed, freed as the block returns.
    """
    n, rows, *_ = _sizes(spec)
    steps = _router_forward(spec, saving=saving)
    steps += _experts_forward(saving=saving, rows=rows, n=n)
    steps += _shared_forward(n, saving=saving)
    return [sympy.expand(x) for x in steps]


def deepseek_recompute_steps(spec: ModelSpec) -> list[sympy.Expr]:
    """The block's recomputation in backward: the saving forward up to the shared experts'
    product (the last tensor saved), where the non-reentrant checkpoint stops, and what the stop
    frees.

    >>> from vrammath.model.presets import load_model
    >>> len(deepseek_recompute_steps(load_model("deepseek-v3")))
    42
    """
    n, rows, *_ = _sizes(spec)
    # the stop frees what was recomputed and not saved: the logits, the scaled weights, the
    # routed experts' output
    return [*deepseek_forward_steps(spec)[:-2], sympy.expand(-2 * n * h - 4 * n * E - 4 * rows)]


def _shared_backward(n: sympy.Expr) -> list[Step]:
    mid = 2 * n * I_s
    return [
        (_Z, h * I_s),  # down_proj's gradient
        (mid, _Z),
        (-mid, _Z),
        (mid, _Z),
        (mid, _Z),  # the product's two gradients
        (-3 * mid, _Z),
        (_Z, h * I_s),  # up_proj's
        (2 * n * h, _Z),
        (-mid, _Z),
        (mid, _Z),  # SiLU's
        (-2 * mid, _Z),
        (_Z, h * I_s),  # gate_proj's
        (2 * n * h, _Z),
        (-mid - 2 * n * h, _Z),  # the block's input goes: only gate/up_proj saved it
        (2 * n * h, _Z),  # the input's two gradients summed
        (-4 * n * h, _Z),
    ]


def _experts_backward(n: sympy.Expr, rows: sympy.Expr, *, recomputed: bool) -> list[Step]:
    big = 4 * rows * h
    mid = 2 * rows * I_e
    out: list[Step] = [
        (4 * n * h, _Z),  # the output's gradient upcast to fp32
        (big, _Z),  # expanded over the k rows
        (big - 4 * n * h, _Z),
        (big, _Z),  # scattered back to the sorted order
    ]
    if recomputed:  # the saved down output and weights are freed once unpacked
        out += [(-8 * rows - 2 * big, _Z), (big, _Z), (big, _Z), (-4 * rows, _Z)]
        out += [(4 * rows - big, _Z), (-2 * big, _Z)]
    else:
        out += [(-8 * rows - big, _Z), (big, _Z), (2 * rows * h, _Z)]
        out += [(4 * rows - big, _Z), (-4 * rows - 10 * rows * h, _Z)]
    out += [(_Z, E * h * I_e), (mid, _Z), (-2 * rows * h - mid, _Z)]  # down_proj
    if recomputed:
        out += [(mid, _Z), (mid, _Z), (-2 * mid, _Z), (mid, _Z), (-mid, _Z), (-2 * mid, _Z)]
    else:
        out += [(mid, _Z), (mid, _Z), (-mid, _Z), (-mid, _Z), (-2 * mid, _Z)]
    out += [(_Z, 2 * E * h * I_e), (2 * rows * h, _Z), (-2 * rows * h - 2 * mid - 4 * E, _Z)]
    out += [(4 * rows, _Z), (4 * rows, _Z), (2 * n * h - 16 * rows, _Z), (2 * n * h, _Z)]
    out += [(-2 * n * h - 8 * rows - 2 * rows * h, _Z), (2 * n * h, _Z)]  # joins the shared's
    return out


def _router_backward(spec: ModelSpec, *, recomputed: bool) -> list[Step]:
    n, rows, _, _, norm = _sizes(spec)
    out: list[Step] = [(4 * rows - 4 * n * h, _Z)]  # the scaling's gradient
    if recomputed:
        out.append((-4 * rows, _Z))
    if norm:
        if recomputed:
            out += [(4 * rows, _Z), (4 * rows, _Z), (4 * rows, _Z), (4 * rows, _Z)]
            out += [(-8 * rows, _Z), (-4 * rows, _Z), (-8 * rows, _Z), (4 * rows, _Z)]
            out += [(-4 * rows - 4 * n, _Z), (4 * n * E, _Z)]
        else:
            out += [(4 * rows, _Z), (4 * rows, _Z), (4 * rows, _Z), (-8 * rows, _Z)]
            out += [(4 * n, _Z), (-12 * rows - 4 * n, _Z), (4 * rows, _Z)]
            out += [(4 * n * E - 4 * rows - 4 * n, _Z)]
    elif recomputed:
        out += [(4 * n * E, _Z)]
    else:
        out += [(4 * n * E - 4 * rows, _Z)]
    out += [(4 * n * E, _Z), (-4 * n * E - 12 * rows, _Z), (4 * n * E, _Z), (-8 * n * E, _Z)]
    out += [(_Z, E * h), (4 * n * h, _Z), (-4 * n * h - 4 * n * E, _Z)]  # the fp32 weight
    out += [(2 * n * h, _Z), (-4 * n * h, _Z), (2 * n * h, _Z), (-4 * n * h, _Z)]
    return out


def deepseek_backward_steps(spec: ModelSpec, *, recomputed: bool = False) -> list[Step]:
    """The (bytes, new gradient parameters) of each op of one DeepSeek-V3 MoE block's backward,
    from the output's gradient to the input's (shared experts, routed experts, router).

    >>> from vrammath.model.presets import load_model
    >>> steps = deepseek_backward_steps(load_model("deepseek-v3"))
    >>> sum(g for _, g in steps)
    3*E*I_e*h + E*h + 3*I_s*h
    """
    n, rows, *_ = _sizes(spec)
    steps = _shared_backward(n) + _experts_backward(n, rows, recomputed=recomputed)
    steps += _router_backward(spec, recomputed=recomputed)
    return [(sympy.expand(x), sympy.expand(g)) for x, g in steps]


__all__ = [
    "Step",
    "deepseek_backward_steps",
    "deepseek_forward_steps",
    "deepseek_recompute_steps",
]
