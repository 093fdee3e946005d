"""Mixture-of-experts and latent attention: readers, exact counts, MLA cache, expert parallelism."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sympy

import vrammath as vm
from vrammath.answers.moe_layouts import (
    ep_state_bytes,
    ep_state_exprs,
)
from vrammath.compose.setup import Setup
from vrammath.model.params import layer_param_count, param_counts, rank_param_count, size_values
from vrammath.model.presets import load_model
from vrammath.model.readers import from_hf_config
from vrammath.notation.errors import InputError
from vrammath.notation.symbols import N_d, P, P_e, n_ep
from vrammath.serve.kv_cache import kv_bytes_per_token, kv_cache_bytes, mla_kv_elements
from vrammath.serve.weights import serving_weight_bytes
from vrammath.terms.moe.params import (
    active_param_count,
    mtp_param_count,
    param_summary,
)
from vrammath.terms.states import model_state_bytes

MODELS = Path(__file__).resolve().parent.parent / "conf" / "models"

# transformers 5.24's own count on the meta device (tests/measure/test_moe.py recounts them),
# the active count, and the published (total, active) in billions.
COUNTS = {
    "mixtral-8x7b": (46_702_792_704, 12_879_925_248, (46.7, 12.9)),
    "mixtral-8x22b": (140_620_634_112, 39_152_031_744, (141, 39)),
    "qwen3-30b-a3b": (30_532_122_624, 3_353_032_704, (30.5, 3.3)),
    "qwen3-235b-a22b": (235_093_634_560, 22_190_763_520, (235, 22)),
    "deepseek-v3": (671_026_404_352, 37_552_282_624, (671, 37)),
}


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_total_and_active_parameters(name: str) -> None:
    spec = load_model(name)
    total, active, (pub_total, pub_active) = COUNTS[name]
    assert vm.param_count(spec) == total
    assert active_param_count(spec) == active
    # the published figures are these, rounded (DeepSeek-V3's 37.6B and Qwen3-30B-A3B's 3.35B
    # are published as 37B and 3.3B: within 2%)
    assert abs(total / 1e9 / pub_total - 1) < 0.005
    assert abs(active / 1e9 / pub_active - 1) < 0.02
    assert not spec.warnings


def test_deepseek_v3_mtp_is_counted_apart() -> None:
    spec = load_model("deepseek-v3")
    row = param_summary(spec)
    assert row["total"] == 671_026_404_352  # what transformers builds: no MTP module
    assert spec.mtp_layers == 1
    # one MoE layer + eh_proj (2h^2) + three norms, plus the stored embedding/head copies
    assert mtp_param_count(spec, stored_copies=True) - mtp_param_count(spec) == 2 * 129280 * 7168
    assert round(row["total_with_mtp"] / 1e9) == 684  # the Hub's "685B" (671B + 14B, rounded up)
    assert row["router_buffers"] == 256 * 58


def test_deepseek_v3_tensors_follow_transformers() -> None:
    spec = load_model("deepseek-v3")
    counts = param_counts(spec)
    h, a = 7168, 128
    attention = h * 1536 + 1536 * a * 192 + h * 576 + 512 * a * 256 + a * 128 * h
    assert counts["attention"] == 61 * attention
    assert counts["mlp"] == 3 * 3 * h * 18432  # the three dense layers
    assert counts["experts"] == 58 * 256 * 3 * h * 2048
    assert counts["shared_experts"] == 58 * 3 * h * 2048
    assert counts["router"] == 58 * 256 * h
    # ZeRO-3 gathers the larger layer: a MoE one
    assert layer_param_count(spec) == attention + 2 * h + 1536 + 512 + (256 + 1) * 3 * h * 2048 + (
        256 * h
    )


def test_first_k_dense_and_sparse_step_layers() -> None:
    q = json.loads((MODELS / "qwen3-30b-a3b.json").read_text())
    spec = from_hf_config({**q, "decoder_sparse_step": 2, "mlp_only_layers": [1, 3]})
    assert spec.experts is not None
    assert spec.experts.layers[:3] == (5, 7, 9)  # odd indices, minus 1 and 3
    assert len(spec.experts.layers) == 22
    dense = from_hf_config({**q, "mlp_only_layers": list(range(48))})
    assert dense.experts is not None
    assert dense.experts.layers == ()
    # all dense: the count is a dense Qwen3 with q/k norms and zero experts
    assert param_counts(dense)["experts"] == 0


def test_mla_kv_cache_against_gqa() -> None:
    ds, llama = load_model("deepseek-v3"), load_model("llama-3.1-405b")
    assert int(mla_kv_elements(ds).subs(size_values(ds))) == 512 + 64
    assert int(mla_kv_elements(ds, decompressed=True).subs(size_values(ds))) == 128 * 320
    assert kv_bytes_per_token(ds) == 61 * 576 * 2 == 70_272
    assert kv_bytes_per_token(llama) == 2 * 126 * 8 * 128 * 2 == 516_096
    assert round(kv_bytes_per_token(llama) / kv_bytes_per_token(ds), 2) == 7.34
    # replicated on every tensor-parallel rank
    assert kv_cache_bytes(ds, 1, 4096, tp=8) == kv_cache_bytes(ds, 1, 4096) == 70_272 * 4096


def test_serving_weights_hold_every_expert() -> None:
    spec = load_model("mixtral-8x7b")
    weights = serving_weight_bytes(spec, "bf16")["weights"]
    assert weights == 2 * 46_702_792_704
    # the router is replicated over tensor-parallel ranks, everything else split
    tp8 = serving_weight_bytes(spec, "bf16", tp=8)["weights"]
    assert tp8 == 2 * (46_702_792_704 - 32 * 8 * 4096 - 65 * 4096) // 8 + 2 * (
        32 * 8 * 4096 + 65 * 4096
    )


def test_states_of_every_expert_follow_the_tensors() -> None:
    spec = load_model("qwen3-30b-a3b")
    total = vm.param_count(spec)
    assert model_state_bytes(spec, "bf16-mixed", "adamw") == {
        "weights": 2 * total,
        "gradients": 2 * total,
        "master": 4 * total,
        "optimizer": 8 * total,
    }
    # adafactor factors each expert's matrix: one row and one column vector per expert
    small = from_hf_config(
        {
            "model_type": "mixtral",
            "hidden_size": 8,
            "intermediate_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "vocab_size": 10,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
        }
    )
    ada = model_state_bytes(small, "fp32", "adafactor")["optimizer"]
    factored = 4 * (4 * 32 + 4 * 8) + 4 * (4 * 8 + 4 * 16)  # gate_up (4,32,8), down (4,8,16)
    # embedding and head (10, 8), q and o (8, 8), k and v (4, 8), router (4, 8), three norms
    other = 4 * ((10 + 8) * 2 + (8 + 8) * 2 + (4 + 8) * 2 + (4 + 8) + 8 * 3)
    assert ada == factored + other


def test_expert_parallel_states() -> None:
    spec = load_model("mixtral-8x7b")
    exprs = ep_state_exprs(spec, "bf16-mixed", "adamw", 2)
    assert exprs["master"] == 4 * P / N_d  # sharded over DP (dense) and DP/EP (experts)
    assert sympy.simplify(exprs["weights"] - 2 * (P - P_e + P_e / n_ep)) == 0
    one = ep_state_bytes(spec, zero=0, gpus=8, ep=1)
    eight = ep_state_bytes(spec, zero=0, gpus=8, ep=8)
    experts = 32 * 8 * 3 * 4096 * 14336
    assert one["weights"] - eight["weights"] == 2 * (experts - experts // 8)
    assert ep_state_bytes(spec, zero=3, gpus=8, ep=8) == ep_state_bytes(spec, zero=3, gpus=8)
    assert rank_param_count(spec, ep=8) == 46_702_792_704 - experts + experts // 8


BASE_MOE: dict[str, Any] = {
    "model_type": "qwen3_moe",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 100,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
}
DS = json.loads((MODELS / "deepseek-v3.json").read_text())


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (
            {**BASE_MOE, "num_experts_per_tok": 9},
            "num_experts_per_tok: must be at most num_experts=8 (got 9)",
        ),
        (
            {**DS, "num_key_value_heads": 16},
            "num_key_value_heads: must equal num_attention_heads=128 (latent attention expands "
            "K/V per head) (got 16)",
        ),
        ({**DS, "qk_rope_head_dim": 63}, "qk_rope_head_dim: must be even (RoPE rotates pairs)"),
        ({**DS, "scoring_func": "softmax"}, "scoring_func: must be one of sigmoid (got 'softmax')"),
        ({**DS, "topk_method": "greedy"}, "topk_method: must be one of noaux_tc (got 'greedy')"),
        ({**DS, "n_group": 7}, "n_group: must divide n_routed_experts=256"),
        ({**BASE_MOE, "mlp_only_layers": [5]}, "mlp_only_layers: must be a list of layer"),
        ({**BASE_MOE, "output_router_logits": True}, "output_router_logits: must be false"),
        (
            {**BASE_MOE, "model_type": "llama", "num_experts": 8},
            "num_experts: mixture-of-experts is not modelled by the llama reader",
        ),
    ],
)
def test_bad_moe_configs(cfg: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError) as info:
        from_hf_config(cfg)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_ep_must_divide_experts_and_gpus() -> None:
    spec = load_model("qwen3-30b-a3b")
    with pytest.raises(InputError, match=r"^ep: must divide the routed experts \(128"):
        Setup(spec, ep=3, gpus=3)
    with pytest.raises(InputError, match=r"^ep: must divide --gpus=4"):
        Setup(spec, ep=8, gpus=4)
    assert Setup(spec, ep=8, gpus=16).ep == 8


def test_training_estimate_of_deepseek_under_zero3_is_refused_in_one_line() -> None:
    setup = Setup(load_model("deepseek-v3"), recipe="bf16-pure", zero=3, gpus=8)
    with pytest.raises(InputError, match=r"^zero: 3: ZeRO-3 of deepseek_v3 is not modelled"):
        vm.estimate(setup)


def test_moe_activations_compose_and_refuse_what_is_not_derived() -> None:
    from vrammath.notation.symbols import L, L_e
    from vrammath.terms.activations.layer import hf_layer_terms
    from vrammath.terms.activations.model import hf_activation_bytes
    from vrammath.terms.moe.params import moe_mlp_kept_exprs

    spec = load_model("mixtral-8x7b")
    dense = hf_layer_terms(spec, "sdpa", "bf16")
    moe = moe_mlp_kept_exprs(spec)
    layer = sum(dense.values()) - dense["mlp"] + moe["router"] + moe["experts"] + moe["shared"]
    total = hf_activation_bytes(spec, "sdpa", "bf16")
    # the same model with dense layers: its non-layer terms are the MoE model's
    rest = hf_activation_bytes(load_model("mistral-7b-v0.3"), "sdpa", "bf16")
    assert sympy.expand(total.subs(L_e, L) - L * layer - (rest - L * sum(dense.values()))) == 0
    with pytest.raises(InputError, match=r"^precision: MoE activations are derived"):
        hf_activation_bytes(spec, "sdpa", "fp32")


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b"])
def test_moe_attention_dropout_is_refused(name: str) -> None:
    """The MoE layers are measured without attention dropout: refused, not silently ignored."""
    cfg = {**vm.raw_config(name), "attention_dropout": 0.1}
    with pytest.raises(InputError) as info:
        from_hf_config(cfg)
    model_type = cfg["model_type"]
    assert str(info.value) == (
        f"attention_dropout: must be 0.0 (dropout in {model_type} attention is not modelled) "
        "(got 0.1)"
    )
