"""vrammath.browser, what the handbook's pages run in the browser: the CLI on a command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from vrammath.answers.report import estimate_dict
from vrammath.browser import COMMANDS, argv_for, call, component_tex, page_data, rpc, run
from vrammath.cli import build_parser
from vrammath.compose.estimate import estimate
from vrammath.compose.setup import Setup
from vrammath.model.presets import load_model
from vrammath.notation.errors import InputError

SETUPS = [
    ("estimate", {"model": "llama-7b", "zero": 3, "gpus": 8, "gpu": "a100-80gb"}),
    (
        "estimate",
        {
            "model": "llama-2-7b",
            "lora_rank": 16,
            "lora_targets": ["q", "k", "v", "o"],
            "quant": "nf4",
        },
    ),
    ("estimate", {"model": "mixtral-8x7b", "ep": 8, "gpus": 8, "zero": 1}),
    (
        "estimate",
        {"model": "gpt-175b", "tp": 8, "pp": 8, "sp": True, "recompute": "selective", "gpus": 64},
    ),
    ("fit", {"model": "llama-7b", "gpu": "a100-80gb", "headroom": 0.1}),
    ("serve", {"model": "llama-2-7b", "block": None, "gpu": "a100-80gb", "weights": "int4"}),
]


@pytest.mark.parametrize(("command", "setup"), SETUPS)
def test_the_json_setup_round_trips(command: str, setup: dict[str, object]) -> None:
    """argv_for(the `setup` the CLI printed) is a command line that prints the same bytes."""
    first = call(command, setup)
    assert first["rc"] == 0, first["stderr"]
    printed = (
        first["json"]["given"]["estimate"]["setup"] if command == "fit" else first["json"]["setup"]
    )
    again = call(
        command,
        {"model": setup["model"], **printed, **({"headroom": 0.1} if command == "fit" else {})},
    )
    assert again["stdout"] == first["stdout"]


def test_run_is_the_cli_process() -> None:
    argv = argv_for("estimate", {"model": "llama-7b", "micro_batch": 4, "gpu": "h100-80gb"})
    proc = subprocess.run(
        [sys.executable, "-m", "vrammath", *argv, "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run([*argv, "--json"]) == {
        "rc": proc.returncode,
        "stdout": proc.stdout,
        "stderr": proc.stderr,
    }


def test_run_reports_the_cli_refusal() -> None:
    got = run(["estimate", "llama-7b", "--batch", "0"])
    assert got["rc"] == 2
    assert got["stdout"] == ""
    assert got["stderr"].startswith("vrammath: error: argument --batch/-b: batch:")


@pytest.mark.parametrize(
    ("command", "setup", "field"),
    [
        ("estimate", {"model": "llama-7b", "context": 4096}, "context"),
        ("serve", {"model": "llama-7b", "zero": 3}, "zero"),
        ("estimate", {"model": "llama-7b", "micro_batch": None}, "micro_batch"),
        ("estimate", {"model": "llama-7b", "sp": "yes"}, "sp"),
        ("estimate", {"zero": 3}, "model"),
        ("plan", {"model": "llama-7b"}, "command"),
    ],
)
def test_a_setup_without_a_command_line_is_refused_by_name(
    command: str, setup: dict[str, object], field: str
) -> None:
    got = call(command, setup)
    assert got["rc"] == 2
    assert got["json"] is None
    assert got["error"].startswith(f"vrammath: error: {field}:")


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(min_value=1, max_value=64),
    seq=st.sampled_from([1, 512, 2048, 4096]),
    zero=st.sampled_from([0, 1, 2, 3]),
    gpus=st.sampled_from([1, 8, 64]),
    recompute=st.sampled_from(["none", "full"]),
)
def test_call_answers_as_the_library(
    batch: int, seq: int, zero: int, gpus: int, recompute: str
) -> None:
    """The bytes the page shows are estimate()'s."""
    setup = {
        "model": "llama-7b",
        "micro_batch": batch,
        "seq_len": seq,
        "zero": zero,
        "gpus": gpus,
        "recompute": recompute,
    }
    got = call("estimate", setup)
    want = estimate(
        Setup(load_model("llama-7b"), **{k: v for k, v in setup.items() if k != "model"})
    )
    assert got["rc"] == 0
    assert got["json"]["totals"] == estimate_dict(want)["totals"]
    assert {c["key"]: c["bytes"] for c in got["json"]["components"]} == {
        c.key: c.bytes for c in want.components
    }


def test_component_tex_is_each_expression_in_latex() -> None:
    argv = argv_for("estimate", {"model": "llama-7b", "zero": 3, "gpus": 8})
    est = estimate(Setup(load_model("llama-7b"), zero=3, gpus=8))
    tex = component_tex(argv)
    assert tex == {c.key: sympy.latex(c.expr) for c in est.components if c.expr is not None}
    assert component_tex(["estimate", "llama-7b", "--zero", "9"]) == {}
    assert component_tex(["serve", "llama-7b"]) == {}


def test_page_data_is_the_parser_flags() -> None:
    """Every form field is a flag of its command, with the parser's default."""
    data = page_data()
    assert set(data["forms"]) == set(COMMANDS)
    sub = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for command, fields in data["forms"].items():
        parser = sub["serve" if command in ("hf", "vllm", "sglang") else command]
        actions = {a.option_strings[0]: a for a in parser._actions if a.option_strings}
        for f in fields:
            assert f["flag"] in actions, (command, f["flag"])
            default = actions[f["flag"]].default
            want = list(default) if isinstance(default, tuple) else default
            if f["name"] not in ("lora_targets", "block", "gpu_util", "kv_dtype"):  # "not typed"
                assert f["default"] == want, (command, f["name"])
    assert "llama-7b" in data["models"]
    assert json.loads(json.dumps(data)) == data


def test_the_worker_entry_answers_what_the_functions_answer() -> None:
    """The worker's one entry (``rpc``) is the three functions, through JSON, and nothing else."""
    setup = {"model": "llama-7b", "zero": 3, "gpus": 8}
    assert json.loads(rpc("call", json.dumps(["estimate", setup]))) == call("estimate", setup)
    argv = argv_for("estimate", setup)
    assert json.loads(rpc("tex", json.dumps([argv]))) == component_tex(argv)
    assert json.loads(rpc("run", json.dumps([argv]))) == run(argv)
    with pytest.raises(InputError, match="op: must be one of call, tex, run"):
        rpc("eval", json.dumps(["1 + 1"]))


def test_engine_tabs_run_serve_under_their_engine() -> None:
    """The vLLM and SGLang tabs are ``serve --engine X``: the page's heads and argv_for agree."""
    data = page_data()
    for tab in ("vllm", "sglang"):
        head = data["heads"][tab]
        argv = argv_for(tab, {"model": "llama-3.1-8b", "gpu": "H100-80GB"})
        assert argv[:1] + argv[2 : len(head) + 1] == head
        assert call(tab, {"model": "llama-3.1-8b", "gpu": "H100-80GB"})["rc"] == 0
