"""Korthikanti-style MoE activations (capacity factor, imbalance), MLA's term, MoE layouts."""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction
from typing import Any

import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from vrammath.answers.moe_layouts import (
    DEEPSEEK_V3_LAYOUT,
    deepseek_v3_training_memory,
    ep_state_bytes,
    ep_state_exprs,
    layout_memory,
)
from vrammath.model.params import param_count, rank_param_count
from vrammath.model.presets import load_model
from vrammath.notation.errors import InputError
from vrammath.notation.symbols import (
    E,
    I,
    I_e,
    N_d,
    P,
    P_e,
    a,
    b,
    c_f,
    d_n,
    d_r,
    d_v,
    f_imb,
    h,
    k_e,
    n_ep,
    p,
    r_kv,
    s,
    t,
)
from vrammath.terms.activations.parts import Parallel, Recompute
from vrammath.terms.korthikanti.dense import korthikanti_layer_terms
from vrammath.terms.korthikanti.latent import mla_attention_terms
from vrammath.terms.korthikanti.layout import (
    BF16_FLASH,
    DEEPSEEK_V3_POLICY,
    layer_counts,
    layout_activation_bytes,
    moe_layer_exprs,
)
from vrammath.terms.korthikanti.moe import (
    check_capacity,
    dense_mlp_terms,
    expert_capacity,
    expert_rows,
    moe_mlp_terms,
)
from vrammath.terms.moe.layout import (
    Layout,
    check_layout,
    layout_state_bytes,
    layout_state_exprs,
    rank_params,
)
from vrammath.terms.moe.params import mtp_param_count


def total(terms: dict[str, sympy.Expr]) -> sympy.Expr:
    return sympy.expand(sum(terms.values(), sympy.Integer(0)))


# --- capacity factor and imbalance -----------------------------------------------------------


def test_capacity_at_e_over_k_is_the_dropless_upper_bound() -> None:
    # one expert can be sent each token once: b s rows, reached at c_f = E / k
    assert sympy.simplify(expert_capacity(E / k_e) - b * s) == 0
    # and E buffers of C rows are c_f b s k rows in all
    assert sympy.simplify(E * expert_capacity(c_f) - expert_rows(c_f)) == 0


def test_balanced_capacity_is_the_grouped_gemm_row_count() -> None:
    # c_f = 1 padded, dropless balanced, and dropping with room to spare all hold b s k rows
    assert expert_rows(1) == expert_rows() == b * s * k_e
    assert expert_rows(2, pad=False, imbalance=1.5) == sympy.Rational(3, 2) * b * s * k_e
    assert expert_rows(1, pad=False, imbalance=1.5) == b * s * k_e  # capped by capacity


def test_expert_parallelism_divides_no_expert_activation() -> None:
    terms = moe_mlp_terms("tp_sp", capacity_factor=c_f)
    assert all(n_ep not in v.free_symbols for v in terms.values())


def test_tensor_and_sequence_parallel_division() -> None:
    none = moe_mlp_terms(imbalance=f_imb)
    tp = moe_mlp_terms("tp", imbalance=f_imb)
    tp_sp = moe_mlp_terms("tp_sp", imbalance=f_imb)
    for key in none:
        assert sympy.simplify(tp_sp[key] - none[key] / t) == 0
        inner = key in ("experts", "shared")
        assert sympy.simplify(tp[key] - (none[key] / t if inner else none[key])) == 0


def test_one_expert_is_a_dense_swiglu_plus_its_dispatch_copy() -> None:
    moe = moe_mlp_terms(capacity_factor=1, shared=False, router_bytes=0, weights_in_activation=True)
    dense = dense_mlp_terms()
    diff = total(moe).subs({E: 1, k_e: 1}) - total(dense).subs(I, I_e)
    assert sympy.expand(diff) == 2 * b * s * h  # the permuted copy the first GEMM keeps


def test_published_per_row_bytes() -> None:
    terms = moe_mlp_terms(capacity_factor=c_f, dropout_mask_bytes=0, shared=False)
    rows = c_f * b * s * k_e
    assert sympy.expand(terms["experts"] - 6 * rows * I_e) == 0
    assert sympy.expand(terms["combine"] - (2 * h + 4) * rows) == 0
    assert sympy.expand(terms["router"] - 4 * b * s * E) == 0


@settings(max_examples=40, deadline=None)
@given(
    st.fractions(min_value=Fraction(1, 4), max_value=8),
    st.fractions(min_value=0, max_value=4),
    st.fractions(min_value=1, max_value=4),
    st.fractions(min_value=0, max_value=3),
    st.booleans(),
)
def test_monotone_in_capacity_and_imbalance(
    cf: Fraction, dcf: Fraction, imb: Fraction, dimb: Fraction, pad: bool
) -> None:
    values = {b: 2, s: 512, h: 1024, E: 64, k_e: 6, I_e: 256, sympy.Symbol("I_s"): 0}

    def bytes_(cap: Fraction | None, f: Fraction) -> sympy.Expr:
        r = sympy.Rational(f.numerator, f.denominator)
        c = None if cap is None else sympy.Rational(cap.numerator, cap.denominator)
        return total(moe_mlp_terms(capacity_factor=c, imbalance=r, pad=pad)).subs(values)

    assert bytes_(cf + dcf, imb) >= bytes_(cf, imb)
    assert bytes_(cf, imb + dimb) >= bytes_(cf, imb)
    assert bytes_(None, imb + dimb) >= bytes_(None, imb)
    if not pad:  # dropping never holds more than dropless
        assert bytes_(cf, imb) <= bytes_(None, imb)


@pytest.mark.parametrize(
    ("capacity", "imbalance", "field"),
    [
        (0, 1, "capacity_factor"),
        (-1.0, 1, "capacity_factor"),
        (math.nan, 1, "capacity_factor"),
        ("1", 1, "capacity_factor"),
        (True, 1, "capacity_factor"),
        (None, 0.99, "imbalance"),
        (None, math.inf, "imbalance"),
    ],
)
def test_bad_ratios_are_refused_naming_the_field(
    capacity: object, imbalance: object, field: str
) -> None:
    with pytest.raises(InputError) as err:
        check_capacity(capacity, imbalance)
    assert str(err.value).startswith(field + ": must be a number")
    assert "\n" not in str(err.value)


# --- MLA, Korthikanti-style ------------------------------------------------------------------

# MLA with no latents and per-head q/k width d, v width d (a d = h) is multi-head attention
_AS_MHA = {r_kv: 0, d_n: h / a - d_r, d_v: h / a}


@pytest.mark.parametrize("parallel", ["none", "tp", "tp_sp"])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_mla_without_latents_is_korthikanti_attention(
    parallel: Parallel, recompute: Recompute
) -> None:
    mla = mla_attention_terms(parallel, recompute, q_lora=False)
    gpt = korthikanti_layer_terms(parallel, recompute)
    assert sympy.simplify(total(mla).subs(_AS_MHA) - gpt["attention"] - gpt["input"]) == 0


def test_mla_sequence_parallel_divides_everything() -> None:
    none = total(mla_attention_terms())
    assert sympy.simplify(total(mla_attention_terms("tp_sp")) - none / t) == 0


def test_mla_recomputing_up_projections_keeps_latents_only() -> None:
    kept = mla_attention_terms("none", "selective", recompute_up_proj=True, dropout_mask_bytes=0)
    assert kept["inner"] == 2 * a * b * s * d_v
    assert (
        sympy.expand(
            kept["outer"]
            - 2 * b * s * (h + sympy.Symbol("r_q", positive=True, integer=True) + r_kv + d_r)
        )
        == 0
    )


# --- layouts -----------------------------------------------------------------------------------


def test_layout_states_reduce_to_expert_parallel_states() -> None:
    for zero in (0, 1, 2, 3):
        lay = layout_state_exprs("bf16-mixed", "adamw", zero=zero)
        ep = ep_state_exprs(load_model("mixtral-8x7b"), "bf16-mixed", "adamw", zero)
        for key in ep:
            assert sympy.simplify(lay[key].subs({p: 1, t: 1}) - ep[key]) == 0


def test_fully_sharded_state_is_whole_model_over_all_ranks() -> None:
    opt = layout_state_exprs("bf16-mixed", "adamw", zero=1, copies=2)["optimizer"]
    # N_d p t = gpus: sharded states divide by every GPU whatever ep and the schedule
    assert sympy.simplify(opt * N_d * p * t - 8 * P) == 0
    assert P_e not in opt.free_symbols


def test_rank_params_add_up_to_the_model() -> None:
    spec = load_model("deepseek-v3")
    whole = param_count(spec) + mtp_param_count(spec)
    one = rank_params(spec, Layout(1))[0]
    assert one.held == whole
    ranks = rank_params(spec, Layout(2048, pp=16, ep=64))
    experts_total = sum(r.experts for r in ranks) * 64
    assert sum(r.dense for r in ranks) + experts_total == whole
    dual = rank_params(spec, Layout(2048, pp=16, ep=64, schedule="dualpipe"))
    assert sum(r.held for r in dual) == 2 * sum(r.held for r in ranks)
    assert dual[0].stages == (0, 15)
    assert dual[15].stages == (15, 0)


@pytest.mark.parametrize(("tp", "pp", "ep"), [(1, 1, 8), (2, 1, 4), (1, 4, 8), (2, 4, 2)])
def test_busiest_rank_matches_rank_param_count(tp: int, pp: int, ep: int) -> None:
    spec = load_model("mixtral-8x7b")  # 32 layers: both split pp evenly
    ranks = rank_params(spec, Layout(64, pp=pp, tp=tp, ep=ep))
    assert math.ceil(max(r.held for r in ranks)) == rank_param_count(spec, tp=tp, pp=pp, ep=ep)


def test_layout_matches_ep_state_bytes_without_pipeline() -> None:
    spec = load_model("mixtral-8x7b")
    _, states = layout_state_bytes(spec, Layout(16, ep=8, zero=1))
    assert states == ep_state_bytes(spec, zero=1, gpus=16, ep=8)


@pytest.mark.parametrize(
    ("layout", "field"),
    [
        (Layout(2048, pp=16, ep=64, zero=2), "zero"),
        (Layout(2048, pp=15, ep=64), "gpus"),
        (Layout(2048, pp=16, ep=48), "ep"),
        (Layout(30, pp=5, ep=1, schedule="dualpipe"), "pp"),
        (Layout(2048, pp=16, ep=64, schedule="gpipe"), "schedule"),
        (Layout(2048, pp=16, tp=3, ep=1), "gpus"),
        (Layout(2048, pp=128, ep=1), "pp"),
        (Layout(0), "gpus"),
    ],
)
def test_layouts_not_modelled_are_refused_by_name(layout: Layout, field: str) -> None:
    with pytest.raises(InputError) as err:
        check_layout(load_model("deepseek-v3"), layout)
    assert str(err.value).startswith(field + ":")


def test_deepseek_v3_published_layout() -> None:
    spec = load_model("deepseek-v3")
    assert DEEPSEEK_V3_LAYOUT.dp == 128
    assert DEEPSEEK_V3_LAYOUT.dp // DEEPSEEK_V3_LAYOUT.ep == 2
    assert layer_counts(spec) == {"dense": 3, "moe": 59}
    answer = deepseek_v3_training_memory()
    assert answer.rank.stages == (0, 15)
    held = answer.rank.held
    assert answer.states["weights"] == 2 * held
    assert answer.states["gradients"] == 4 * held
    # bf16 moments (2 x 2) equal the fp32 master (4) per parameter, both sharded
    assert answer.states["master"] == answer.states["optimizer"]
    assert answer.states == {
        "weights": 10_686_455_808,
        "gradients": 21_372_911_616,
        "master": 777_120_960,
        "optimizer": 777_120_960,
    }
    # per token of a MoE layer, DeepSeek-V3's policy: router 4E, SwiGLU input (fp8) 2 k I_e,
    # shared expert 3 I_s, attention output (E5M6) 1.5 a d_v, the fp8 attention input, latents
    # and RoPE key h + r_q + r_kv + d_r, dispatch (fp8) k h, norm inputs 2 x 2h, combine weights 4k
    attention = 3 * 128 * 128 // 2 + (7168 + 1536 + 512 + 64) + 4 * 7168
    moe_token = attention + 4 * 256 + 2 * 8 * 2048 + 3 * 2048 + 8 * 7168 + 4 * 8
    dense_token = attention + 3 * 18432  # a dense SwiGLU's fp8 inputs, not recomputed
    assert (moe_token, dense_token) == (159_840, 117_824)
    # DualPipe: p + 1 micro-batches of a sixteenth of the 62 layers
    assert answer.activations["layers"] == 4096 * (3 * dense_token + 59 * moe_token) * 17 // 16
    logits = 2 * (4 * 4096 * 7168 + 4 * 4096 * 129_280)  # main and MTP heads (Korthikanti)
    assert answer.activations["head"] == logits
    assert answer.total == sum(answer.states.values()) + sum(answer.activations.values())
    # dropless at balance equals padded buffers at c_f = 1; imbalance only adds
    padded = deepseek_v3_training_memory(capacity_factor=1)
    assert padded.total == answer.total
    assert deepseek_v3_training_memory(imbalance=1.25).total > answer.total
    # DualPipe holds (p + 1) / p of 1F1B's L layers' worth
    one_f_one_b = layout_activation_bytes(
        spec, Layout(2048, pp=16, ep=64), 1, 4096, DEEPSEEK_V3_POLICY, head_on_rank=False
    )["layers"]
    assert abs(answer.activations["layers"] * 16 - one_f_one_b * 17) <= 17


def test_deepseek_v3_policy_saves_against_16_bit() -> None:
    spec = load_model("deepseek-v3")
    own = moe_layer_exprs(spec, policy=DEEPSEEK_V3_POLICY)["moe"]
    bf16 = moe_layer_exprs(spec, policy=BF16_FLASH)["moe"]
    from vrammath.model.params import size_values

    values = {**size_values(spec), k_e: 8, b: 1, s: 4096}
    assert own.subs(values) < bf16.subs(values) / 3


def test_layout_memory_activations_follow_micro_batch() -> None:
    spec = load_model("mixtral-8x7b")
    one = layout_memory(spec, Layout(64, pp=4, ep=8), micro_batch=1)
    two = layout_memory(spec, Layout(64, pp=4, ep=8), micro_batch=2)
    assert two.states == one.states
    assert two.activations["layers"] == 2 * one.activations["layers"]
    with pytest.raises(InputError, match="^micro_batch:"):
        layout_memory(spec, Layout(64, pp=4, ep=8), micro_batch=0)


@pytest.mark.parametrize("schedule", ["1f1b", "dualpipe"])
@pytest.mark.parametrize(("pp", "ep", "tp"), [(2, 8, 1), (16, 64, 1), (8, 16, 2)])
def test_sharded_states_add_up_over_every_gpu(schedule: str, pp: int, ep: int, tp: int) -> None:
    # ZeRO's shards over all GPUs hold the model once, whatever the groups and the schedule
    spec = load_model("deepseek-v3")
    layout = Layout(2048, pp=pp, tp=tp, ep=ep, schedule=schedule)
    ranks = rank_params(spec, layout)
    whole = param_count(spec) + mtp_param_count(spec)
    if tp == 1:
        assert sum(r.sharded for r in ranks) * layout.dp == whole
    else:  # replicated norms and routers are counted on every tensor-parallel rank
        assert sum(r.sharded for r in ranks) * layout.dp * tp > whole


def _deepseek_setup(**changes: object) -> Any:
    from vrammath.compose.setup import Setup

    kw: dict[str, Any] = {
        "recipe": "deepseek-v3-fp8",
        "zero": 1,
        "gpus": 128,
        "pp": 16,
        "ep": 64,
        "schedule": "dualpipe",
        "seq_len": 4096,
        "activation_model": "korthikanti",
    }
    return Setup(load_model("deepseek-v3"), **(kw | changes))


def test_wrapper_is_estimate_of_its_setup() -> None:
    from vrammath.compose.estimate import estimate

    answer = deepseek_v3_training_memory()
    est = estimate(_deepseek_setup())
    assert answer.total == est.gpu_bytes == est.phases["forward_peak"] == 80_664_844_672
    for key, value in answer.states.items():
        assert est.component(key).bytes == value
    assert answer.activations == {
        "layers": est.component("activations").bytes,
        "head": est.component("logits_loss").bytes,
    }
    # the states equal moe_layout's exact count of the busiest rank
    spec = load_model("deepseek-v3")
    _, states = layout_state_bytes(spec, DEEPSEEK_V3_LAYOUT, "deepseek-v3-fp8")
    assert states == answer.states
    # the activations equal moe_layout's composition of moe_capacity's and MLA's terms
    acts = layout_activation_bytes(spec, DEEPSEEK_V3_LAYOUT, 1, 4096, DEEPSEEK_V3_POLICY)
    assert acts == answer.activations


def test_default_fields_are_the_explicit_identities() -> None:
    from vrammath.compose.estimate import estimate

    base = estimate(_deepseek_setup())
    explicit = estimate(_deepseek_setup(imbalance=1.0, activation_policy="deepseek-v3"))
    assert base.phases == explicit.phases
    # dropless at balance == padded buffers at c_f = 1, symbolically (rows b s k either way)
    padded = estimate(_deepseek_setup(capacity_factor=1))
    acts = base.component("activations").expr
    assert sympy.simplify(acts - padded.component("activations").expr) == 0
    # imbalance and a padded capacity factor scale the same routed rows
    assert (
        estimate(_deepseek_setup(imbalance=1.25)).phases
        == estimate(_deepseek_setup(capacity_factor=1.25)).phases
    )
    # the gradients stay resident beside the activations (Megatron's gradient buffer)
    states = sum(
        base.component(k).bytes or 0 for k in ("weights", "gradients", "master", "optimizer")
    )
    assert base.gpu_bytes == states + base.activation_bytes


def test_one_f_one_b_and_other_policies_through_estimate() -> None:
    spec = load_model("mixtral-8x7b")
    mem = layout_memory(spec, Layout(64, pp=4, ep=8))
    assert mem.estimate.setup.gpus == 16
    assert mem.estimate.setup.policy == "bf16-flash"
    assert mem.total == mem.estimate.gpu_bytes
    kept = deepseek_v3_training_memory(policy="deepseek-v3-outputs-kept")
    # the experts' outputs kept: 2 B s b k h more per MoE layer (59 of them, 17/16 in flight)
    extra = 2 * 4096 * 8 * 7168 * 59 * 17 // 16
    assert kept.total - deepseek_v3_training_memory().total == extra
    with pytest.raises(InputError, match="^policy: must be one of the named policies"):
        layout_memory(spec, Layout(64, pp=4, ep=8), policy=replace(BF16_FLASH, router_bytes=2))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tp": 2, "gpus": 64}, "tp: tensor parallelism"),
        ({"recompute": "full"}, "recompute: full"),
        ({"schedule": "interleaved", "chunks": 2}, "schedule: must be one of 1f1b, dualpipe"),
        ({"optimizer": "adam8bit"}, "optimizer: must be one of adamw, adam, sgd, sgd-momentum"),
        ({"imbalance": 0.9}, "imbalance: must be a number from 1 to 1024 (got 0.9)"),
        (
            {"capacity_factor": 0},
            "capacity_factor: must be a number above 0 and at most 1024 (got 0)",
        ),
        ({"activation_policy": "fp4"}, "activation_policy: must be one of auto, bf16-flash"),
    ],
)
def test_moe_korthikanti_refusals_name_the_field(changes: dict[str, object], message: str) -> None:
    from vrammath.compose.estimate import estimate

    with pytest.raises(InputError) as err:
        estimate(_deepseek_setup(**changes))
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_n_d_is_the_data_parallel_gpus_under_dualpipe() -> None:
    # solvers substitute N_d: it must mean Setup.gpus, the 2 N_d ranks of a stage in the rows
    from vrammath.compose.estimate import _value, estimate
    from vrammath.notation.symbols import N_d

    est = estimate(_deepseek_setup())
    assert est.values[N_d] == 128
    assert est.component("optimizer").expr == 2 * P / N_d  # 4 P / (2 N_d): bf16 moments
    at_64 = _value(est.gpu_expr(), {**est.values, N_d: 64})
    assert at_64 == estimate(_deepseek_setup(gpus=64)).gpu_bytes
