"""LoRA and QLoRA on mixture-of-experts and latent-attention models: targets, exact counts,
the quantized storage of the experts (peft's and bitsandbytes' behaviour is measured in
tests/measure/test_lora_moe.py)."""

from __future__ import annotations

import math

import pytest
import sympy

import vrammath as vm
from vrammath.compose.setup import Setup, setup_warnings
from vrammath.model.params import size_values
from vrammath.model.presets import load_model
from vrammath.notation.errors import InputError
from vrammath.notation.symbols import L, b, r, s
from vrammath.notation.vocab import Quant
from vrammath.terms.lora.adapters import lora_activation_layer_expr, lora_param_count
from vrammath.terms.lora.linears import adapted_linears
from vrammath.terms.lora.quant import (
    NF4_BLOCK,
    NF4_DQ_BLOCK,
    dequant_buffer_expr,
    frozen_base_exprs,
    quantized_tensors,
)
from vrammath.terms.lora.targets import lora_targets
from vrammath.terms.moe.params import param_summary
from vrammath.terms.states import state_values

H, I_E, E, LAYERS, KV = 4096, 14336, 8, 32, 1024  # Mixtral-8x7B


def test_mixtral_all_linear_by_hand() -> None:
    """peft's all-linear on transformers 5: attention, the router, and the experts with the
    fused gate_up_proj at rank 2r (one LoRA per expert)."""
    rank = 16
    attention = rank * ((H + H) + (H + KV) + (H + KV) + (H + H))
    router = rank * (H + E)
    gate_up = 2 * rank * E * (H + 2 * I_E)
    down = rank * E * (I_E + H)
    expected = LAYERS * (attention + router + gate_up + down)
    assert lora_param_count(load_model("mixtral-8x7b"), rank, "all-linear") == expected
    experts = LAYERS * rank * E * ((H + 2 * I_E) + (I_E + H))
    assert lora_param_count(load_model("mixtral-8x7b"), rank, "experts") == experts


def test_deepseek_mla_targets_and_counts() -> None:
    spec = load_model("deepseek-v3")
    got = {m.target: (m.in_features, m.out_features) for m in adapted_linears(spec, "attention")}
    values = size_values(spec)
    sizes = {k: tuple(int(x.subs(values)) for x in v) for k, v in got.items()}
    # q_a: h -> q_lora_rank; q_b: -> 128 heads x (128 + 64); kv_a: -> 512 + 64; kv_b; o
    assert sizes == {
        "q_a": (7168, 1536),
        "q_b": (1536, 128 * 192),
        "kv_a": (7168, 576),
        "kv_b": (512, 128 * 256),
        "o": (128 * 128, 7168),
    }
    per_layer = sum(i + o for i, o in sizes.values())
    assert lora_param_count(spec, 8, "attention") == 61 * 8 * per_layer
    # gate/up/down are taken over by the experts: the dense layers and shared experts stay frozen
    modules = {m.module for m in adapted_linears(spec, "gate,up,down")}
    assert modules == {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"}


@pytest.mark.parametrize(
    ("model", "targets", "message"),
    [
        ("llama-7b", "experts", "must be one of q, k, v, o, gate, up, down, all-linear"),
        ("deepseek-v3", "k", "must be one of q_a, q_b, kv_a, kv_b, o, gate, up, down, router"),
        ("mixtral-8x7b", "up,down", "gate and up must be named together on mixtral"),
        ("mixtral-8x7b", "shared_gate", "gate, up, down, router, experts, all-linear, .* mixtral"),
        ("qwen3-30b-a3b", "gate,up,experts", "experts and gate/up/down both adapt"),
    ],
)
def test_refused_targets_name_the_allowed_ones(model: str, targets: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        adapted_linears(load_model(model), targets)
    with pytest.raises(InputError, match=message):
        Setup(load_model(model), lora_rank=8, lora_targets=lora_targets(targets))


def test_hf_names_are_accepted() -> None:
    assert lora_targets("kv_a_proj_with_mqa,q_b_proj,shared_expert_gate") == (
        "q_b",
        "kv_a",
        "shared_gate",
    )


def test_dropout_on_wrapped_parameters_is_refused() -> None:
    with pytest.raises(InputError, match="lora_dropout: must be off for adapters on router"):
        lora_activation_layer_expr(load_model("mixtral-8x7b"), "experts", dropout=True)


def test_expert_adapter_activations_are_a_merged_weight_copy() -> None:
    """peft's ParamWrapper merges W + s B A for the forward pass: each MoE layer keeps a bf16
    copy of every adapted expert weight, whatever the rank and the batch."""
    spec = load_model("mixtral-8x7b")
    layer = lora_activation_layer_expr(spec, "experts", input_bytes=2, adapter_bytes=4)
    merged = 2 * E * (2 * I_E * H + H * I_E)
    values = {**size_values(spec), r: 16, b: 1, s: 4096}
    factors = 2 * 16 * E * ((H + 2 * I_E) + (I_E + H))
    rows = 2 * 4096 * 2 * (H + I_E)  # top-2 rows into gate_up (h) and down (I_e), bf16
    assert int(layer.subs(values)) == merged + factors + rows
    assert sympy.diff(layer, b).subs(values) == rows  # the only part that grows with the batch


def _nf4_bytes(n: int) -> int:
    blocks = math.ceil(n / NF4_BLOCK)
    return math.ceil(n / 2) + blocks + 4 * math.ceil(blocks / NF4_DQ_BLOCK) + 4


def test_mixtral_nf4_storage_exact() -> None:
    spec = load_model("mixtral-8x7b")
    values = state_values(spec)
    linear = [H * H, KV * H, KV * H, H * H]  # q, k, v, o
    per_expert = [I_E * H, I_E * H, H * I_E]  # w1, w3, w2
    total = int(frozen_base_exprs(spec, None)["weights"].subs(values)) // 2  # parameters
    for experts, quantized in ((False, linear), (True, linear + per_expert * E)):
        got = {
            k: int(v.subs(values))
            for k, v in frozen_base_exprs(spec, "nf4", 2, experts=experts).items()
        }
        n = LAYERS * sum(quantized)
        codes_and_consts = LAYERS * sum(_nf4_bytes(x) for x in quantized)
        assert got["weights"] + got["quant_constants"] == 2 * (total - n) + codes_and_consts
        assert got["quant_constants"] == LAYERS * sum(_nf4_bytes(x) - x // 2 for x in quantized)
    # transformers 5 leaves the 3-D experts in bf16: over 91 GB stays unquantized
    kept = {k: int(v.subs(values)) for k, v in frozen_base_exprs(spec, "nf4").items()}
    assert kept["weights"] > 91e9
    assert int(dequant_buffer_expr(spec, 2, experts=True).subs(values)) == 2 * I_E * H
    assert int(dequant_buffer_expr(spec).subs(values)) == 2 * H * H


def test_shared_experts_and_dense_layers_are_quantized() -> None:
    """Every nn.Linear inside the layers is a bitsandbytes layer: DeepSeek-V3's dense MLPs and
    shared experts and Qwen2-MoE's shared-expert gate; routers are custom modules and stay."""
    names = {t.name for t in quantized_tensors(load_model("deepseek-v3"))}
    assert {"mlp.gate_proj.weight", "mlp.shared_experts.down_proj.weight"} <= names
    assert "self_attn.kv_a_proj_with_mqa.weight" in names
    assert not any("experts.gate_up_proj" in n or n == "mlp.gate.weight" for n in names)
    dense = load_model("llama-7b")
    assert all(t.count == L for t in quantized_tensors(dense))


# --- the training estimate --------------------------------------------------------------------


def _estimate(
    targets: str = "q,v", quant: Quant | None = None, ep: int = 1, gpus: int = 1
) -> vm.Estimate:
    spec = load_model("mixtral-8x7b")
    return vm.estimate(
        Setup(
            spec,
            recipe="bf16-pure",
            lora_rank=16,
            lora_targets=lora_targets(targets),
            quant=quant,
            seq_len=2048,
            ep=ep,
            gpus=gpus,
        )
    )


def test_mixtral_lora_estimate_adds_adapters_to_the_frozen_base() -> None:
    spec = load_model("mixtral-8x7b")
    est = _estimate("q,k,v,o")
    parts = {c.key: c.bytes for c in est.components}
    n = lora_param_count(spec, 16, "q,k,v,o")
    assert parts["weights"] == 2 * vm.param_count(spec)
    assert parts["adapter_weights"] == parts["adapter_gradients"] == 4 * n
    assert parts["adapter_optimizer"] == 8 * n
    assert "gradients" not in parts
    assert "optimizer" not in parts
    layer = lora_activation_layer_expr(spec, "q,k,v,o", input_bytes=2, adapter_bytes=4)
    values = {**size_values(spec), r: 16, b: 1, s: 2048}
    assert parts["adapter_activations"] == int((L * layer).subs(values))
    full = vm.estimate(Setup(spec, recipe="bf16-pure", seq_len=2048))
    assert parts["activations"] == {c.key: c.bytes for c in full.components}["activations"]
    assert est.gpu_bytes < full.gpu_bytes


def test_mixtral_qlora_estimate_keeps_the_experts_in_bf16() -> None:
    spec = load_model("mixtral-8x7b")
    est = _estimate(quant="nf4")
    parts = {c.key: c.bytes for c in est.components}
    exprs = frozen_base_exprs(spec, "nf4", 2)
    values = state_values(spec)
    assert parts["weights"] == int(exprs["weights"].subs(values))
    assert parts["quant_constants"] == int(exprs["quant_constants"].subs(values))
    assert parts["weights"] > 0.97 * 2 * vm.param_count(spec)  # the experts are most of it
    assert any("stay in 16 bits" in w for w in setup_warnings(est.setup))


def test_lora_estimate_under_expert_parallelism_splits_the_frozen_experts() -> None:
    spec = load_model("mixtral-8x7b")
    est = _estimate("q,k,v,o", ep=8, gpus=8)
    weights = {c.key: c.bytes for c in est.components}["weights"]
    experts = param_summary(spec)["routed_experts"]
    assert weights == 2 * (vm.param_count(spec) - experts) + 2 * experts // 8


@pytest.mark.parametrize("targets", ["all-linear", "router", "experts", "gate,up,down"])
def test_wrapped_targets_are_refused_by_the_estimate(targets: str) -> None:
    with pytest.raises(InputError, match="estimated: q, k, v, o, attention"):
        _estimate(targets)
