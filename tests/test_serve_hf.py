"""``vrammath serve --engine hf``: transformers' generate() on one GPU, its answer and refusals."""

from __future__ import annotations

import json

import pytest

from vrammath.cli import main
from vrammath.model.presets import gpu, load_model
from vrammath.serve.estimate import Serve
from vrammath.serve.generate import generate_peaks
from vrammath.serve.hf import Hf, hf_serve, rope_buffer_bytes
from vrammath.serve.weights import serving_weight_bytes


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["serve", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_answer_adds_up(capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(capsys, "llama-3.1-8b", "--engine", "hf", "--context", "4096", "--batch", "8",
                 "--gpu", "H100-80GB")  # fmt: skip
    hf = data["hf"]
    assert isinstance(hf, dict)
    spec = load_model("llama-3.1-8b")
    peaks = generate_peaks(spec, prompt=3968, new_tokens=128, batch=8)
    assert hf["prompt_tokens"] == 3968
    assert hf["weights_bytes"] == serving_weight_bytes(spec, "bf16")["weights"]
    assert hf["buffer_bytes"] == rope_buffer_bytes(128) == 512
    assert hf["total_bytes"] == hf["weights_bytes"] + 512 + peaks.peak_bytes
    assert hf["kv_cache_bytes"] == 8 * 4095 * 128 * 1024
    assert hf["gpu"]["fits"] is True
    assert data["setup"]["kv_dtype"] == "bf16"


def test_largest_batch_is_the_edge() -> None:
    setup = Serve(load_model("qwen2-7b"), context=8192, gpu="A100-40GB")
    est = hf_serve(setup, Hf(new_tokens=512))
    n = est.max_batch()
    assert n is not None
    assert n > 0
    card = gpu("A100-40GB")
    room = card.usable - est.outside_bytes - est.weights_bytes - est.buffer_bytes

    def peak(batch: int) -> int:
        return generate_peaks(setup.model, prompt=7680, new_tokens=512, batch=batch).peak_bytes

    assert peak(n) <= room < peak(n + 1)


def test_fp16_cache_follows_the_weights(capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(capsys, "qwen2-7b", "--engine", "hf", "--weights", "fp16")
    assert data["setup"]["kv_dtype"] == "fp16"


def test_text_names_the_points(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "llama-3.1-8b", "--engine", "hf", "--gpu", "L40S-48GB"]) == 0
    out = capsys.readouterr().out
    assert "prefill's peak (at the MLP)" in out
    assert "last decode step's peak (at the cache update)" in out
    assert "assumed: greedy search" in out


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["qwen3-8b"], "model"),
        (["qwen2-7b", "--weights", "int4"], "weights"),
        (["qwen2-7b", "--weights", "fp16", "--kv-dtype", "bf16"], "kv_dtype"),
        (["qwen2-7b", "--tp", "2"], "tp"),
        (["qwen2-7b", "--block", "32"], "block"),
        (["qwen2-7b", "--gpu-util", "0.8"], "gpu-util"),
        (["qwen2-7b", "--context", "128", "--new-tokens", "128"], "new_tokens"),
    ],
)
def test_refusals(argv: list[str], field: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", *argv, "--engine", "hf"]) == 2
    err = capsys.readouterr().err
    assert f"error: {field}:" in err
    assert "Traceback" not in err


def test_new_tokens_only_with_hf(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "qwen2-7b", "--new-tokens", "5"]) == 2
    assert "new-tokens: is read by --engine hf only" in capsys.readouterr().err


def test_context_past_the_positions_warns(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "qwen2-7b", "--engine", "hf", "--context", "200000"]) == 0
    assert "context 200000 exceeds the model's max_position_embeddings" in capsys.readouterr().err
