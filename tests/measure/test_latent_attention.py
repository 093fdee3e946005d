"""DeepSeek-V3's whole-model activations against transformers 5.24 itself (``measure``).

Small odd deepseek_v3 configs (q_lora_rank set and null, one dense layer, shared experts, group
routing with n_group and topk_group above 1), built by transformers in bf16 with the
grouped-matmul experts; MemTracker counts, on real CPU tensors, what a training forward keeps at
its end (the logits the caller still holds removed). It equals
:func:`vrammath.terms.activations.model.hf_activation_bytes` (``device="cpu"``) to the byte, for eager and
SDPA attention (PyTorch's flash kernel when v_head_dim equals qk_head_dim, its math kernel
otherwise), without recomputation and with full recomputation, at several (b, s) and for two
routings of the same tokens. bf16 only: the grouped matmul takes bf16 inputs.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from vrammath.model.params import size_values  # noqa: E402
from vrammath.model.readers import from_hf_config  # noqa: E402
from vrammath.notation.symbols import b, k_e, s  # noqa: E402
from vrammath.terms.activations.model import hf_activation_bytes  # noqa: E402

pytestmark = [
    pytest.mark.measure,
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

CONFIGS: dict[str, dict[str, Any]] = {
    # low-rank q; v_head_dim differs from qk_head_dim (SDPA's math kernel on a CPU); 4 groups of
    # 2 experts, 2 chosen
    "q-lora": {
        "vocab_size": 131,
        "hidden_size": 72,
        "intermediate_size": 88,
        "num_hidden_layers": 3,
        "num_attention_heads": 3,
        "num_key_value_heads": 3,
        "q_lora_rank": 20,
        "kv_lora_rank": 14,
        "qk_nope_head_dim": 6,
        "qk_rope_head_dim": 4,
        "v_head_dim": 12,
        "n_routed_experts": 8,
        "num_experts_per_tok": 3,
        "n_group": 4,
        "topk_group": 2,
        "moe_intermediate_size": 24,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
    },
    # a full q_proj, v_head_dim = qk_head_dim (SDPA's flash kernel), two shared experts,
    # unnormalised weights, the half-rotation RoPE
    "q-full": {
        "vocab_size": 97,
        "hidden_size": 56,
        "intermediate_size": 72,
        "num_hidden_layers": 2,
        "num_attention_heads": 5,
        "num_key_value_heads": 5,
        "q_lora_rank": None,
        "kv_lora_rank": 18,
        "qk_nope_head_dim": 10,
        "qk_rope_head_dim": 6,
        "v_head_dim": 16,
        "n_routed_experts": 6,
        "num_experts_per_tok": 2,
        "n_group": 3,
        "topk_group": 2,
        "moe_intermediate_size": 16,
        "n_shared_experts": 2,
        "norm_topk_prob": False,
        "rope_interleave": False,
        "first_k_dense_replace": 1,
    },
}


def _config(name: str) -> dict[str, Any]:
    return {"model_type": "deepseek_v3", "max_position_embeddings": 256, **CONFIGS[name]}


def _kept(
    name: str, attention: str, recompute: str, batch: int, seq: int, seed: int = 0
) -> tuple[int, Any]:
    """Activation bytes MemTracker counts at the end of forward, and the experts' loads."""
    from torch.distributed._tools.mem_tracker import MemTracker

    cfg = _config(name)
    torch.manual_seed(seed)
    hf = transformers.AutoConfig.for_model("deepseek_v3", **CONFIGS[name])
    hf.max_position_embeddings = 256
    hf._attn_implementation = attention
    hf._experts_implementation = "grouped_mm"
    hf.use_cache = False
    model = transformers.AutoModelForCausalLM.from_config(hf, dtype=torch.bfloat16).train()
    if recompute == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    routes: list[Any] = []
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "e_score_correction_bias"):
                n = module.e_score_correction_bias.numel()
                module.e_score_correction_bias.add_(0.5 * seed * torch.arange(n))
                module.weight.normal_(0, 1.0)
                # the loads as Python numbers: a tensor kept here would count as an activation
                module.register_forward_hook(lambda _m, _i, out: routes.append(out[2].tolist()))
    ids = torch.randint(
        0, cfg["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(0)
    )
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        out = model(input_ids=ids, labels=ids)
        snapshot = tracker.get_tracker_snapshot("current")
        out.loss.backward()
    (per_kind,) = snapshot.values()
    kept = {str(k).rsplit(".", 1)[-1]: v for k, v in per_kind.items()}
    load = sorted(expert for layer in routes for token in layer for expert in token)
    return kept["ACT"] - out.logits.numel() * out.logits.element_size(), load


def _predicted(name: str, attention: Any, recompute: Any, batch: int, seq: int) -> int:
    spec = from_hf_config(_config(name))
    assert spec.experts is not None
    values = {**size_values(spec), k_e: spec.experts.top_k, b: batch, s: seq}
    return int(hf_activation_bytes(spec, attention, "bf16", recompute, device="cpu").subs(values))


@pytest.mark.parametrize(("batch", "seq"), [(1, 17), (2, 33), (3, 8)])
@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_whole_model_activations_exact(
    name: str, attention: str, recompute: str, batch: int, seq: int
) -> None:
    measured, _ = _kept(name, attention, recompute, batch, seq)
    assert measured == _predicted(name, attention, recompute, batch, seq)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_kept_bytes_do_not_depend_on_routing(name: str) -> None:
    one, load_one = _kept(name, "sdpa", "none", 2, 24, seed=0)
    two, load_two = _kept(name, "sdpa", "none", 2, 24, seed=1)
    assert load_one != load_two  # other router weights and biases, other experts
    assert one == two == _predicted(name, "sdpa", "none", 2, 24)


# --- the MoE block op by op (vrammath.terms.moe.deepseek) ---------------------------------------

BLOCKS: dict[str, dict[str, Any]] = {
    "normalised": {"hidden_size": 72, "moe_intermediate_size": 24, "n_shared_experts": 2},
    "unnormalised": {"hidden_size": 56, "moe_intermediate_size": 16, "norm_topk_prob": False},
}
"""Each with 12 experts in 4 groups, 3 groups chosen, top-5; 2 layers, the second MoE."""


ROUTES: dict[int | None, list[tuple[int, ...]]] = {}


def _trace_block(
    name: str, tokens: int, mode: str, seed: int | None = None
) -> tuple[list[int], int, Any]:
    """The bytes alive after each op of the MoE block's forward (and backward), as MemTracker
    counts them, relative to the block's entry; the index where backward starts; the spec."""
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker
    from torch.utils.checkpoint import checkpoint

    cfg = {
        "model_type": "deepseek_v3",
        "vocab_size": 64,
        "intermediate_size": 40,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "q_lora_rank": 8,
        "kv_lora_rank": 8,
        "qk_nope_head_dim": 4,
        "qk_rope_head_dim": 4,
        "v_head_dim": 4,
        "n_routed_experts": 12,
        "num_experts_per_tok": 5,
        "n_group": 4,
        "topk_group": 3,
        "first_k_dense_replace": 1,
        **BLOCKS[name],
    }
    hf = transformers.AutoConfig.for_model(
        "deepseek_v3", **{k: v for k, v in cfg.items() if k != "model_type"}
    )
    hf._experts_implementation = "grouped_mm"
    hf.use_cache = False
    if seed is not None:
        torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf, dtype=torch.bfloat16).train()
    block = model.model.layers[1].mlp
    if seed is not None:  # another router and correction bias: other experts for the tokens
        with torch.no_grad():
            block.gate.weight.normal_(0, 1.0)
            block.gate.e_score_correction_bias.copy_(0.5 * seed * torch.arange(12))
    leaf = torch.randn(
        1, tokens, cfg["hidden_size"], generator=torch.Generator().manual_seed(0)
    ).to(torch.bfloat16)
    leaf.requires_grad_(True)
    # the block's input as in a model: a norm's output that only the saved tensors hold
    x = leaf * 1
    entry_bytes = x.numel() * x.element_size()
    with torch.no_grad():  # the experts each token goes to, before anything is counted
        ROUTES[seed] = [tuple(r) for r in block.gate(x)[2].sort(dim=-1).values.tolist()]
    alive: list[int] = []

    class Trace(MemTracker):
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            out = super().__torch_dispatch__(func, types, args, kwargs)
            alive.append(sum(snap[_TOTAL_KEY] for snap in self._curr_mem_snap.values()))
            return out

    tracker = Trace()
    tracker.track_external(block)
    with tracker:
        if mode == "nosave":
            with torch.autograd.graph.saved_tensors_hooks(lambda t: None, lambda t: t):
                out = block(x)
        elif mode == "save":
            out = block(x)
        else:  # under a checkpoint the block's input is recomputed too, as a model's norm output
            out = checkpoint(lambda y: block(y * 1), x, use_reentrant=False)
        del x
        mark = len(alive)
        if mode != "nosave":
            out.backward(torch.ones_like(out))
    params = sum(p.numel() * p.element_size() for p in block.parameters())
    buffers = sum(t.numel() * t.element_size() for t in block.buffers())
    entry = params + buffers + entry_bytes  # first seen at the first op
    return [n - entry for n in alive], mark, from_hf_config(cfg)


def _changes(alive: list[int]) -> list[int]:
    deltas = [now - before for before, now in zip([0, *alive[:-1]], alive, strict=True)]
    return [d for d in deltas if d]


def _values(spec: Any, tokens: int) -> dict[Any, int]:
    return {**size_values(spec), k_e: spec.experts.top_k, b: 1, s: tokens}


def _steps_bytes(steps: list[Any], values: dict[Any, int]) -> list[int]:
    """Backward steps as bytes: bf16 gradients, but the router's fp32 weight's."""
    from vrammath.notation.symbols import E, h

    router = E * h
    out = [int((x + (4 if g == router else 2) * g).subs(values)) for x, g in steps]
    return [n for n in out if n]


@pytest.mark.parametrize("tokens", [13, 40])
@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_block_steps_are_pytorch_count(name: str, tokens: int) -> None:
    from vrammath.terms.moe.deepseek import deepseek_backward_steps, deepseek_forward_steps

    alive, mark, spec = _trace_block(name, tokens, "save")
    values = _values(spec, tokens)
    forward = [int(x.subs(values)) for x in deepseek_forward_steps(spec)]
    assert _changes(alive[:mark]) == [n for n in forward if n]
    # backward: the first op makes the incoming gradient as the block's return frees its locals;
    # the last frees the input's gradient parts, as the test's leaf (not a norm) takes it
    backward = _steps_bytes(deepseek_backward_steps(spec), values)
    measured = _changes(alive)[len(_changes(alive[:mark])) + 1 :]
    assert measured[: len(backward) - 1] == backward[:-1]
    alive, mark, spec = _trace_block(name, tokens, "nosave")
    saving = [int(x.subs(values)) for x in deepseek_forward_steps(spec, saving=False)]
    assert _changes(alive) == [n for n in saving if n]


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_recomputed_block_steps_reach_pytorch_peak(name: str) -> None:
    """Under a non-reentrant checkpoint: the recomputation, then the recomputed backward; the
    checkpoint splits a few router ops the lists join, so the running peak and the end are
    compared."""
    from vrammath.terms.moe.deepseek import deepseek_backward_steps, deepseek_recompute_steps

    tokens = 24
    alive, mark, spec = _trace_block(name, tokens, "ckpt")
    values = _values(spec, tokens)
    # the incoming gradient made, the forward's locals freed, the block's input recomputed
    start = alive[mark] + 2 * tokens * spec.hidden
    steps = [int(x.subs(values)) for x in deepseek_recompute_steps(spec)]
    steps += _steps_bytes(deepseek_backward_steps(spec, recomputed=True), values)
    running, peak = start, start
    for step in steps:
        running += step
        peak = max(peak, running)
    assert (peak, running) == (max(alive[mark:]), alive[-1])


def test_block_steps_do_not_depend_on_routing() -> None:
    """Every op's bytes, forward and backward, are the same for two routings of the same tokens
    (the grouped matmul sees S = N k rows whichever experts they go to)."""
    one, _, _ = _trace_block("normalised", 40, "save", seed=0)
    two, _, _ = _trace_block("normalised", 40, "save", seed=1)
    assert ROUTES[0] != ROUTES[1]  # the same tokens went to other experts
    assert one == two
