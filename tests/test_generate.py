"""transformers' generate() peaks (vrammath.serve.generate): the committed measurement, exact,
where each peak sits, and what is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vrammath.model.presets import load_model
from vrammath.model.readers import from_hf_config
from vrammath.notation.errors import InputError
from vrammath.notation.symbols import T, b, s
from vrammath.serve.generate import decode_points, generate_peaks, prefill_points

DATA = json.loads((Path(__file__).parents[1] / "validation" / "generate.json").read_text())


@pytest.mark.parametrize("row", DATA["rows"], ids=lambda r: f"{r['config']}-{r['prompt']}")
def test_committed_measurement_exact(row: dict[str, Any]) -> None:
    spec = from_hf_config(DATA["configs"][row["config"]], name=row["config"])
    peaks = generate_peaks(
        spec,
        prompt=row["prompt"],
        new_tokens=row["new_tokens"],
        batch=row["batch"],
        dtype=row["dtype"],
        special_tokens=row["special_tokens"],
    )
    measured = row["measured"]
    assert (peaks.prefill_bytes, peaks.decode_bytes) == (measured["prefill"], measured["decode"])
    assert (peaks.prefill_point, peaks.decode_point) == (
        row["vrammath"]["prefill_point"],
        row["vrammath"]["decode_point"],
    )


def test_every_point_is_the_peak_somewhere() -> None:
    # a candidate that never wins in the measured rows would be untested
    points = {r["vrammath"]["prefill_point"] for r in DATA["rows"]}
    points |= {r["vrammath"]["decode_point"] for r in DATA["rows"]}
    assert points - {"none"} == set(prefill_points(load_model("llama-7b"))) | set(
        decode_points(load_model("llama-7b"))
    )


def test_llama_8b_long_prompt() -> None:
    # 4096-token prompt: the prefill peaks in the last layer's MLP (3 x 14336 x 2 B per token
    # plus the 32 layers' cache); the last decode step at its cache update
    peaks = generate_peaks(load_model("llama-3.1-8b"), prompt=4096, new_tokens=256)
    assert (peaks.prefill_point, peaks.decode_point) == ("MLP", "cache update")
    assert peaks.cache_bytes == 4351 * 128 * 1024  # 128 KiB per token, prompt + 255 tokens


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8), st.integers(1, 8192), st.integers(1, 64))
def test_peaks_grow_with_prompt_and_batch(batch: int, prompt: int, new: int) -> None:
    spec = load_model("qwen2-7b")
    base = generate_peaks(spec, prompt=prompt, new_tokens=new, batch=batch)
    longer = generate_peaks(spec, prompt=prompt + 1, new_tokens=new, batch=batch)
    wider = generate_peaks(spec, prompt=prompt, new_tokens=new, batch=batch + 1)
    assert longer.peak_bytes > base.peak_bytes
    assert wider.peak_bytes > base.peak_bytes
    assert base.peak_bytes > base.cache_bytes


def test_batch_scales_all_but_the_scalars() -> None:
    # two sequences hold twice one sequence's bytes, less the two special-token ids (made once)
    # plus the padding check's bool (made for batches of two or more only)
    spec = load_model("llama-7b")
    for points in (prefill_points(spec), decode_points(spec)):
        for expr in points.values():
            one, two = (expr.subs({b: n, s: 100, T: 120}) for n in (1, 2))
            assert two - 2 * one == 1 - 2 * 8


@pytest.mark.parametrize("name", ["qwen3-8b", "gemma-2-9b", "mistral-7b", "mixtral-8x7b", "gpt2"])
def test_refused_by_name(name: str) -> None:
    with pytest.raises(InputError, match="generate\\(\\) peaks are derived for llama"):
        generate_peaks(load_model(name), prompt=8, new_tokens=2)


def test_bad_counts() -> None:
    with pytest.raises(InputError, match="new_tokens"):
        generate_peaks(load_model("llama-7b"), prompt=8, new_tokens=0)
    with pytest.raises(InputError, match="dtype"):
        generate_peaks(load_model("llama-7b"), prompt=8, new_tokens=2, dtype="fp32")
