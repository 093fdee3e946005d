"""The CLI under fire: text and JSON agree on a sample of setups, and hypothesis-generated argument
lists and config files never produce a traceback, an exit status other than 0 or 2, or a
negative, NaN or infinite figure."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vrammath.cli import FORMULAS, main
from vrammath.model.presets import model_names
from vrammath.notation.units import fmt_gb

FIGURE = re.compile(r"(\S+) (GB|GiB)\b")


def call(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def check_figures(text: str) -> None:
    """Every size printed is a finite, non-negative number."""
    for number, unit in FIGURE.findall(text):
        value = float(number.strip("(").replace(",", ""))
        assert math.isfinite(value), (number, unit)
        assert value >= 0, (number, unit, text)


SIGNED = {"kv_budget_bytes"}  # weights may exceed a GPU: a budget is signed by meaning


def check_numbers(data: object, key: str = "") -> None:
    """Every number in the JSON is finite, and non-negative unless signed by meaning."""
    if isinstance(data, dict):
        for k, v in data.items():
            check_numbers(v, k)
    elif isinstance(data, list):
        for v in data:
            check_numbers(v, key)
    elif isinstance(data, int | float) and not isinstance(data, bool):
        assert math.isfinite(data), key
        assert key in SIGNED or data >= 0, (key, data)


def agree(command: str, text: str, data: dict[str, Any]) -> None:
    """What the text shows, the JSON carries."""
    if command == "estimate":
        assert f"{data['params']:,} parameters" in text
        for c in data["components"]:
            assert c["label"] in text
            if c["bytes"] is not None:
                assert fmt_gb(c["bytes"]) in text
        for value in data["phases"].values():
            assert fmt_gb(value) in text
        assert fmt_gb(data["totals"]["gpu_bytes"]) in text
        assert f"peak per GPU ({data['totals']['peak_phase']})" in text
        if data["setup"]["lora_rank"] is not None:
            assert f"{data['trainable_params']:,} trainable" in text
    elif command == "serve":
        for key in ("weights_bytes", "quant_constants_bytes", "kv_cache_bytes", "total_bytes"):
            assert fmt_gb(data[key]) in text, key
        assert f"KV cache per token per GPU: {data['kv_bytes_per_token']:,} bytes" in text
        if data["gpu"] is not None:
            assert fmt_gb(data["reserve_bytes"]) in text
            assert fmt_gb(data["total_with_reserve_bytes"]) in text
            assert f"largest batch at {data['setup']['context']} tokens: " in text
            assert f": {data['gpu']['max_batch_at_context']};" in text
            assert f"{data['gpu']['max_context_at_batch']:,} tokens" in text
    elif command == "fit":
        label = data["recommendation"]["label"]  # "none": the text says nothing fits
        assert f"recommended: {'nothing fits' if label == 'none' else label}" in text
        assert fmt_gb(data["given"]["gpu_bytes"]) in text
        for answer in data["answers"].values():
            if answer["value"] is not None:
                assert f"{answer['unknown']} = {answer['value']}" in text
                assert fmt_gb(answer["bytes"]) in text
    elif command == "formula":
        assert text.splitlines() == [f"{e['name']}: {e['expr']}" for e in data["exprs"]]
    elif command == "models":
        for row in data["models"]:
            assert f"{row['params']:,} params" in text
    else:
        for row in data["gpus"]:
            assert row["name"] in text
            assert fmt_gb(row["bytes"]) in text


def check_run(argv: list[str]) -> None:
    """Run ``argv`` as text and as JSON; check the contract on both."""
    argv = [a for a in argv if a != "--json"]
    code, out, err = call(argv)
    assert code in (0, 2), (argv, code, err)
    assert "Traceback" not in err
    if code == 2:
        assert out == ""
        assert len(err.strip().splitlines()) == 1, err
        assert err.startswith(("vrammath: error: ", "usage: ")), err
        return
    if "-h" in argv or any(a.startswith("--h") for a in argv):
        return  # the help text
    for line in err.splitlines():
        assert line.startswith("vrammath: warning: "), line
    check_figures(out)
    code_j, out_j, err_j = call([*argv, "--json"])
    assert (code_j, err_j) == (0, err)
    data = json.loads(out_j)
    check_numbers(data)
    agree(argv[0], out, data)


SAMPLE = [
    ["estimate", "llama-7b", "--zero", "2", "--gpus", "4", "--gpu", "A100-80GB"],
    ["estimate", "qwen2-72b", "--zero", "3", "--gpus", "8", "--offload-optimizer"],
    [
        "estimate",
        "gpt2",
        "--lora-rank",
        "8",
        "--lora-targets",
        "c_attn",
        "--quant",
        "nf4",
        "--seq",
        "512",
    ],
    ["estimate", "llama-2-70b", "--tp", "8", "--pp", "4", "--sp", "--recompute", "selective"],
    ["estimate", "gpt2", "--seq", "4096", "--gpu", "RTX-4090-24GB"],
    ["estimate", "llama-7b", "--gpu", "RTX-4090-24GB"],
    ["serve", "llama-2-70b", "--gpu", "A100-80GB", "--tp", "4"],
    ["serve", "llama-2-70b", "--gpu", "A100-40GB"],
    ["serve", "mistral-7b", "--weights", "int4", "--no-paging", "--context", "65536"],
    ["fit", "gpt2", "--gpu", "A100-80GB", "--seq", "1024"],
    *(["formula", term] for term in FORMULAS),
    ["formula", "activations", "--model", "gpt2", "--recipe", "fp32", "--latex"],
    ["formula", "zero", "--model", "llama-7b", "--stage", "3"],
    ["models"],
    ["gpus"],
]


@pytest.mark.parametrize("argv", SAMPLE, ids=" ".join)
def test_text_and_json_agree(argv: list[str]) -> None:
    code, _, _ = call(argv)
    assert code == 0
    check_run(argv)


# --- the fuzz ----------------------------------------------------------------------------------

PRESETS = model_names()
SMALL = ["gpt2", "llama-7b", "mistral-7b"]
FLAGS = {
    "--batch": ("1", "2", "64"),
    "--seq": ("1", "512", "4096"),
    "--gpus": ("1", "8", "1024"),
    "--zero": ("0", "1", "2", "3", "FULL_SHARD", "4"),
    "--tp": ("1", "2", "4", "8", "3"),
    "--pp": ("1", "2", "4"),
    "--chunks": ("1", "2"),
    "--schedule": ("1f1b", "interleaved"),
    "--recipe": ("bf16-mixed", "fp32", "autocast-fp16", "fp16-mixed", "bf16-pure"),
    "--optimizer": ("adamw", "sgd", "adam8bit", "adafactor"),
    "--impl": ("foreach", "fused", "for-loop"),
    "--attention": ("sdpa", "eager"),
    "--recompute": ("none", "selective", "full"),
    "--activations": ("auto", "hf", "korthikanti"),
    "--iteration": ("steady", "first"),
    "--device": ("cuda", "cpu"),
    "--gpu": ("A100-80GB", "H100-80GB", "RTX-4090-24GB", "a100"),
    "--lora-rank": ("8", "64"),
    "--lora-targets": ("q,v", "all-linear", "gate"),
    "--quant": ("nf4", "int8"),
    "--context": ("1", "4096", "1000000"),
    "--weights": ("bf16", "int4", "nf4"),
    "--kv-dtype": ("bf16", "fp8-e4m3"),
    "--block": ("1", "16"),
    "--gpu-util": ("0.9", "1", "0"),
    "--headroom": ("0", "0.5", "0.999999"),
    "--reserve-gib": ("0", "1", "100"),
    "--stage": ("0", "3"),
    "--model": ("gpt2", "llama-7b"),
}
SWITCHES = ("--sp", "--offload-optimizer", "--offload-params", "--lora-dropout", "--no-paging")
SETUP_FLAGS = (
    *(f for f in FLAGS if f not in ("--context", "--weights", "--kv-dtype", "--block")),
    "--sp",
    "--offload-optimizer",
    "--offload-params",
    "--lora-dropout",
)
SETUP_FLAGS = tuple(
    f
    for f in SETUP_FLAGS
    if f not in ("--gpu-util", "--headroom", "--reserve-gib", "--stage", "--model")
)
SERVE_FLAGS = (
    "--batch",
    "--context",
    "--weights",
    "--kv-dtype",
    "--tp",
    "--block",
    "--gpu",
    "--gpu-util",
    "--no-paging",
)
FORMULA_FLAGS = (
    "--model",
    "--stage",
    "--recipe",
    "--optimizer",
    "--impl",
    "--attention",
    "--lora-targets",
    "--quant",
)
ODD = st.sampled_from(
    ["0", "-1", "1.5", "1e400", "nan", "inf", "", " ", "1" + "0" * 40, "9" * 5000, "\n", "a\x00b"]
)
VALUE = st.one_of(ODD, st.text(max_size=12), st.integers(-(2**70), 2**70).map(str))

CONFIG_KEYS = {
    "hidden_size": st.integers(1, 4096),
    "intermediate_size": st.integers(1, 8192),
    "num_hidden_layers": st.integers(1, 64),
    "num_attention_heads": st.sampled_from([1, 2, 4, 8, 12, 32]),
    "num_key_value_heads": st.sampled_from([1, 2, 4, 8, 3]),
    "vocab_size": st.integers(1, 200_000),
    "max_position_embeddings": st.integers(1, 1 << 20),
    "head_dim": st.sampled_from([None, 64, 128]),
    "tie_word_embeddings": st.booleans(),
    "sliding_window": st.sampled_from([None, 4096]),
    "n_embd": st.integers(1, 2048),
    "n_layer": st.integers(1, 48),
    "n_head": st.sampled_from([1, 4, 12, 16]),
    "n_positions": st.integers(1, 4096),
}
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**64), 2**64),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=3),
)


@st.composite
def configs(draw: st.DrawFn) -> str:
    cfg: dict[str, object] = {
        "model_type": draw(st.sampled_from(["llama", "llama", "gpt2", "gpt2", "qwen2", "t5"]))
    }
    for key, values in CONFIG_KEYS.items():
        if draw(st.integers(0, 4)):  # most keys present, most values plausible
            cfg[key] = draw(values if draw(st.integers(0, 14)) else JUNK)
    text = json.dumps(cfg)
    broken = st.sampled_from([text[: len(text) // 2], "[" * 200 + "]" * 200])
    return draw(broken) if draw(st.integers(0, 9)) == 0 else text


@st.composite
def argvs(draw: st.DrawFn, folder: Path) -> list[str]:
    # fit solves four problems per run (seconds): drawn rarely, on small models only
    command = draw(st.sampled_from(["estimate", "serve", "formula"] * 6 + ["fit", "models"]))
    if command == "models":
        return [command]
    if command == "formula":
        argv = [command, draw(st.sampled_from([*FORMULAS, "entropy"]))]
    else:
        pool = SMALL if command == "fit" else [*PRESETS, "gpt-5", "a/b/c", "x" * 300]
        model = draw(st.one_of(st.sampled_from(pool), st.just("config")))
        if model == "config":
            path = folder / f"c{draw(st.integers(0, 10**6))}.json"
            path.write_text(draw(configs()))
            model = str(path)
        argv = [command, model]
        if command == "fit":
            argv += ["--gpu", "A100-80GB"]
    own = {
        "estimate": SETUP_FLAGS,
        "fit": (*SETUP_FLAGS, "--headroom", "--reserve-gib"),
        "serve": SERVE_FLAGS,
        "formula": FORMULA_FLAGS,
    }[command]
    for _ in range(draw(st.integers(0, 4))):
        odd = draw(st.integers(0, 9)) == 0  # now and then a flag or value of the wrong kind
        flag = draw(st.sampled_from(sorted(FLAGS) + list(SWITCHES) if odd else own))
        argv.append(flag)
        if flag in FLAGS:
            odd = draw(st.integers(0, 7)) == 0
            argv.append(draw(VALUE if odd else st.sampled_from(FLAGS[flag])))
    return argv
    return argv


FOLDER = Path(tempfile.mkdtemp(prefix="vrammath-fuzz-"))


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(argvs(FOLDER))
def test_fuzz_cli(argv: list[str]) -> None:
    check_run(argv)
