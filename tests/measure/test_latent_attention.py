"""DeepSeek-V3's whole-model activations against transformers 5.24 itself (``measure``).

Small odd deepseek_v3 configs (q_lora_rank set and null, one dense layer, shared experts, group
routing with n_group and topk_group above 1), built by transformers in bf16 with the
grouped-matmul experts; MemTracker counts, on real CPU tensors, what a training forward keeps at
its end (the logits the caller still holds removed). It equals
:func:`vrammath.activations.hf_activation_bytes` (``device="cpu"``) to the byte, for eager and
SDPA attention (PyTorch's flash kernel when v_head_dim equals qk_head_dim, its math kernel
otherwise), without recomputation and with full recomputation, at several (b, s) and for two
routings of the same tokens. bf16 only: the grouped matmul takes bf16 inputs.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from vrammath.activations import hf_activation_bytes  # noqa: E402
from vrammath.model import from_hf_config  # noqa: E402
from vrammath.params import size_values  # noqa: E402
from vrammath.symbols import b, k_e, s  # noqa: E402

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
