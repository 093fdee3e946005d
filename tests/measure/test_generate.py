"""Measured: transformers' generate() on real CPU tensors against vrammath.serve.generate, exact.

The quick set runs the small decoders (seconds); ``--full`` adds the full-width presets (two
layers each, about a minute). Every row must also equal the committed validation/generate.json.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from vrammath.measure.build import hf_config
from vrammath.measure.generate import CONFIGS, GENERATE_RUNS, PRESET_RUNS, measure_generate
from vrammath.model.presets import load_model
from vrammath.model.readers import from_hf_config
from vrammath.serve.generate import generate_peaks

pytestmark = pytest.mark.measure

COMMITTED = {
    (r["config"], r["batch"], r["prompt"], r["new_tokens"], r["dtype"]): r["measured"]
    for r in json.loads((Path(__file__).parents[2] / "validation" / "generate.json").read_text())[
        "rows"
    ]
}


def _check(config: dict[str, object], name: str, run: tuple[str, int, int, int, str]) -> None:
    _, batch, prompt, new, dtype = run
    measured = measure_generate(config, batch=batch, prompt=prompt, new_tokens=new, dtype=dtype)
    special = measured.pop("special")
    peaks = generate_peaks(
        from_hf_config(config, name=name),
        prompt=prompt,
        new_tokens=new,
        batch=batch,
        dtype=dtype,
        special_tokens=special,
    )
    assert (peaks.prefill_bytes, peaks.decode_bytes) == (measured["prefill"], measured["decode"])
    assert measured == COMMITTED[run]


@pytest.mark.parametrize("run", GENERATE_RUNS, ids=lambda r: "-".join(map(str, r)))
def test_small_decoders(run: tuple[str, int, int, int, str]) -> None:
    _check(CONFIGS[run[0]], run[0], run)


@pytest.mark.parametrize("run", PRESET_RUNS, ids=lambda r: "-".join(map(str, r)))
def test_full_width_presets(
    run: tuple[str, int, int, int, str], request: pytest.FixtureRequest
) -> None:
    if not request.config.getoption("--full"):
        pytest.skip("full-width presets run with --full")
    config = hf_config(replace(load_model(run[0]), layers=2), attention="sdpa").to_diff_dict()
    _check(config, run[0], run)
