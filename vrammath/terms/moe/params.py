"""Mixture-of-experts memory: total and active parameters, the MTP module, expert parallelism.

Explanation
===========

A mixture-of-experts layer keeps ``E`` routed experts (each a gated MLP of intermediate size
``I_e``) and sends each token to ``k`` of them. Memory is set by the **total** parameters -- every
expert is resident, trained and has optimizer states -- while compute is set by the **active**
ones, the parameters one token passes through:

.. math::

    P_{active} = P - L_e (E - k) \\cdot 3 h I_e

(the embedding, head, attention, norms, routers and shared experts are all active). The
parameter tensors themselves live in :func:`vrammath.model.params.tensors` (router, 3-D expert
weights as transformers 5 stores them, shared experts); this module reads them.

Expert parallelism (``ep`` ranks) splits the routed experts; everything else is replicated over
the data-parallel group of ``N_d`` ranks (the ``gpus`` of a setup), of which the ``ep`` ranks are
a part. As in Megatron-Core and DeepSpeed-MoE, the routed experts' own data-parallel group (the
*expert-data-parallel* group) has ``N_d / ep`` ranks. ZeRO shards a state over the group that
replicates it, so per rank:

* dense parameters (attention, norms, embedding, head, routers, shared experts): ``P - P_e``
  replicated, or ``(P - P_e) / N_d`` once their ZeRO stage shards them (over the DP group);
* routed experts: ``P_e / ep`` replicated, or ``P_e / ep / (N_d / ep) = P_e / N_d`` once sharded
  (over the expert-data-parallel group).

A fully sharded state is therefore ``P / N_d`` whatever ``ep`` is; expert parallelism saves
memory in the states ZeRO leaves replicated.

Examples
========

>>> from vrammath.model.presets import load_model
>>> spec = load_model("mixtral-8x7b")
>>> param_summary(spec)["total"], param_summary(spec)["active"]
(46702792704, 12879925248)
>>> active_param_expr(spec)
-3*E*I_e*L_e*h + 3*I_e*L_e*h*k_e + P

References
==========

.. [1] Jiang et al. 2024, "Mixtral of Experts", arXiv:2401.04088 (46.7B total, 12.9B active).
.. [2] DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", arXiv:2412.19437 (671B total, 37B
   activated, MTP module; 685B on the Hub with it).
.. [3] Rajbhandari et al. 2022, "DeepSpeed-MoE", arXiv:2201.05596 (expert-data-parallel groups).
.. [4] Megatron-Core ``parallel_state.py``: ``expert_data_parallel`` group =
   ``world / (tp * pp * ep)`` with expert tensor parallelism equal to ``tp``.
"""

from __future__ import annotations

import sympy

from vrammath.model.params import _in_layer, layer_param_expr, param_count, size_values, tensors
from vrammath.model.readers import divisors_text
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError
from vrammath.notation.symbols import E, I_e, I_s, L, L_e, P, P_e, b, h, k_e, n_ep, s
from vrammath.terms.states import STATE_TENSORS


def _moe(spec: ModelSpec, what: str) -> None:
    if spec.experts is None:
        raise InputError("model", f"{what} needs a mixture-of-experts model", got=spec.name)


def expert_param_expr(spec: ModelSpec) -> sympy.Expr:
    """Parameters of the routed experts, all MoE layers: ``3 E I_e h L_e`` (gate, up, down).

    >>> from vrammath.model.presets import load_model
    >>> expert_param_expr(load_model("qwen3-30b-a3b"))
    3*E*I_e*L_e*h
    """
    _moe(spec, "expert parameters")
    total = sympy.Add(*(t.count * t.numel for t in tensors(spec) if t.component == "experts"))
    return sympy.factor_terms(sympy.expand(total))


def active_param_expr(spec: ModelSpec) -> sympy.Expr:
    """Parameters one token passes through: all of ``P`` but the ``E - k`` unused experts of each
    MoE layer (the ``P_active`` above)."""
    per_expert = expert_param_expr(spec) / E
    return sympy.expand(P - (E - k_e) * per_expert)


def _values(spec: ModelSpec) -> dict[sympy.Symbol, int]:
    top_k = {k_e: spec.experts.top_k} if spec.experts is not None else {}
    return {**size_values(spec), P: param_count(spec), **top_k}


def expert_values(spec: ModelSpec, ep: int = 1) -> dict[sympy.Symbol, int]:
    """The numbers of the expert symbols: ``k_e`` (top-k), ``P_e`` (routed-expert parameters)
    and ``n_ep`` (expert-parallel ranks).

    >>> from vrammath.model.presets import load_model
    >>> expert_values(load_model("mixtral-8x7b"), 8)
    {k_e: 2, P_e: 45097156608, n_ep: 8}
    """
    _moe(spec, "expert values")
    values = _values(spec)
    return {k_e: values[k_e], P_e: int(expert_param_expr(spec).subs(values)), n_ep: ep}


def active_param_count(spec: ModelSpec) -> int:
    """:func:`active_param_expr` evaluated: the active parameters per token.

    >>> from vrammath.model.presets import load_model
    >>> active_param_count(load_model("qwen3-30b-a3b"))
    3353032704
    """
    return int(active_param_expr(spec).subs(_values(spec)))


def mtp_param_count(spec: ModelSpec, *, stored_copies: bool = False) -> int:
    """Parameters of the multi-token-prediction modules transformers does not build.

    Each DeepSeek-V3 MTP module is one MoE decoder layer, two RMSNorms on its inputs
    (``enorm``, ``hnorm``), a projection of the concatenated pair ``eh_proj`` (``h x 2h``) and a
    final norm; it shares the embedding and the output head with the main model, which the
    checkpoint nevertheless stores again in each module: ``stored_copies`` adds them (``2 V h``),
    as the Hub's 685B total does.

    >>> from vrammath.model.presets import load_model
    >>> spec = load_model("deepseek-v3")
    >>> mtp_param_count(spec), mtp_param_count(spec, stored_copies=True)
    (11610067968, 13463426048)
    """
    if spec.mtp_layers == 0:
        return 0
    _moe(spec, "an MTP module")
    values = size_values(spec)
    layer = sum(int(t.numel.subs(values)) for t in tensors(spec) if t.count in (L, L_e))
    own = layer + 2 * spec.hidden * spec.hidden + 3 * spec.hidden
    shared = 2 * spec.vocab * spec.hidden if stored_copies else 0
    return spec.mtp_layers * (own + shared)


def router_buffer_count(spec: ModelSpec) -> int:
    """Elements of the routers' ``e_score_correction_bias`` buffers (fp32; DeepSeek-V3 only).

    >>> from vrammath.model.presets import load_model
    >>> router_buffer_count(load_model("deepseek-v3"))
    14848
    """
    ex = spec.experts
    return ex.count * len(ex.layers) if ex is not None and ex.router_bias else 0


def param_summary(spec: ModelSpec) -> dict[str, int]:
    """Total, active, routed-expert and MTP parameter counts (MTP never in ``total``).

    ``total`` is transformers' own count (``sum(p.numel() for p in model.parameters())``);
    ``total_with_mtp`` adds the MTP modules with their stored embedding/head copies (the Hub's
    checkpoint total).

    >>> from vrammath.model.presets import load_model
    >>> row = param_summary(load_model("deepseek-v3"))
    >>> row["total"], row["active"], row["total_with_mtp"]
    (671026404352, 37552282624, 684489830400)
    """
    _moe(spec, "a parameter summary")
    values = _values(spec)
    return {
        "total": param_count(spec),
        "active": active_param_count(spec),
        "routed_experts": int(expert_param_expr(spec).subs(values)),
        "mtp": mtp_param_count(spec),
        "total_with_mtp": param_count(spec) + mtp_param_count(spec, stored_copies=True),
        "router_buffers": router_buffer_count(spec),
    }


def moe_mlp_kept_exprs(spec: ModelSpec) -> dict[str, sympy.Expr]:
    """Bytes one MoE layer's MLP keeps for backward in transformers 5.24 (bf16 model, the
    grouped-matmul experts), by part: the block's input excluded (the norm output, kept by the
    layer's formula), its output listed apart (the residual add frees it in a model).

    With ``N = b s`` tokens and ``S = N k`` routed rows:

    * ``router``: fp32 routing probabilities ``4 N E`` (softmax; DeepSeek's sigmoid scores, after
      an fp32 copy of the input ``4 N h``: its group selection keeps nothing, as no gradient
      flows through it), the top-k indices ``8 N k``, and with ``norm_topk`` the normalised
      weights and their sum ``4 N k + 4 N``;
    * ``experts``: three int64 permutations ``24 S`` (gather index, sort order, inverse), the
      ``4 E`` offsets, the gathered rows ``2 S h``, the gate/up output ``4 S I_e``, SiLU and
      product ``2 S I_e`` each, the down output ``2 S h``, and the sorted routing weights ``S``
      times 4 (fp32: Mixtral, DeepSeek) or 2 (bf16: Qwen);
    * ``shared``: four ``N I_s`` bf16 tensors of the shared MLP; Qwen2-MoE's sigmoid gate
      adds its output ``2 N`` and the shared output it scales ``2 N h``;
    * ``output``: the combined ``2 N h``.

    None of these depends on which experts the tokens go to: the grouped matmul sees ``S`` rows
    in all (tests/measure/test_moe.py measures two routings). Attention (MLA included) and the
    norms are not here.

    >>> from vrammath.model.presets import load_model
    >>> moe_mlp_kept_exprs(load_model("mixtral-8x7b"))["experts"]
    4*E + 8*I_e*b*k_e*s + 4*b*h*k_e*s + 28*b*k_e*s
    """
    ex = spec.experts
    if ex is None:
        raise InputError("model", "has no experts", got=spec.name)
    n = s * b
    rows = n * k_e
    router = 4 * n * E + 8 * rows + ((4 * rows + 4 * n) if ex.norm_topk else 0)
    if ex.scoring == "sigmoid":  # DeepSeek-V3's router runs on an fp32 copy of its input
        router += 4 * n * h
    weight_bytes = ex.routing_weight_bytes
    experts = 24 * rows + 4 * E + 4 * rows * h + 8 * rows * I_e + weight_bytes * rows
    shared = 8 * n * I_s if ex.shared_intermediate else sympy.Integer(0)
    if ex.shared_gate:
        shared += 2 * n + 2 * n * h
    out = {"router": router, "experts": experts, "shared": shared, "output": 2 * n * h}
    return {k: sympy.expand(v) for k, v in out.items()}


def moe_mlp_kept_bytes(spec: ModelSpec, batch: int, seq: int) -> dict[str, int]:
    """:func:`moe_mlp_kept_exprs` evaluated for ``batch`` sequences of ``seq`` tokens.

    >>> from vrammath.model.presets import load_model
    >>> kept = moe_mlp_kept_bytes(load_model("mixtral-8x7b"), 1, 4096)
    >>> {part: round(n / 2**20, 2) for part, n in kept.items()}  # MiB per MoE layer
    {'router': 0.23, 'experts': 1024.22, 'shared': 0.0, 'output': 32.0}
    """
    values = {**_values(spec), b: batch, s: seq}
    return {k: int(v.subs(values)) for k, v in moe_mlp_kept_exprs(spec).items()}


def check_ep(spec: ModelSpec, ep: int, gpus: int) -> None:
    """``ep`` must divide the routed experts and the data-parallel ``gpus``.

    >>> from vrammath.model.presets import load_model
    >>> check_ep(load_model("mixtral-8x7b"), 3, 6)
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: ep: must divide the routed experts (8: 1, 2, 4, 8) (got 3)
    """
    if ep == 1:
        return
    ex = spec.experts
    if ex is None:
        raise InputError("ep", f"must be 1 for {spec.name}, which has no experts", got=ep)
    if ex.count % ep:
        raise InputError(
            "ep", f"must divide the routed experts ({ex.count}: {divisors_text(ex.count)})", got=ep
        )
    if gpus % ep:
        raise InputError(
            "ep",
            f"must divide --gpus={gpus} (EP ranks are part of the data-parallel group)",
            got=ep,
        )


def ep_replica_params() -> sympy.Expr:
    """Parameters one rank holds of a state ZeRO does not shard, under expert parallelism: the
    dense part whole, the routed experts split over the ``n_ep`` expert-parallel ranks. (Once
    sharded, the dense part is divided over the ``N_d`` data-parallel ranks and each rank's
    ``P_e / n_ep`` over the ``N_d / n_ep`` expert-data-parallel ones: ``P / N_d`` in all.)

    >>> ep_replica_params()
    P - P_e + P_e/n_ep
    """
    return P - P_e + P_e / n_ep


def ep_layer_param_expr(spec: ModelSpec) -> sympy.Expr:
    """Parameters of the layer ZeRO-3 gathers, under expert parallelism: a MoE layer holds its
    ``E / n_ep`` local experts (the larger of that and a dense layer, numbers deciding).

    >>> from vrammath.model.presets import load_model
    >>> spec = load_model("mixtral-8x7b")
    >>> sympy.factor(ep_layer_param_expr(spec) - layer_param_expr(spec))
    -3*E*I_e*h*(n_ep - 1)/n_ep
    """
    _moe(spec, "expert-parallel layers")

    per_layer = sympy.Add(*(t.numel for t in tensors(spec) if t.component == "experts"))
    local = layer_param_expr(spec) - per_layer + per_layer / n_ep
    if spec.experts is not None and len(spec.experts.layers) < spec.layers:
        dense = sympy.Add(*(t.numel for t in tensors(spec) if _in_layer(t, False)))
        return sympy.Max(local, dense, evaluate=False)
    return sympy.factor_terms(sympy.expand(local))


def check_ep_optimizer(optimizer: str, ep: int) -> None:
    """Expert parallelism splits optimizer states proportional to the parameters only.

    >>> check_ep_optimizer("adafactor", 8)
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: optimizer: must be one of adamw, adam, sgd, sgd-momentum with --ep > 1 (shape-dependent optimizer states are not split by group here) (got 'adafactor')
    """
    if ep > 1 and optimizer not in STATE_TENSORS:
        raise InputError(
            "optimizer",
            "must be one of " + ", ".join(STATE_TENSORS) + " with --ep > 1 "
            "(shape-dependent optimizer states are not split by group here)",
            got=optimizer,
        )


__all__ = [
    "active_param_count",
    "active_param_expr",
    "check_ep",
    "check_ep_optimizer",
    "ep_layer_param_expr",
    "ep_replica_params",
    "expert_param_expr",
    "expert_values",
    "moe_mlp_kept_bytes",
    "moe_mlp_kept_exprs",
    "mtp_param_count",
    "param_summary",
    "router_buffer_count",
]
