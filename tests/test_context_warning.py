"""Past the positions a model is configured for, every answer says so (vrammath.ContextWarning),
and the CLI adds the library's line to its own warnings."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable

import pytest

import vrammath as vm
from vrammath.cli import main

LLAMA = vm.load_model("llama-7b")  # max_position_embeddings 2048


def said(call: Callable[[], object]) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [str(w.message) for w in caught if issubclass(w.category, vm.ContextWarning)]


def test_estimate_warns_past_the_positions_only() -> None:
    assert said(lambda: vm.estimate(vm.Setup(LLAMA, seq_len=2048))) == []
    assert said(lambda: vm.estimate(vm.Setup(LLAMA, seq_len=2049))) == [
        "llama-7b: seq_len 2049 exceeds the model's max_position_embeddings (2048)"
    ]


def test_serve_and_its_longest_context_warn() -> None:
    est = vm.serve(vm.Serve(LLAMA, context=2048, gpu="A100-80GB"))
    longest = est.max_context()
    assert longest is not None
    assert longest > 2048
    assert said(est.max_context) == [
        f"llama-7b: max_context {longest} exceeds the model's max_position_embeddings (2048)"
    ]
    assert said(lambda: est.max_context(limit=2048)) == []  # capped at the positions
    assert est.max_context(limit=2048) == 2048
    assert said(lambda: vm.serve(vm.Serve(LLAMA, context=4096))) == [
        "llama-7b: context 4096 exceeds the model's max_position_embeddings (2048)"
    ]


def test_longest_sequence_past_the_positions_warns() -> None:
    est = vm.estimate(vm.Setup(LLAMA, zero=3, gpus=8, gpu="A100-80GB"))
    sol = vm.longest_sequence(est)
    assert sol.value is not None
    assert sol.value > 2048
    assert said(lambda: vm.longest_sequence(est)) == [
        f"llama-7b: longest_sequence {sol.value} exceeds the model's max_position_embeddings (2048)"
    ]


def test_the_cli_adds_the_library_line_once(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["fit", "llama-7b", "--zero", "3", "--gpus", "8", "--gpu", "A100-80GB", "--json"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    n = data["answers"]["longest_sequence"]["value"]
    line = f"longest_sequence {n} exceeds the model's max_position_embeddings (2048)"
    assert data["warnings"] == [line]
    assert err.strip().splitlines() == [f"vrammath: warning: {line}"]
