"""``vrammath derive`` against the analytic formulas: coefficient for coefficient in b, s and L.

Marked ``measure`` (torch and transformers; run by ``nox -s measure``). The configs are tiny and
odd-sized so that a wrong coefficient cannot hide behind a round number: GQA with an explicit
head_dim, attention biases, a sliding window below every fitted s, tied embeddings with one KV
head, GPT-2 with dropout on. The mixture-of-experts types run on the validation matrix's small
configs (bf16 only: fake mode's grouped matmul takes bf16 inputs).
"""

from __future__ import annotations

from typing import Any

import pytest
import sympy

pytest.importorskip("torch")
pytest.importorskip("transformers")

from vrammath.cli import main
from vrammath.compose.estimate import estimate
from vrammath.compose.setup import Setup
from vrammath.measure.build import RECIPE_OF, as_spec
from vrammath.measure.derive import coefficients, derive, grid, solve_exact
from vrammath.measure.matrix import step_counter_bytes
from vrammath.measure.matrix_rows import CONFIGS as MATRIX_CONFIGS
from vrammath.model.params import param_count, size_values
from vrammath.notation.errors import InputError
from vrammath.notation.symbols import L, L_e, P, b, s
from vrammath.terms.activations.model import hf_activation_bytes
from vrammath.terms.activations.parts import HfRecompute

pytestmark = [
    pytest.mark.measure,
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {
        "model_type": "llama",
        "hidden_size": 40,
        "intermediate_size": 72,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 12,
        "vocab_size": 97,
        "attention_bias": True,
    },
    "mistral": {
        "model_type": "mistral",
        "hidden_size": 48,
        "intermediate_size": 88,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "num_key_value_heads": 3,
        "head_dim": 10,
        "vocab_size": 131,
        "sliding_window": 4096,
    },
    "mistral-window": {
        "model_type": "mistral",
        "hidden_size": 48,
        "intermediate_size": 88,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "num_key_value_heads": 3,
        "head_dim": 10,
        "vocab_size": 131,
        "sliding_window": 24,  # below every fitted s (32, 64, 96): the window is in force
    },
    "qwen2": {
        "model_type": "qwen2",
        "hidden_size": 40,
        "intermediate_size": 56,
        "num_hidden_layers": 2,
        "num_attention_heads": 5,
        "num_key_value_heads": 1,
        "vocab_size": 113,
        "tie_word_embeddings": True,
    },
    "gpt2": {
        "model_type": "gpt2",
        "n_embd": 48,
        "n_layer": 2,
        "n_head": 4,
        "n_inner": 100,
        "vocab_size": 89,
        "n_positions": 256,
        "resid_pdrop": 0.1,
        "embd_pdrop": 0.1,
        "attn_pdrop": 0.1,
    },
}
SEQ = 64  # the fit runs at s = 32, 64, 96


def _sizes(spec: Any) -> dict[sympy.Symbol, Any]:
    """The config's sizes, L left a symbol (derive fits in L too)."""
    return {k: v for k, v in size_values(spec).items() if k != L}


def _piece(expr: sympy.Expr) -> sympy.Expr:
    """The polynomial piece derive fits: b >= 2 (the Kronecker delta at b = 1 off) and s near
    SEQ (a sliding window's Piecewise in s taken at SEQ; every fit point is on its side)."""
    expr = expr.subs(sympy.KroneckerDelta(1, b), 0)
    return expr.replace(  # type: ignore[no-any-return]
        lambda e: isinstance(e, sympy.Piecewise), lambda e: e.subs(s, SEQ)
    )


def _in_bs_l(expr: sympy.Expr) -> dict[tuple[int, ...], sympy.Expr]:
    return sympy.Poly(sympy.expand(expr), b, s, L).as_dict()  # type: ignore[no-any-return]


def test_solve_exact_recovers_rational_coefficients() -> None:
    seqs, _, _ = grid(SEQ)
    pts = [(bb, ss) for bb in (2, 3) for ss in seqs]
    want = sympy.Rational(7, 3) * b * s**2 - 5 * s + 11
    got = solve_exact(pts, [int(3 * want.subs({b: bb, s: ss})) for bb, ss in pts])
    assert sympy.expand(got - 3 * want) == 0
    assert coefficients(got)["b*s**2"] == "7"


def test_derive_refuses_bad_input() -> None:
    with pytest.raises(InputError, match="precision: must be one of bf16, fp32"):
        derive(CONFIGS["llama"], precision="fp16")
    with pytest.raises(InputError, match="model_type: transformers .* cannot build"):
        derive({"model_type": "no-such-model", "hidden_size": 8})


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_activations_equal_derived_polynomial(
    arch: str, precision: str, attention: str, recompute: str
) -> None:
    """hf_activation_bytes (device cpu) equals derive's polynomial in b, s and L, per coefficient."""
    cfg = CONFIGS[arch]
    spec = as_spec(cfg)
    found = derive(
        cfg,
        precision=precision,
        attention=attention,
        recompute=recompute,
        batch=2,
        seq=SEQ,
        steps=1,
        verify=False,
    )
    assert found.layer_mode.startswith("fit in L")
    analytic = hf_activation_bytes(
        spec,
        attention,  # type: ignore[arg-type]
        precision,  # type: ignore[arg-type]
        recompute,  # type: ignore[arg-type]
        device="cpu",
    ).subs(_sizes(spec))
    assert _in_bs_l(found.in_layers["activations"]) == _in_bs_l(_piece(analytic))


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_steady_step_peak_and_checks(arch: str) -> None:
    """bf16 sdpa (GPT-2: eager): the fit holds at the check points, b = 1 adds the analytic Kronecker delta to
    the activations, and the step peak is the estimate's plus what it leaves out on a CPU (Adam's
    step counters and the model's buffers)."""
    cfg = CONFIGS[arch]
    spec = as_spec(cfg)
    attention = "eager" if arch == "gpt2" else "sdpa"  # GPT-2's eager block, dropout on
    found = derive(cfg, precision="bf16", attention=attention, batch=2, seq=SEQ)
    assert [m for m in found.misses if m.startswith("activations")] == []
    analytic = hf_activation_bytes(spec, attention, "bf16", device="cpu").subs(size_values(spec))
    delta = analytic.coeff(sympy.KroneckerDelta(1, b))
    assert set(found.batch_one.get("activations", {0: 0}).values()) == {delta}
    setup = Setup(
        spec,
        recipe=RECIPE_OF["bf16"],
        attention=attention,
        device="cpu",
        micro_batch=2,
        seq_len=SEQ,
    )
    step = estimate(setup).phase_exprs["step_peak"].subs({P: param_count(spec)})
    extra = found.exprs["step"] - step - step_counter_bytes(spec, "adamw")
    if spec.embeddings.learned_positions:
        # GPT-2 leaves one int64 (b, s) activation alive after backward, until the next forward
        # replaces it (measured in every phase end of a steady iteration); not in the estimate
        assert extra == 8 * b * s
    else:  # RoPE's inv_freq and original_inv_freq buffers, fp32, not in the estimate
        assert extra == 2 * 4 * (spec.head_dim // 2)


NEWER = ("qwen3", "olmo2", "phi3", "starcoder2", "gemma", "gemma2", "gemma3_text", "gpt_neox")
"""The architectures added after the first four, with :data:`vrammath.measure.archs.ARCH_CONFIGS`'
small configs (odd sizes; Gemma-2/3 with a window of 16 below every fitted s)."""


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize(("precision", "attention"), [("bf16", "sdpa"), ("fp32", "eager")])
@pytest.mark.parametrize("arch", NEWER)
def test_newer_activations_equal_derived_polynomial(
    arch: str, precision: str, attention: str, recompute: str
) -> None:
    """As above for the newer decoders, bf16 SDPA (Gemma-2: bf16 eager; its SDPA is refused)
    and fp32 eager. Where the layers differ (Gemma-2/3's sliding and global layers) derive
    runs every layer and the polynomial is in b and s at the config's L."""
    from vrammath.measure.archs import ARCH_CONFIGS, EAGER_ONLY

    if arch in EAGER_ONLY:
        attention = "eager"
    cfg = ARCH_CONFIGS[arch]
    spec = as_spec(cfg)
    found = derive(
        cfg,
        precision=precision,
        attention=attention,
        recompute=recompute,
        batch=2,
        seq=SEQ,
        steps=1,
        verify=False,
    )
    analytic = hf_activation_bytes(
        spec,
        attention,  # type: ignore[arg-type]
        precision,  # type: ignore[arg-type]
        recompute,  # type: ignore[arg-type]
        device="cpu",
    )
    if found.layer_mode.startswith("fit in L"):
        got, want = found.in_layers["activations"], analytic.subs(_sizes(spec))
    else:
        got, want = found.exprs["activations"], analytic.subs(size_values(spec))
    assert _in_bs_l(got) == _in_bs_l(_piece(want))


def test_cli_derive_json(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIGS["qwen2"]), encoding="utf-8")
    assert main(["derive", str(path), "--batch", "2", "--seq", "16", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    spec = as_spec(CONFIGS["qwen2"])
    want = hf_activation_bytes(spec, "sdpa", "bf16", device="cpu").subs(
        {**size_values(spec), b: 2, s: 16}
    )
    assert data["bytes"]["activations"] == want
    assert data["misses"] == [] or all(not m.startswith("activations") for m in data["misses"])


MOE = ("small-mixtral", "small-qwen2-moe", "small-qwen3-moe", "small-deepseek-v3")
MOE_SEQ = 128
"""The MoE fit runs at s = 64, 128, 192 with b = 2, 3: every phase peak's winning candidate
stays the same over the points (at s = 32 Mixtral's backward switches from a constant one)."""


def _moe_cpu_extras(spec: Any) -> int:
    """What the CPU count sees and the estimate leaves out in every phase: Adam's step counters,
    the RoPE ``inv_freq`` and ``original_inv_freq`` buffers (fp32), and DeepSeek-V3's fp32
    ``e_score_correction_bias`` buffer per MoE layer."""
    rope = spec.latent.rope_dim if spec.latent is not None else spec.head_dim
    bias = 4 * spec.experts.count * len(spec.experts.layers) if spec.latent is not None else 0
    return step_counter_bytes(spec, "adamw") + 2 * 4 * (rope // 2) + bias


def test_derive_refuses_fp32_for_grouped_experts() -> None:
    with pytest.raises(InputError, match="^precision: mixtral runs grouped-matmul experts"):
        derive(MATRIX_CONFIGS["small-mixtral"], precision="fp32")


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("arch", MOE)
def test_moe_formulas_equal_derived(arch: str, recompute: str) -> None:
    """bf16 sdpa MoE: the activations equal derive's polynomial coefficient for coefficient; the
    step peak equals it up to the CPU extras as polynomials; the forward and backward peaks (a
    Max of candidates) are compared at the six fit points, where the polynomial is the measured
    count. Their known leftover, as in the dense rows of the validation matrix: at b >= 2 the
    measured forward peak holds one more int64 (b, s) tensor and 8 b bytes than the estimate's,
    and the estimate's loss-bound backward peak one more int64 (b, s) tensor than measured."""
    cfg = MATRIX_CONFIGS[arch]
    spec = as_spec(cfg)
    found = derive(cfg, recompute=recompute, batch=2, seq=MOE_SEQ, verify=False)
    assert found.experts == "grouped_mm"
    values = size_values(spec)
    policy: HfRecompute = "full" if recompute == "full" else "none"
    analytic = hf_activation_bytes(spec, "sdpa", "bf16", policy, device="cpu")
    analytic = analytic.subs(sympy.KroneckerDelta(1, b), 0)
    if found.layer_mode.startswith("fit in L"):  # every layer a MoE layer
        fixed = {k: v for k, v in values.items() if k not in (L, L_e)}
        want = _in_bs_l(analytic.subs(L_e, L).subs(fixed))
        assert _in_bs_l(found.in_layers["activations"]) == want
    else:
        assert _in_bs_l(found.exprs["activations"]) == _in_bs_l(analytic.subs(values))
    setup = Setup(
        spec,
        recipe=RECIPE_OF["bf16"],
        attention="sdpa",
        recompute=recompute,
        device="cpu",
        micro_batch=2,
        seq_len=MOE_SEQ,
    )
    exprs = estimate(setup).phase_exprs
    step = exprs["step_peak"].subs({P: param_count(spec)}).subs(values)
    extras = _moe_cpu_extras(spec)
    assert sympy.expand(step.subs(sympy.KroneckerDelta(1, b), 0) - found.exprs["step"]) == -extras
    # the forward and backward peaks are a Max of candidates: put every number in at once
    # (xreplace), so the Max compares integers, not polynomials in b and s (minutes on
    # DeepSeek-V3)
    fixed = {sym: sympy.Integer(v) for sym, v in {P: param_count(spec), **values}.items()}
    seqs, _, _ = grid(MOE_SEQ)
    points = [(bb, ss) for bb in (2, 3) for ss in seqs]
    worst = {}
    for phase in ("forward", "backward"):
        at = [{b: bb, s: ss} for bb, ss in points]
        measured = [int(found.exprs[phase].subs(p)) for p in at]
        analytic_at = [
            int(
                exprs[f"{phase}_peak"].xreplace(
                    {**fixed, b: sympy.Integer(bb), s: sympy.Integer(ss)}
                )
            )
            for bb, ss in points
        ]
        diffs = [m - a - extras for m, a in zip(measured, analytic_at, strict=True)]
        worst[phase] = max(abs(d) / m for d, m in zip(diffs, measured, strict=True))
        told = f"{arch} {recompute} {phase}: measured - analytic - CPU extras {diffs}"
        if phase == "forward":
            assert diffs == [8 * bb * ss + 8 * bb for bb, ss in points], told
        else:
            assert all(abs(d) <= 8 * bb * ss for d, (bb, ss) in zip(diffs, points, strict=True)), (
                told
            )
    assert max(worst.values()) < 1e-3, f"{arch} {recompute}: worst relative difference {worst}"
