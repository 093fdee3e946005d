"""Training estimates of mixture-of-experts models: states by group, the MoE block's phase peaks,
the CLI, and what is refused (one line, exit 2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sympy

from vrammath.cli import main
from vrammath.compose.estimate import estimate
from vrammath.compose.setup import Setup, with_changes
from vrammath.compose.table import TERMS, TERMS_BY_KEY
from vrammath.model.params import size_values
from vrammath.model.presets import load_model
from vrammath.model.readers import from_hf_config
from vrammath.notation.symbols import E, I_e, N_d, P, P_e, b, h, k_e, n_ep, s
from vrammath.terms.moe.params import expert_values, param_summary
from vrammath.terms.moe.peaks import moe_backward_steps, moe_forward_steps

MODELS = Path(__file__).resolve().parent.parent / "conf" / "models"
STATES = ("weights", "gradients", "master", "optimizer")


def test_state_rows_name_their_groups() -> None:
    edp = {t.key for t in TERMS if t.shard_group == "dp+edp"}
    assert edp == {
        "weights",
        "gradients",
        "master",
        "optimizer",
        "cpu_master",
        "cpu_optimizer",
        "cpu_gradients",
        "cpu_weights",
        "step_temporaries",
    }
    assert TERMS_BY_KEY["activations"].shard_group == "dp"


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_estimate_states_equal_the_expert_parallel_formula(zero: int) -> None:
    spec = load_model("mixtral-8x7b")
    setup = Setup(spec, recipe="bf16-mixed", zero=zero, gpus=16, ep=8, seq_len=1024)
    est = estimate(setup)
    sharded_from = {"weights": 3, "gradients": 2, "master": 1, "optimizer": 1}
    # Mixtral-8x7B: 46,702,792,704 parameters, of which 32 x 8 x 3 x 4096 x 14336 routed
    total, experts = 46_702_792_704, 32 * 8 * 3 * 4096 * 14336
    replica = total - experts + experts // 8  # dense whole, experts split over 8
    widths = {"weights": 2, "gradients": 2, "master": 4, "optimizer": 8}
    expected = {
        k: w * (total // 16 if zero >= sharded_from[k] else replica) for k, w in widths.items()
    }
    assert {k: est.component(k).bytes for k in STATES} == expected
    for key in STATES:
        expr = est.component(key).expr
        if zero >= sharded_from[key]:
            assert expr.free_symbols == {P, N_d}  # dense / N_d + experts / ep / (N_d / ep)
        else:
            assert sympy.expand(expr / expr.coeff(P) - (P - P_e + P_e / n_ep)) == 0


def test_expert_parallelism_saves_the_replicated_states_only() -> None:
    spec = load_model("qwen3-30b-a3b")
    base = Setup(spec, recipe="bf16-mixed", zero=1, gpus=8, seq_len=512)
    one, eight = estimate(base), estimate(with_changes(base, ep=8))
    routed = expert_values(spec)[P_e]
    saved = 2 * (routed - routed // 8)  # bf16: 7/8 of the routed experts live elsewhere
    assert one.component("weights").bytes - eight.component("weights").bytes == saved
    assert one.component("gradients").bytes - eight.component("gradients").bytes == saved
    assert one.component("optimizer").bytes == eight.component("optimizer").bytes
    assert one.activation_bytes == eight.activation_bytes


def test_zero3_gathers_the_local_experts_only() -> None:
    spec = load_model("mixtral-8x7b")
    setup = Setup(spec, recipe="bf16-pure", zero=3, gpus=8, seq_len=512)
    full = estimate(setup).component("gathered").bytes
    local = estimate(with_changes(setup, ep=8)).component("gathered").bytes
    per_layer_experts = 8 * 3 * 4096 * 14336
    assert full is not None
    assert local is not None
    assert full - local == 2 * 2 * (per_layer_experts - per_layer_experts // 8)


def _spec(model_type: str, **extra: Any) -> Any:
    cfg: dict[str, Any] = {
        "model_type": model_type,
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        **extra,
    }
    return from_hf_config(cfg)


MIXTRAL = {"num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 256}
QWEN2 = {
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 256,
    "shared_expert_intermediate_size": 48,
}
QWEN3 = {
    "head_dim": 16,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 256,
    "norm_topk_prob": True,
}


def _numbers(spec: Any, batch: int, seq: int) -> dict[Any, int]:
    return {**size_values(spec), b: batch, s: seq, k_e: spec.experts.top_k}


@pytest.mark.parametrize(
    ("model_type", "extra", "forward_max", "backward_max"),
    [
        # the largest running sums, measured op by op (tests/measure/test_moe.py) at b 2, s 128
        ("mixtral", MIXTRAL, 1483840, 716800),
        ("qwen3_moe", QWEN3, 1350720, 716800),
    ],
)
def test_block_running_peaks(
    model_type: str, extra: dict[str, Any], forward_max: int, backward_max: int
) -> None:
    spec = _spec(model_type, **extra)
    values = _numbers(spec, 2, 128)
    forward, total = [0], sympy.Integer(0)
    for x in moe_forward_steps(spec):
        total += x
        forward.append(int(total.subs(values)))
    assert max(forward) == forward_max
    live, back = sympy.Integer(0), [0]
    for x, g in moe_backward_steps(spec):
        live += x + 2 * g  # bf16 weight gradients
        back.append(int(live.subs(values)))
    assert max(back) == backward_max


def test_block_steps_keep_what_the_block_keeps() -> None:
    """A saving forward ends with the kept tensors and the output; the backward's gradients are
    every expert weight's, once."""
    from vrammath.terms.moe.params import moe_mlp_kept_exprs

    for spec in (_spec("mixtral", **MIXTRAL), _spec("qwen3_moe", **QWEN3)):
        kept = moe_mlp_kept_exprs(spec)
        # what forward made and has not freed by its last allocation: kept + the transients
        # freed when the experts' function returns (ids, histogram, permuted rows, fp32 sum)
        assert sympy.expand(sum(moe_forward_steps(spec)) - sum(kept.values())).free_symbols <= {
            b,
            s,
            k_e,
            E,
            h,
        }
        grads = sum(g for _, g in moe_backward_steps(spec))
        assert sympy.expand(grads - 3 * E * h * I_e) == 0


def test_peaks_follow_the_moe_block_under_recomputation() -> None:
    spec = load_model("mixtral-8x7b")
    setup = Setup(spec, recipe="bf16-pure", zero=3, gpus=64, ep=8, seq_len=4096)
    none, full = estimate(setup), estimate(with_changes(setup, recompute="full"))
    # full recomputation keeps one checkpoint per layer, yet a recomputed MoE layer is large:
    # the backward peak stays above the state and the forward's end
    assert full.activation_bytes < none.activation_bytes / 10
    assert full.phases["backward_peak"] > full.states_plus_gathered_bytes + full.activation_bytes
    assert none.peak_phase == "backward_peak"


def test_json_and_text_carry_total_and_active(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "mixtral-8x7b", "--ep", "8", "--gpus", "8", "--zero", "1", "--seq", "512"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "46,702,792,704 parameters in all, 12,879,925,248 active per token" in out
    assert "2*P - 2*P_e + 2*P_e/n_ep" in out
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["moe"]["total_params"] == 46_702_792_704
    assert data["moe"]["active_params"] == 12_879_925_248
    assert data["moe"]["groups"] == {
        "data_parallel": 8,
        "expert_parallel": 8,
        "expert_data_parallel": 1,
    }
    assert (
        param_summary(load_model("mixtral-8x7b"))["routed_experts"]
        == (data["moe"]["routed_expert_params"])
    )


def _one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, err
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    return err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ep", "3", "--gpus", "6"], "ep: must divide the routed experts (8: 1, 2, 4, 8)"),
        (["--ep", "4", "--gpus", "2"], "ep: must divide --gpus=2"),
        (["--ep", "2", "--gpus", "2", "--optimizer", "adafactor"], "optimizer: must be one of"),
        # --tp and selective recomputation take the Korthikanti-style path (Megatron's), whose
        # tensor parallelism is refused by name
        (["--tp", "2"], "tp: tensor parallelism of Korthikanti-style mixture-of-experts"),
        (["--attention", "eager"], "attention: mixture-of-experts phase peaks are derived"),
        (["--recipe", "fp32"], "recipe: mixture-of-experts training is derived for a bf16 forward"),
        (
            ["--recipe", "bf16-pure", "--lora-rank", "8", "--lora-targets", "experts"],
            "lora_targets: adapters on the router or the experts are not in the training",
        ),
    ],
)
def test_refused_setups_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert message in _one_line_exit_2(capsys, ["estimate", "mixtral-8x7b", *argv])


@pytest.mark.parametrize(
    ("preset", "change", "message"),
    [
        ("qwen3-30b-a3b", {"num_experts_per_tok": 129}, "num_experts_per_tok: must be at most"),
        ("mixtral-8x7b", {"num_experts_per_tok": 9}, "num_experts_per_tok: must be at most"),
        ("mixtral-8x7b", {"router_jitter_noise": 0.1}, "router_jitter_noise: must be 0.0"),
        ("deepseek-v3", {"scoring_func": "softmax"}, "scoring_func: must be one of sigmoid"),
        ("deepseek-v3", {"topk_method": "greedy"}, "topk_method: must be one of noaux_tc"),
    ],
)
def test_bad_router_configs_one_line_exit_2(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    preset: str,
    change: dict[str, object],
    message: str,
) -> None:
    cfg = json.loads((MODELS / f"{preset}.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, **change}))
    assert message in _one_line_exit_2(capsys, ["estimate", str(path)])


def test_a_middle_moe_layer_sets_the_recomputed_backward_peak() -> None:
    """Qwen2-MoE with dense first and last layers: the MoE candidates sit at the MoE layer
    (the layer above back-propagated, its checkpoint freed and gradients made). PyTorch counts
    5,379,348 B at this backward peak (fake mode, the matrix's method); the estimate is 244 B
    under it (the step counters and scalars the phases leave out)."""
    spec = _spec(
        "qwen2_moe",
        vocab_size=256,
        intermediate_size=160,
        num_hidden_layers=3,
        mlp_only_layers=[0, 2],
        **{**QWEN2, "moe_intermediate_size": 96, "shared_expert_intermediate_size": 192},
    )
    setup = Setup(spec, recipe="bf16-pure", micro_batch=2, seq_len=256, recompute="full")
    peak = estimate(with_changes(setup, device="cpu")).phases["backward_peak"]
    assert peak == 5_379_348 - 244


def test_fewest_gpus_is_a_multiple_of_ep() -> None:
    from vrammath.answers.fit import fit

    setup = Setup(load_model("mixtral-8x7b"), recipe="bf16-pure", zero=3, gpus=64, ep=8)
    answer = fit(with_changes(setup, gpu="H100-80GB"))
    n = answer.gpus.value
    assert n is not None
    assert n % 8 == 0
    assert estimate(with_changes(setup, gpus=n)).gpu_bytes <= answer.budget.usable


def test_selective_recomputation_takes_the_korthikanti_style_path(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Selective recomputation exists only in Megatron's formulas: the MoE layers come from
    vrammath.terms.korthikanti.moe there, not from transformers' grouped experts."""
    assert main(["estimate", "mixtral-8x7b", "--recompute", "selective", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["setup"]["recompute"] == "selective"
    assert main(["estimate", "mixtral-8x7b", "--recompute", "selective"]) == 0
    assert "Korthikanti-style MoE" in capsys.readouterr().out
