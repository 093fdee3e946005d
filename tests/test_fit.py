"""fit: every answer under the setup as given, the recommendation apart, text and JSON."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from vrammath.answers.budget import (
    budget,
)
from vrammath.answers.fit import fit
from vrammath.cli import main
from vrammath.compose.estimate import estimate
from vrammath.compose.setup import Setup, with_changes
from vrammath.model.presets import load_model
from vrammath.notation.errors import InputError

TEXT: Any = "A100-80GB"  # text where an object belongs: the API must refuse it


def test_cli_fit(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["fit", "llama-7b", "--gpu", "A100-80GB", "--gpus", "8"])
    out, err = capsys.readouterr()
    assert code == 0
    assert err == ""
    lines = out.splitlines()
    assert "DGX-A100-640GB" in lines[0]  # the A100-80GB's node, for the host side
    assert lines[1].startswith("as given (ZeRO-0, 8 GPU(s), micro-batch 1 x 2048 tokens): ")
    assert "does NOT fit; host: nothing offloaded" in lines[1]
    assert lines[2].startswith("largest micro-batch: none fits")  # ZeRO-0 as given
    assert lines[3].startswith("longest sequence: none fits")
    assert lines[4] == "fewest GPUs: none fits (84.83 GB / 79.00 GiB usable) with ZeRO-0"
    assert re.match(r"recommended: ZeRO-1 on 8 GPU\(s\)", lines[5])
    assert "peak per GPU" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["fit", "llama-7b"], "gpu: must be one of"),
        (["fit", "llama-7b", "--gpu", "A100-80GB", "--headroom", "1.5"], "headroom"),
        (["fit", "llama-7b", "--gpu", "A100-80GB", "--reserve-gib", "x"], "reserve-gib"),
        (["fit", "llama-7b", "--gpu", "B300"], "gpu: must be one of"),
    ],
)
def test_cli_fit_bad_input(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    try:
        code = main(args)
    except SystemExit as exc:  # argparse errors exit directly
        code = int(exc.code or 0)
    _, err = capsys.readouterr()
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_fit_honours_the_given_stage() -> None:
    # the issue's example: ZeRO-3 given, so the answers are ZeRO-3's, not the plan's ZeRO-1
    setup = Setup(load_model("llama-7b"), zero=3, gpus=8, seq_len=4096, gpu="A100-80GB")
    answer = fit(setup)
    limit = budget("A100-80GB").usable
    assert answer.given.setup == setup
    assert answer.plan.label == "ZeRO-1"
    assert answer.batch.value == 2
    assert answer.sequence.value == 11310  # ZeRO-1's answer would be 9590
    for sol, field in ((answer.batch, "micro_batch"), (answer.sequence, "seq_len")):
        assert sol.value is not None
        assert sol.verified
        assert estimate(with_changes(setup, **{field: sol.value})).gpu_bytes <= limit
        assert estimate(with_changes(setup, **{field: sol.value + 1})).gpu_bytes > limit
    assert answer.gpus.value is not None
    assert estimate(with_changes(setup, gpus=answer.gpus.value)).gpu_bytes <= limit


def test_fit_text_and_json_agree() -> None:
    setup = Setup(
        load_model("qwen2-72b"),
        zero=3,
        gpus=8,
        offload_optimizer=True,
        recompute="full",
        gpu="A100-80GB",
    )
    answer = fit(setup, budget("A100-80GB", host_bytes=512 * 2**30))
    assert not answer.fits  # the GPU takes it, the host does not
    assert answer.given.gpu_bytes <= answer.budget.usable
    data = json.loads(json.dumps(answer.as_dict()))
    assert data["given"]["host"]["need_bytes"] == 8 * answer.given.cpu_bytes
    assert data["given"]["host"]["fits"] is False
    assert data["answers"]["largest_micro_batch"]["status"] == "none-fits"
    assert data["recommendation"]["label"] == answer.plan.label
    text = answer.text()
    assert str(answer) == text
    assert "does NOT fit" in text.splitlines()[1]
    assert f"{8 * answer.given.cpu_bytes / 1e9:.2f} GB" in text
    assert text.splitlines()[5].startswith("recommended: ")


def test_fit_bad_input() -> None:
    setup = Setup(load_model("llama-7b"), gpus=8, gpu="A100-80GB")
    with pytest.raises(InputError, match=re.escape("budget: must be a Budget")):
        fit(setup, TEXT)
    with pytest.raises(InputError, match="setup: must be a vrammath.Setup"):
        fit(TEXT)
