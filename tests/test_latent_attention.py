"""DeepSeek-V3's latent attention: kept activations by tensor, composition, refusals.

The measured side is tests/measure/test_latent_attention.py (whole models, byte-exact).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sympy

from vrammath.measure.matrix_rows import SMALL_DEEPSEEK_V3
from vrammath.model.params import size_values
from vrammath.model.presets import load_model
from vrammath.model.readers import from_hf_config
from vrammath.notation.errors import InputError
from vrammath.notation.symbols import L, L_e, a, b, d, d_r, d_v, k_e, s
from vrammath.terms.activations.latent import mla_attention_terms, mla_layer_terms, mla_rope_bytes
from vrammath.terms.activations.layer import hf_layer_terms
from vrammath.terms.activations.model import hf_activation_bytes, hf_activation_terms
from vrammath.terms.moe.params import moe_mlp_kept_exprs

DS = json.loads(
    (Path(__file__).resolve().parent.parent / "conf/models/deepseek-v3.json").read_text()
)
SPEC = load_model("deepseek-v3")
VALUES = {**size_values(SPEC), k_e: 8, b: 2, s: 4096}


def _bytes(expr: sympy.Expr) -> int:
    return int(expr.subs(VALUES))


def _tensors(*shapes: tuple[int, ...], width: int = 2) -> int:
    total = 0
    for shape in shapes:
        n = width
        for dim in shape:
            n *= dim
        total += n
    return total


def test_eager_keeps_these_tensors() -> None:
    """DeepSeek-V3, b = 2, s = 4096: the tensors eager attention keeps, one by one."""
    n, heads, seq = 2 * 4096, 128, 4096
    q_norm = _tensors((n, 1536), width=4) + _tensors((n,), width=4) + _tensors((n, 1536), (n, 1536))
    kv_norm = _tensors((n, 512), width=4) + _tensors((n,), width=4) + _tensors((n, 512), (n, 512))
    qk = _tensors((n, heads, 192), (n, heads, 192))
    v_copy = _tensors((n, heads, 128))
    probs = _tensors((heads, n, seq), width=4) + _tensors((heads, n, seq))
    o_input = _tensors((n, heads * 128))
    terms = mla_attention_terms(SPEC, "eager")
    assert _bytes(terms["q_latent"]) == q_norm
    assert _bytes(terms["kv_latent"]) == kv_norm
    assert _bytes(terms["qkv"]) == qk + v_copy
    assert _bytes(terms["scores"]) == probs
    assert _bytes(terms["output"]) == o_input


def test_sdpa_kernels_by_device_and_head_dims() -> None:
    n = b * s
    cpu = mla_attention_terms(SPEC, "sdpa", device="cpu")  # the math kernel, fp32
    cuda = mla_attention_terms(SPEC, "sdpa", device="cuda")  # memory-efficient
    assert _bytes(cpu["qkv"]) == _tensors((8192, 128, 192 + 192 + 128), width=4)
    assert _bytes(cpu["scores"]) == _tensors((128, 8192, 4096), width=4)
    assert _bytes(cuda["qkv"]) == _tensors((8192, 128, 192 + 192 + 128 + 128))
    assert _bytes(cuda["scores"]) == _tensors((2, 128, 4096), width=4)  # 4096 is a multiple of 32
    assert cuda["scores"].subs({b: 1, a: 1, s: 33}) == 4 * 64  # padded to 32 rows
    # v_head_dim = qk_head_dim: the flash kernel on both devices, o_proj's own copy of its output
    equal = from_hf_config({**DS, "v_head_dim": 192})
    flash = mla_attention_terms(equal, "sdpa", device="cpu")
    assert flash == mla_attention_terms(equal, "sdpa", device="cuda")
    assert flash["scores"] == 4 * a * n
    assert flash["output"] == 2 * 2 * n * a * d_v
    # no q_lora_rank: q_proj reads the layer's input, no low-rank path to keep
    assert mla_attention_terms(from_hf_config({**DS, "q_lora_rank": None}))["q_latent"] == 0


def test_eager_at_batch_one_keeps_all_of_kv_b_proj_output() -> None:
    terms = mla_attention_terms(SPEC, "eager")
    one = terms["qkv"].subs({**VALUES, b: 1})
    assert one == _tensors((4096, 128, 192 + 192 + 128 + 128))


def test_whole_model_composes_dense_and_moe_layers() -> None:
    dense = mla_layer_terms(SPEC, "sdpa", "bf16")
    assert sorted(dense) == sorted(
        ["inputs", "kv_latent", "mlp", "norms", "output", "q_latent", "qkv", "scores"]
    )
    llama = hf_layer_terms(SPEC, "sdpa", "bf16")
    assert all(dense[k] == llama[k] for k in ("inputs", "mlp", "norms"))
    moe = moe_mlp_kept_exprs(SPEC)
    dense_sum = sum(dense.values(), sympy.Integer(0))
    moe_layer = dense_sum - dense["mlp"] + moe["router"] + moe["experts"] + moe["shared"]
    terms = hf_activation_terms(SPEC, "sdpa", "bf16")
    assert sympy.expand(terms["layers"] - ((L - L_e) * dense_sum + L_e * moe_layer)) == 0
    # RoPE's tables are qk_rope_head_dim wide (DeepseekV3Config's head_dim), not d = d_n + d_r
    assert terms["rope"] == mla_rope_bytes(SPEC) == 4 * s * d_r
    assert d not in terms["rope"].free_symbols
    total = hf_activation_bytes(SPEC, "sdpa", "bf16")
    assert sympy.expand(total - sum(terms.values(), sympy.Integer(0))) == 0
    # 5.61 GiB (2^30 bytes) per MoE layer at b = 2, s = 4096, most of it the routed rows
    assert round(_bytes(moe_layer) / 2**30, 2) == 5.61


@pytest.mark.parametrize("precision", ["fp32", "fp16", "autocast-bf16"])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_only_bf16_is_derived(precision: Any, recompute: Any) -> None:
    with pytest.raises(InputError, match=r"^precision: .* bf16 only") as info:
        hf_activation_bytes(SPEC, "sdpa", precision, recompute)
    assert "\n" not in str(info.value)


def test_a_model_without_latent_attention_is_refused() -> None:
    with pytest.raises(InputError, match=r"^model: has no latent attention \(got 'llama-7b'\)"):
        mla_attention_terms(load_model("llama-7b"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"qk_head_dim": 128},
            "qk_head_dim: must equal qk_nope_head_dim + qk_rope_head_dim = 192 (DeepseekV3Config "
            "sets it so) (got 128)",
        ),
        (
            {"head_dim": 192},
            "head_dim: must equal qk_rope_head_dim = 64 (DeepseekV3Config sets it so) (got 192)",
        ),
        ({"kv_lora_rank": 0}, "kv_lora_rank: must be a positive integer (got 0)"),
        ({"q_lora_rank": -1}, "q_lora_rank: must be a positive integer (got -1)"),
        ({"qk_nope_head_dim": 0}, "qk_nope_head_dim: must be a positive integer (got 0)"),
        ({"v_head_dim": None}, "v_head_dim: is required in the config and missing"),
        (
            {"n_routed_experts": 8, "num_experts_per_tok": 2, "topk_group": 4},
            "n_group: must leave at least 2 of n_routed_experts=8 per group (transformers scores "
            "a group by its top two) (got 8)",
        ),
        ({"topk_method": "group_limited_greedy"}, "topk_method: must be one of noaux_tc"),
        ({"scoring_func": "softmax"}, "scoring_func: must be one of sigmoid"),
        (
            {"num_key_value_heads": None, "num_attention_heads": 64},
            "num_key_value_heads: must equal num_attention_heads=64 (latent attention expands "
            "K/V per head) (got 128)",
        ),
    ],
)
def test_bad_latent_configs(change: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError) as info:
        from_hf_config({**DS, **change})
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_consistent_derived_keys_are_accepted() -> None:
    spec = from_hf_config({**DS, "qk_head_dim": 192, "head_dim": 64, "rope_interleave": False})
    assert spec.head_dim == 192
    assert not spec.warnings
    # hidden_size need not be a multiple of the heads (the head dimension is nope + rope)
    odd = from_hf_config({**DS, "hidden_size": 7000})
    assert odd.head_dim == 192


# --- training estimates (vrammath.estimate with vrammath.terms.moe.deepseek) -------------------

SMALL = SMALL_DEEPSEEK_V3  # the matrix rows' config: one small DeepSeek-V3 for both


def test_fp32_routers_in_the_model_states() -> None:
    """transformers keeps DeepSeek-V3's router weights in fp32 in a bf16 model: their weights,
    gradients and Adam states are 4 bytes each (PyTorch counts 1,159,920 B of parameters and
    of gradients for this config; the optimizer's 2,320,020 B add 180 B of step counters)."""
    from vrammath.model.params import fp32_param_expr, param_count
    from vrammath.terms.states import model_state_bytes

    spec = from_hf_config(SMALL)
    routers = 8 * 96 * 2  # E h, in the two MoE layers
    assert int(fp32_param_expr(spec).subs(size_values(spec))) == routers
    states = model_state_bytes(spec, "bf16-pure", "adamw")
    total = param_count(spec)
    assert states["weights"] == states["gradients"] == 2 * total + 2 * routers == 1_159_920
    assert states["optimizer"] == 4 * total + 4 * routers == 2_320_020 - 180


def test_deepseek_v3_training_estimate_composes() -> None:
    from vrammath.compose.estimate import estimate
    from vrammath.compose.setup import Setup

    setup = Setup(SPEC, recipe="bf16-pure", micro_batch=1, seq_len=4096, gpus=256, ep=64, zero=1)
    est = estimate(setup)
    values = {**size_values(SPEC), k_e: 8, b: 1, s: 4096}
    kept = int(hf_activation_bytes(SPEC, "sdpa", "bf16").subs(values))
    assert est.component("activations").bytes + est.component("logits_loss").bytes == kept
    assert est.gpu_bytes == max(est.phases.values())
    # 235.09 GiB (2^30 B) per GPU at its backward peak: HF keeps 168 GiB of activations
    assert round(est.gpu_bytes / 2**30, 2) == 235.09


def test_cpu_math_kernel_peaks_are_refused_in_one_line() -> None:
    from vrammath.compose.estimate import estimate
    from vrammath.compose.setup import Setup

    spec = from_hf_config({**SMALL, "v_head_dim": 16})  # qk_head_dim 24: the math kernel
    with pytest.raises(InputError, match=r"^device: cpu: with v_head_dim != qk_head_dim") as info:
        estimate(Setup(spec, recipe="bf16-pure", device="cpu"))
    assert "\n" not in str(info.value)
    assert estimate(Setup(from_hf_config(SMALL), recipe="bf16-pure", device="cpu")).gpu_bytes > 0
