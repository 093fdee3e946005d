"""Activation formulas: Korthikanti et al. (2022) as published, and the implementation-exact ones."""

from __future__ import annotations

from typing import Literal

import pytest
import sympy

from vrammath.notation.errors import InputError
from vrammath.notation.symbols import L, V, a, b, h, m, p, s, t
from vrammath.terms.activations import gpt as gpt_blocks
from vrammath.terms.activations import layer as layer_terms
from vrammath.terms.activations import model as act
from vrammath.terms.korthikanti import dense as korthikanti

# The paper's Table 3 models (s = 2048, v = 51200, t = 8).
TABLE3 = {
    "22B": {a: 64, h: 6144, L: 48, p: 1},
    "175B": {a: 96, h: 12288, L: 96, p: 8},
    "530B": {a: 128, h: 20480, L: 105, p: 35},
    "1T": {a: 160, h: 25600, L: 128, p: 64},
}
PAPER_RUN = {s: 2048, V: 51200, t: 8, b: 1}


def _zero(expr: sympy.Expr) -> bool:
    return sympy.simplify(expr) == 0


def test_terms_are_the_published_breakdown() -> None:
    terms = korthikanti.korthikanti_layer_terms()
    assert _zero(terms["attention"] - (11 * s * b * h + 5 * a * s**2 * b))
    assert _zero(terms["mlp"] - 19 * s * b * h)
    assert _zero(terms["norms"] - 4 * s * b * h)
    assert _zero(sum(terms.values()) - s * b * h * (34 + 5 * a * s / h))


@pytest.mark.parametrize(
    ("parallel", "recompute", "published"),
    [
        ("none", "none", s * b * h * (34 + 5 * a * s / h)),
        ("tp", "none", s * b * h * (10 + 24 / t + 5 * a * s / (h * t))),
        ("tp_sp", "none", s * b * h / t * (34 + 5 * a * s / h)),
        ("tp", "selective", s * b * h * (10 + 24 / t)),
        ("tp_sp", "selective", 34 * s * b * h / t),
        ("none", "selective", 34 * s * b * h),
        ("none", "full", 2 * s * b * h),
        ("tp", "full", 2 * s * b * h),
    ],
)
def test_layer_totals_match_table_2(parallel: str, recompute: str, published: sympy.Expr) -> None:
    assert _zero(korthikanti.korthikanti_layer_bytes(parallel, recompute) - published)  # type: ignore[arg-type]


def test_tp_with_t_one_is_no_parallelism() -> None:
    for parallel in ("tp", "tp_sp"):
        e = korthikanti.korthikanti_layer_bytes(parallel).subs(t, 1)  # type: ignore[arg-type]
        assert _zero(e - korthikanti.korthikanti_layer_bytes())


def test_assumptions_are_visible_options() -> None:
    fp32 = korthikanti.korthikanti_layer_bytes(activation_bytes=4, dropout_mask_bytes=1)
    assert _zero(fp32 - (s * b * h * (4 * 16 + 2) + 9 * a * s**2 * b))
    no_masks = korthikanti.korthikanti_layer_bytes(dropout_mask_bytes=0)
    assert _zero(no_masks - (32 * s * b * h + 4 * a * s**2 * b))
    wide = korthikanti.korthikanti_layer_bytes(ffn_multiple=8)
    assert _zero(wide - korthikanti.korthikanti_layer_bytes() - 16 * s * b * h)


@pytest.mark.parametrize(("model", "saving"), [("175B", 0.70), ("530B", 0.65)])
def test_selective_recompute_savings_of_table_3(model: str, saving: float) -> None:
    values = {**PAPER_RUN, **TABLE3[model]}
    full = korthikanti.korthikanti_layer_bytes("tp_sp").subs(values)
    sel = korthikanti.korthikanti_layer_bytes("tp_sp", "selective").subs(values)
    assert round(float(1 - sel / full), 2) == saving


def test_first_stage_is_L_layers_plus_extras() -> None:
    e = korthikanti.korthikanti_first_stage_bytes("tp_sp", last_stage_on_first=True)
    layer = korthikanti.korthikanti_layer_bytes("tp_sp")
    # Equation 5 of the paper at p = 1: + sbh/t (embedding dropout) + 4sbh/t (1 + v/h)
    assert _zero(e - (L * layer + s * b * h / t + 4 * s * b * h / t * (1 + V / h)))
    e = korthikanti.korthikanti_first_stage_bytes("tp_sp", schedule="interleaved")
    assert _zero(e - (L * layer * (1 + (p - 1) / (p * m)) + s * b * h * p / t))


def test_interleaving_factor_limits() -> None:
    f = korthikanti.korthikanti_interleave_factor("interleaved")
    assert f.subs({p: 1, m: 4}) == 1
    assert sympy.limit(f.subs(p, 8), m, sympy.oo) == 1


def test_megatron_number_for_a_llama_7b_sized_layer() -> None:
    # REFERENCES.md: Megatron's formula gives 108 MiB (16-bit) for LLaMA-7B's layer at b=1, s=512.
    e = korthikanti.korthikanti_layer_bytes().subs({s: 512, b: 1, h: 4096, a: 32})
    assert e == 108 * 2**20


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"parallel": "pp"}, "parallel"),
        ({"recompute": "some"}, "recompute"),
    ],
)
def test_unknown_options_raise(kwargs: dict[str, str], field: str) -> None:
    with pytest.raises(InputError, match=field):
        korthikanti.korthikanti_layer_bytes(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="schedule"):
        korthikanti.korthikanti_interleave_factor("gpipe")  # type: ignore[arg-type]


# --- implementation-exact formulas (values measured with vrammath.measure; see tests/measure) ---

from vrammath.model.params import size_values  # noqa: E402
from vrammath.model.presets import load_model  # noqa: E402
from vrammath.model.readers import from_hf_config  # noqa: E402

MiB = 2**20


@pytest.mark.parametrize(
    ("precision", "attention", "mib"),
    [
        ("bf16", "eager", 139.00),
        ("bf16", "sdpa", 91.07),
        ("fp32", "eager", 198.00),
        ("fp32", "sdpa", 166.07),
    ],
)
def test_llama_7b_layer_matches_reference_measurements(
    precision: str, attention: str, mib: float
) -> None:
    spec = load_model("llama-7b")
    e = layer_terms.hf_layer_bytes(spec, attention, precision)  # type: ignore[arg-type]
    assert round(float(e.subs({**size_values(spec), b: 1, s: 512})) / MiB, 2) == mib


def test_sdpa_keeps_a_log_sum_exp_not_scores() -> None:
    spec = load_model("llama-7b")
    eager = layer_terms.hf_layer_terms(spec, "eager", "bf16")["scores"]
    sdpa = layer_terms.hf_layer_terms(spec, "sdpa", "bf16")["scores"]
    assert _zero(eager - 6 * a * s**2 * b)
    assert _zero(sdpa - 4 * a * s * b)


def test_gqa_and_explicit_head_dim_enter_the_layer() -> None:
    from vrammath.notation.symbols import a_kv, d

    spec = from_hf_config(
        {
            "model_type": "llama",
            "hidden_size": 96,
            "intermediate_size": 200,
            "num_hidden_layers": 3,
            "num_attention_heads": 6,
            "num_key_value_heads": 2,
            "head_dim": 24,
            "vocab_size": 1000,
        }
    )
    qkv = layer_terms.hf_layer_terms(spec, "sdpa", "bf16")["qkv"]
    assert _zero(qkv - 2 * s * b * d * (a + 2 * a_kv))
    # eager repeats K and V to a heads
    assert _zero(layer_terms.hf_layer_terms(spec, "eager", "bf16")["qkv"] - 6 * s * b * d * a)


def test_autocast_keeps_weight_casts_and_fp32_norm_inputs() -> None:
    spec = load_model("llama-7b")
    terms = layer_terms.hf_layer_terms(spec, "sdpa", "autocast-bf16")
    vals = size_values(spec)
    layer_params = 4 * 4096 * 4096 + 3 * 4096 * 11008
    assert terms["weight_casts"].subs(vals) == 2 * layer_params
    assert act.hf_activation_terms(spec, "sdpa", "autocast-bf16")["head_weight_cast"].subs(
        vals
    ) == (2 * 32000 * 4096)


def test_logits_dominate_at_qwen2_vocabulary() -> None:
    spec = load_model("qwen2-72b")
    vals = {**size_values(spec), b: 1, s: 4096}
    terms = act.hf_activation_terms(spec, "sdpa", "bf16", "full")
    assert terms["logits_loss"].subs(vals) > terms["layers"].subs(vals) / 5


def test_full_recompute_keeps_layer_inputs() -> None:
    from vrammath.notation.symbols import h as hh

    spec = load_model("llama-7b")
    layers = act.hf_activation_terms(spec, "sdpa", "bf16", "full")["layers"]
    assert _zero(layers - (L * 2 * s * b * hh + 8 * s))


def test_gpt2_with_fused_gelu_is_korthikanti_plus_norm_statistics() -> None:
    from vrammath.notation.symbols import I as II

    spec = load_model("gpt2")
    layer = layer_terms.hf_layer_bytes(spec, "eager", "bf16", gelu="gelu_pytorch_tanh")
    assert _zero(layer.subs(II, 4 * h) - korthikanti.korthikanti_layer_bytes() - 16 * s * b)
    composite = layer_terms.hf_layer_bytes(spec, "eager", "bf16", gelu="gelu_new")
    assert _zero(composite - layer - 3 * 2 * s * b * II)


def test_hf_unknown_options_raise() -> None:
    spec = load_model("llama-7b")
    with pytest.raises(InputError, match="attention"):
        layer_terms.hf_layer_bytes(spec, "flash", "bf16")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="precision"):
        layer_terms.hf_layer_bytes(spec, "sdpa", "int8")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="recompute"):
        act.hf_activation_bytes(spec, recompute="selective")  # type: ignore[arg-type]


def test_gelu_comes_from_the_spec_unless_passed() -> None:
    base = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100}
    tanh = from_hf_config({**base, "activation_function": "gelu_pytorch_tanh"})
    new = from_hf_config(base)
    assert _zero(
        layer_terms.hf_layer_bytes(tanh, "eager", "bf16")
        - layer_terms.hf_layer_bytes(new, "eager", "bf16", gelu="gelu_pytorch_tanh")
    )
    assert not _zero(
        layer_terms.hf_layer_bytes(tanh, "eager", "bf16")
        - layer_terms.hf_layer_bytes(new, "eager", "bf16")
    )
    # an explicit gelu= still wins (the measurement passes the config's own)
    assert _zero(
        act.hf_activation_bytes(tanh, "eager", "bf16", gelu="gelu_new")
        - act.hf_activation_bytes(new, "eager", "bf16")
    )


def test_gpt2_formula_without_attention_dropout() -> None:
    from dataclasses import replace

    spec = load_model("gpt2")
    off = replace(spec, attention=replace(spec.attention, dropout=0.0))
    on_scores = gpt_blocks.gpt2_layer_terms(spec)["scores"]
    assert gpt_blocks.gpt2_layer_terms(off)["scores"] == 2 * a * s**2 * b
    assert on_scores == 5 * a * s**2 * b  # + bool mask + dropped 16-bit copy (CUDA)


def test_final_norm_is_one_layer_norm() -> None:
    precisions: tuple[Literal["bf16"], Literal["fp32"]] = ("bf16", "fp32")
    for name in ("llama-7b", "gpt2"):
        spec = load_model(name)
        for precision in precisions:
            layer = layer_terms.hf_layer_terms(spec, "eager", precision)["norms"]
            final = act.hf_activation_terms(spec, "eager", precision)["final_norm"]
            assert _zero(layer - 2 * final)


def test_every_gelu_the_readers_accept_has_its_kept_count() -> None:
    # the readers accept vocab.GELU_VARIANTS; the formulas index GELU_KEPT with them
    from vrammath.notation.vocab import GELU_VARIANTS

    assert tuple(gpt_blocks.GELU_KEPT) == GELU_VARIANTS
