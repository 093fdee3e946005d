"""SGLang's startup budget: the static fraction, its default, what it prints and refuses."""

from __future__ import annotations

import json

import pytest

from vrammath import GiB, Serve, load_model
from vrammath.cli import main
from vrammath.model.presets import gpu
from vrammath.notation.errors import InputError
from vrammath.serve.kv_cache import kv_bytes_per_token
from vrammath.serve.sglang import Sglang, default_fraction, sglang_budget

LLAMA = load_model("llama-3.1-8b")


def test_the_rule_is_the_fraction_of_the_free_memory_less_the_weights() -> None:
    b = sglang_budget(Serve(LLAMA, gpu="H100-80GB"), Sglang(mem_fraction_static=0.8))
    rest = 0.8 * b.free_before_bytes - b.weights_bytes
    assert b.tokens == int(rest // kv_bytes_per_token(LLAMA, "bf16"))
    card = gpu("H100-80GB")
    assert b.free_before_bytes == card.usable_bytes - card.context_bytes - round(0.045 * GiB)
    paged = sglang_budget(
        Serve(LLAMA, gpu="H100-80GB"), Sglang(mem_fraction_static=0.8, page_size=64)
    )
    assert paged.tokens == b.tokens // 64 * 64


def test_the_docs_run_of_sglang_is_reproduced() -> None:
    # SGLang's docs (docs.sglang.ai, send_request): Llama-3.1-8B-Instruct, mem_fraction_static
    # 0.88, "avail mem=78.81 GB" before the weights, "#tokens: 444500"; on an H100 preset the
    # rule gives within 0.1 %
    b = sglang_budget(Serve(LLAMA, gpu="H100-80GB"))
    assert b.mem_fraction_static == 0.88
    assert abs(b.free_before_bytes / GiB - 78.81) < 0.1
    assert abs(b.tokens / 444500 - 1) < 0.002
    assert b.lines()[2].startswith(f"KV Cache is allocated. #tokens: {b.tokens}, K size: ")


@pytest.mark.parametrize(
    ("card", "tp", "want"),
    [
        ("H100-80GB", 1, 0.88),
        ("H100-80GB", 2, 0.87),
        ("A100-80GB", 4, 0.85),
        ("A100-40GB", 8, 0.81),
        ("V100-32GB", 16, 0.79),
    ],
)
def test_default_fraction_follows_sglang_0_4s_table(card: str, tp: int, want: float) -> None:
    assert default_fraction(gpu(card), tp) == want


def test_big_cards_need_the_fraction_given() -> None:
    with pytest.raises(InputError, match="mem_fraction_static: is needed on H200-141GB"):
        sglang_budget(Serve(LLAMA, gpu="H200-141GB"))
    assert sglang_budget(Serve(LLAMA, gpu="H200-141GB"), Sglang(mem_fraction_static=0.9)).starts


@pytest.mark.parametrize(
    ("flags", "setup", "field"),
    [
        ({"sglang_version": "0.3.0"}, {}, "sglang_version"),
        ({"sglang_version": "0.5.2"}, {}, "mem_fraction_static"),  # 0.5's default not modelled
        ({"mem_fraction_static": 0}, {}, "mem_fraction_static"),
        ({}, {"weights": "nf4"}, "weights"),
        ({}, {"model": "mistral-7b"}, "model"),
        ({}, {"gpu": None}, "gpu"),
    ],
)
def test_refusals_name_the_field(
    flags: dict[str, object], setup: dict[str, object], field: str
) -> None:
    model = load_model(str(setup.pop("model", "llama-3.1-8b")))
    with pytest.raises(InputError) as err:
        sglang_budget(Serve(model, **{"gpu": "H100-80GB", **setup}), Sglang(**flags))  # type: ignore[arg-type]
    assert err.value.field == field


def test_weights_that_do_not_fit_say_so() -> None:
    b = sglang_budget(Serve(load_model("llama-3.1-70b"), gpu="A100-80GB"))
    assert not b.starts
    assert b.lines()[-1].startswith("torch.OutOfMemoryError while loading the weights")


def test_cli(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["serve", "llama-3.1-8b", "--engine", "sglang", "--gpu", "H100-80GB"]
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (
        data["sglang"]["max_total_num_tokens"]
        == sglang_budget(Serve(LLAMA, gpu="H100-80GB")).tokens
    )
    for bad, word in ((["--gpu-memory-utilization", "0.8"], "engine vllm only"),
                      (["--context", "100"], "context-length"),
                      (["--sglang-version", "1.0"], "sglang_version")):  # fmt: skip
        assert main([*argv, *bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert word in err
    assert main(["serve", "llama-3.1-8b", "--mem-fraction-static", "0.8"]) == 2
    assert "engine sglang only" in capsys.readouterr().err
