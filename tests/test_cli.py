"""The CLI: breakdowns, JSON, formulas, listings; bad input -> one line on stderr, exit 2."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import sympy

from vrammath.cli import FORMULAS, main
from vrammath.compose.table import TERMS
from vrammath.model.params import param_count
from vrammath.model.presets import load_model


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_estimate_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "llama-7b", "--zero", "2", "--gpus", "4")
    assert code == 0
    assert "optimizer states" in out
    assert "8*P/N_d" in out
    assert "GB (1e9 B)" in out
    assert "GiB (2^30 B)" in out


def test_estimate_json_matches_zero_by_hand(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "qwen2-72b", "--zero", "3", "--gpus", "8", "--json")
    assert code == 0
    data = json.loads(out)
    psi = param_count(load_model("qwen2-72b"))
    by_key = {c["key"]: c["bytes"] for c in data["components"]}
    assert by_key["weights"] == -(-2 * psi // 8)
    assert by_key["optimizer"] == -(-8 * psi // 8)
    assert data["totals"]["model_state_bytes"] == sum(
        by_key[k] for k in ("weights", "gradients", "master", "optimizer")
    )
    assert set(data) >= {"model", "params", "setup", "components", "totals", "unestimated", "gpu"}
    assert all(isinstance(c["bytes"], int | None) for c in data["components"])


def test_formula_latex(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "formula", "zero", "--stage", "3", "--latex")
    assert code == 0
    assert r"\frac{P \left(K + 4\right)}{N_{d}}" in out


def test_listings(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "models")[1].count("\n") >= 10
    assert "A100-80GB" in run(capsys, "gpus")[1]


def test_config_path(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "vocab_size": 10,
            }
        )
    )
    assert run(capsys, "estimate", str(cfg))[0] == 0


BAD = [
    (["estimate", "llama-7b", "--gpus", "0"], "gpus: must be an integer from 1 to 1048576"),
    (["estimate", "llama-7b", "--gpus", "-4"], "gpus: must be an integer from 1 to 1048576"),
    (["estimate", "llama-7b", "--batch", "1.5"], "batch: must be an integer from 1 to 16777216"),
    (["estimate", "llama-7b", "--zero", "4"], "zero: must be 0, 1, 2, 3 or NO_SHARD"),
    (["estimate", "llama-7b", "--recipe", "fp64"], "recipe: must be one of fp32"),
    (["estimate", "llama-7b", "--optimizer", "lion"], "optimizer: must be one of adamw"),
    (["estimate", "llama-7b", "--gpu", "A100"], "gpu: must be one of V100-32GB"),
    (["estimate", "llama-8b"], "model: must be one of"),
    (["estimate", "llama-7b", "--offload-params", "--zero", "2"], "offload_params: needs --zero 3"),
    (["estimate", "llama-7b", "--sp"], "sp: sequence parallelism needs tp > 1"),
    (["formula", "entropy"], "term: must be one of params"),
]


@pytest.mark.parametrize(("argv", "message"), BAD)
def test_bad_input_one_line_exit_2(argv: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "vrammath", *argv], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert message in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "config.json: is not valid JSON"),
        ('{"model_type": "llama", "hidden_size"', "config.json: is not valid JSON"),
        ('"a string"', "config.json: must hold a JSON object"),
        ('{"model_type": "llama"}', "hidden_size: is required"),
        ('{"model_type": "bert"}', "model_type: must be one of"),
    ],
)
def test_bad_config_files(tmp_path: Path, content: str, message: str) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(content)
    proc = subprocess.run(
        [sys.executable, "-m", "vrammath", "estimate", str(cfg)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1
    assert message in proc.stderr


# --- issue 15: every defect found by a new user's bad inputs, each pinned -----------------------


def one_line_exit_2(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code, out, err = run(capsys, *argv)
    assert code == 2, (argv, err)
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    return err


HUGE = "1" + "0" * 310


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["estimate", "llama-7b", "--batch", HUGE, "--json"], "batch: must be an integer from 1"),
        (["estimate", "llama-7b", "--seq", HUGE], "seq: must be an integer from 1 to 16777216"),
        (["serve", "llama-7b", "--batch", HUGE], "batch: must be an integer from 1"),
        (["serve", "llama-7b", "--context", "9" * 5000], "context: must be an integer"),
        (["fit", "llama-7b", "--gpu", "A100-80GB", "--seq", HUGE], "seq: must be an integer"),
        (["estimate", "llama-7b", "--tp", "64"], "tp: must divide the attention heads (32)"),
        (["estimate", "llama-7b", "--tp", "100000"], "tp: must divide the attention heads"),
        (["estimate", "qwen2-7b", "--tp", "8"], "tp: must divide the attention heads (28)"),
        (["estimate", "llama-7b", "--pp", "1000"], "pp: must be at most the layers (32)"),
        (["serve", "llama-7b", "--tp", "64"], "tp: must divide the attention heads (32)"),
        (["serve", "llama-2-70b", "--tp", "3"], "tp: must divide the attention heads (64)"),
        (["estimate", "llama-7b", "--lora-targets", "q,k"], "lora-targets: needs --lora-rank"),
        (["estimate", "llama-7b", "--lora-dropout"], "lora_dropout: needs --lora-rank"),
        (["estimate", "llama-7b", "--chunks", "2"], "chunks: is used only by --schedule interl"),
        (["estimate", "llama-7b", "--schedule", "interleaved"], "schedule: interleaved needs --pp"),
        (
            ["estimate", "llama-7b", "--schedule", "interleaved", "--pp", "4"],
            "chunks: interleaved needs --chunks > 1",
        ),
        (["estimate", "gpt2", "--recipe", "autocast-fp16"], "recipe: autocast is not derived"),
        (
            ["fit", "llama-7b", "--gpu", "A100-80GB", "--reserve-gib", "100"],
            "headroom/reserve-gib: leave nothing of A100-80GB",
        ),
        (["fit", "llama-7b", "--gpu", "A100-80GB", "--headroom", "nan"], "headroom: must be a"),
        (["serve", "llama-7b", "--gpu-util", "inf"], "gpu-util: must be a number in (0, 1]"),
        (["estimate", "llama-7b\nx"], "model: must be one of"),
        (["formula", "zero", "--model", "gpt-5"], "model: must be one of"),
    ],
)
def test_issue_15_refusals(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert message in one_line_exit_2(capsys, *argv)


def _config(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 10,
    }
    return {**base, **overrides}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 100_000 + "]" * 100_000, "config.json: must nest at most 64 levels"),
        ('{"a":' * 100_000 + "1" + "}" * 100_000, "config.json: must nest at most 64 levels"),
        (
            json.dumps(_config())[:-1] + ', "x": ' + "7" * 5000 + "}",
            "config.json: integers must be at most 2**63 - 1 (got a 5000-digit number)",
        ),
        (json.dumps(_config(hidden_size=10**160)), "integers must be at most 2**63 - 1"),
        (json.dumps(_config())[:-1] + ', "x": NaN}', "must not hold NaN or Infinity"),
    ],
)
@pytest.mark.parametrize("command", [["estimate"], ["formula", "params", "--model"]])
def test_hostile_configs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, message: str, command: list[str]
) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(text)
    assert message in one_line_exit_2(capsys, *command, str(cfg))


def test_config_path_with_a_newline_stays_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    folder = tmp_path / "two\nlines"
    folder.mkdir()
    cfg = folder / "bad\nname.json"
    cfg.write_text("{not json")
    err = one_line_exit_2(capsys, "estimate", str(cfg))
    assert "'bad\\nname.json': is not valid JSON" in err
    good = folder / "config.json"
    good.write_text(json.dumps(_config()))
    code, out, _ = run(capsys, "estimate", str(good))
    assert code == 0
    assert out.splitlines()[0].startswith("two\\nlines: ")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_full_disk_is_one_line_exit_1() -> None:
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "vrammath", "models"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    assert proc.returncode == 1
    assert proc.stderr == "vrammath: error: cannot write the output (No space left on device)\n"


def test_seq_past_max_positions_warns(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "estimate", "gpt2", "--seq", "4096")
    assert code == 0
    warning = "seq_len 4096 exceeds the model's max_position_embeddings (1024)"
    assert err == f"vrammath: warning: {warning}\n"
    code, out, err = run(capsys, "estimate", "gpt2", "--seq", "4096", "--json")
    assert json.loads(out)["warnings"] == [warning]
    code, out, err = run(capsys, "estimate", "gpt2", "--seq", "1024", "--json")
    assert json.loads(out)["warnings"] == []
    assert err == ""


def test_model_warnings_are_printed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from vrammath import cli, serve_command

    spec = load_model("gpt2")
    warned = dataclasses.replace(spec, warnings=("a model warning",))
    monkeypatch.setattr(cli, "resolve_model", lambda name: warned)
    monkeypatch.setattr(serve_command, "resolve_model", lambda name: warned)
    for command in (["estimate", "-s", "512"], ["serve", "--context", "512"]):
        code, out, err = run(capsys, command[0], "gpt2", *command[1:], "--json")
        assert code == 0
        assert json.loads(out)["warnings"] == ["a model warning"]
        assert err == "vrammath: warning: a model warning\n"


# --- formula: every term, as the package computes it ---------------------------------------------


def formula(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, str]:
    code, out, err = run(capsys, "formula", *argv, "--json")
    assert code == 0, err
    return {e["name"]: e["expr"] for e in json.loads(out)["exprs"]}


@pytest.mark.parametrize("term", FORMULAS)
def test_every_formula_term_prints_text_and_latex(
    capsys: pytest.CaptureFixture[str], term: str
) -> None:
    text = formula(capsys, term)
    latex = formula(capsys, term, "--latex")
    assert text
    assert list(text) == list(latex)


def test_formula_activations_are_the_package_functions(capsys: pytest.CaptureFixture[str]) -> None:
    from vrammath.terms.activations.model import activation_exprs
    from vrammath.terms.korthikanti.dense import korthikanti_layer_bytes

    exprs = formula(capsys, "activations")
    assert exprs["korthikanti layer, parallel tp, recompute selective"] == str(
        korthikanti_layer_bytes("tp", "selective")
    )
    # Korthikanti's published totals: sbh(34 + 5as/h) without parallelism
    k = sympy.sympify(exprs["korthikanti layer, parallel none, recompute none"])
    sym = {x.name: x for x in k.free_symbols}
    sb_h = sym["s"] * sym["b"] * sym["h"]
    assert sympy.simplify(k - sb_h * (34 + 5 * sym["a"] * sym["s"] / sym["h"])) == 0
    spec = load_model("gpt2")
    with_model = formula(capsys, "activations", "--model", "gpt2", "--recipe", "fp32")
    hf = with_model["hf activations, all layers, recompute none"]
    from vrammath.model.params import size_values

    expected = activation_exprs(spec, "sdpa", "fp32")["activations"].subs(size_values(spec))
    assert hf == str(expected)
    free = {x.name for x in sympy.sympify(hf).free_symbols}
    assert free == {"b", "s"}  # the model's sizes substituted, b and s left
    zero = sympy.sympify(
        formula(capsys, "zero", "--model", "gpt2", "--stage", "3")[
            "zero-3 bytes per GPU (ZeRO paper)"
        ]
    )
    assert {x.name for x in zero.free_symbols} == {"K", "N_d"}


def test_formula_kv_lora_phases(capsys: pytest.CaptureFixture[str]) -> None:
    from vrammath.serve.kv_cache import kv_cache_expr
    from vrammath.terms.lora.adapters import lora_param_expr

    spec = load_model("llama-7b")
    assert formula(capsys, "kv")["KV cache"] == str(kv_cache_expr(spec))
    assert formula(capsys, "lora", "--lora-targets", "all-linear")["trainable parameters"] == str(
        lora_param_expr(spec, "all-linear")
    )
    phases = formula(capsys, "phases", "--model", "llama-7b", "--stage", "3")
    assert set(phases) == {"forward_peak", "backward_peak", "step_peak"}
    assert "N_d" in phases["step_peak"]


DEEPSEEK_LAYOUT = [
    "estimate",
    "deepseek-v3",
    "--activations",
    "korthikanti",
    "--gpus",
    "128",
    "--pp",
    "16",
    "--ep",
    "64",
    "--zero",
    "1",
    "--schedule",
    "dualpipe",
    "--recipe",
    "deepseek-v3-fp8",
    "--seq",
    "4096",
    "--batch",
    "1",
]


def test_deepseek_v3_layout_through_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, *DEEPSEEK_LAYOUT, "--json")
    assert code == 0
    data = json.loads(out)
    assert data["setup"]["capacity_factor"] is None
    assert data["setup"]["imbalance"] == 1
    assert data["setup"]["activation_policy"] == "auto"
    assert max(data["phases"].values()) == 80_664_844_672  # deepseek_v3_training_memory()
    code, text, _ = run(capsys, *DEEPSEEK_LAYOUT)
    assert code == 0
    assert "experts over --ep 64 (expert-data-parallel group of 2)" in text
    assert "stages 0, 15" in text


def test_capacity_factor_and_imbalance_flags(capsys: pytest.CaptureFixture[str]) -> None:
    from vrammath.answers.moe_layouts import deepseek_v3_training_memory

    def peak(*extra: str) -> int:
        code, out, _ = run(capsys, *DEEPSEEK_LAYOUT, "--json", *extra)
        assert code == 0
        return int(max(json.loads(out)["phases"].values()))

    assert peak("--capacity-factor", "1") == peak() == 80_664_844_672
    assert (
        peak("--capacity-factor", "1.25")
        == deepseek_v3_training_memory(capacity_factor=1.25).estimate.gpu_bytes
    )
    assert peak("--imbalance", "1.25") == deepseek_v3_training_memory(imbalance=1.25).total
    assert peak("--imbalance", "1.25") > peak()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--imbalance", "0.5"], "imbalance: must be a number from 1 to 1024 (got 0.5)"),
        (["--capacity-factor", "0"], "capacity_factor: must be a number above 0"),
        (["--capacity-factor", "-1"], "capacity_factor: must be a number above 0"),
        (["--capacity-factor", "abc"], "capacity-factor: must be a number (got 'abc')"),
        (["--imbalance", "nan"], "imbalance: must be a number (got 'nan')"),
        (["--activation-policy", "fp4"], "activation-policy: must be one of auto, bf16-flash"),
        (["--tp", "2"], "tp: tensor parallelism of Korthikanti-style mixture-of-experts"),
        (["--recompute", "full"], "recompute: full: the recomputed MoE layer's transient"),
        (["--attention", "eager"], "attention: the Korthikanti-style mixture-of-experts"),
        (["--recipe", "fp32"], "recipe: the Korthikanti-style mixture-of-experts policies"),
        (["--zero", "2"], "zero: stages 2 and 3 are not modelled with pipeline parallelism"),
        (["--pp", "15"], "pp: must be even for DualPipe"),
    ],
)
def test_moe_korthikanti_refusals(
    capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert message in one_line_exit_2(capsys, *DEEPSEEK_LAYOUT, *extra)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["llama-7b", "--capacity-factor", "1.25"], "capacity_factor: needs a mixture-of-experts"),
        (["mixtral-8x7b", "--imbalance", "1.5"], "imbalance: needs a mixture-of-experts model"),
        (["llama-7b", "--activation-policy", "deepseek-v3"], "activation_policy: needs a"),
        (["llama-7b", "--pp", "2", "--schedule", "dualpipe"], "schedule: dualpipe is modelled"),
        (["mixtral-8x7b", "--recipe", "deepseek-v3-fp8"], "recipe: deepseek-v3-fp8 needs"),
    ],
)
def test_moe_fields_refused_off_the_moe_path(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert message in one_line_exit_2(capsys, "estimate", *argv)


def test_default_lora_targets_missing_names_the_allowed(capsys: pytest.CaptureFixture[str]) -> None:
    """GPT-2 fuses q, k, v into c_attn: the default q,v is refused with what it has instead."""
    code, _, err = run(capsys, "estimate", "gpt2", "--lora-rank", "8")
    assert code == 2
    assert err.strip().endswith(
        "q,v (the default) are not projections of gpt2; pass --lora-targets with one of "
        "qkv, o, up, down, c_attn, c_proj, c_fc, all-linear, attention, mlp (got 'q,v')"
    )
    assert run(capsys, "estimate", "gpt2", "--lora-rank", "8", "--lora-targets", "c_attn")[0] == 0


def test_with_names_only_opt_in_rows(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "estimate", "llama-7b", "--with", "no-such-row")
    assert code == 2
    assert out == ""
    allowed = ", ".join(t.key for t in TERMS if t.opt_in) or "none in this table"
    assert err.strip().endswith(
        f"extra_terms: must name opt-in rows of the table ({allowed}) (got 'no-such-row')"
    )
