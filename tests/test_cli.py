"""The CLI: breakdowns, JSON, formulas, listings; bad input -> one line on stderr, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vrammath.cli import main
from vrammath.params import param_count
from vrammath.presets import load_model


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
        ('{"model_type": "mixtral", "num_local_experts": 8}', "model_type: must be one of"),
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
