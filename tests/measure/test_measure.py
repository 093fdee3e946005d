"""vrammath against memory PyTorch counts: fake tensors on a CPU (``measure``), a CUDA GPU (``gpu``).

Run by ``nox -s measure`` (``pytest -m "measure or gpu" tests/measure``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from vrammath.measure import matrix, measure_training_step  # noqa: E402
from vrammath.measure.build import as_spec, gelu_of  # noqa: E402
from vrammath.model.params import size_values  # noqa: E402
from vrammath.notation.symbols import b, s  # noqa: E402
from vrammath.terms.activations.layer import hf_layer_bytes  # noqa: E402
from vrammath.terms.activations.model import hf_activation_bytes  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

MATRIX = Path(__file__).resolve().parents[2] / "validation" / "matrix.json"


def _act(result: dict[str, Any]) -> int:
    return int(result["steady"]["forward"]["end"]["Activation"])


@pytest.mark.measure
@pytest.mark.parametrize(
    ("precision", "attention", "mib"),
    [
        ("bf16", "eager", 139.00),
        ("bf16", "sdpa", 91.07),
        ("fp32", "eager", 198.00),
        ("fp32", "sdpa", 166.07),
    ],
)
def test_llama_7b_layer_is_exact(precision: str, attention: str, mib: float) -> None:
    """Per-layer bytes (2 layers minus 1) equal hf_layer_bytes to the byte."""
    one, two = (
        measure_training_step(
            "llama-7b",
            batch=1,
            seq=512,
            precision=precision,
            attention=attention,
            layers=n,
            steps=1,
        )
        for n in (1, 2)
    )
    measured = _act(two) - _act(one)
    spec = as_spec("llama-7b")
    assert measured == hf_layer_bytes(spec, attention, precision).subs(  # type: ignore[arg-type]
        {**size_values(spec), b: 1, s: 512}
    )
    assert round(measured / 2**20, 2) == mib


@pytest.mark.measure
@pytest.mark.parametrize("config", ["small-gqa", "small-tied-mqa", "gpt-tanh"])
@pytest.mark.parametrize("precision", ["bf16", "fp32", "autocast-bf16"])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_small_models_activations_are_exact(config: str, precision: str, recompute: str) -> None:
    cfg = matrix.CONFIGS[config]
    spec = as_spec(cfg)
    if spec.model_type == "gpt2" and precision.startswith("autocast"):
        pytest.skip("autocast is not derived for GPT-2")
    attention = "eager"
    result = measure_training_step(
        cfg, batch=3, seq=40, precision=precision, attention=attention, recompute=recompute, steps=1
    )
    est = hf_activation_bytes(
        spec,
        attention,
        precision,
        recompute,  # type: ignore[arg-type]
        gelu=gelu_of(cfg),
        device="cpu",
    )
    assert _act(result) == est.subs({**size_values(spec), b: 3, s: 40})


@pytest.mark.measure
def test_quick_rows_reproduce_the_committed_matrix() -> None:
    """Regenerate the quick rows and diff them against validation/matrix.json."""
    committed = json.loads(MATRIX.read_text(encoding="utf-8"))
    rows = [r for r in matrix.ROWS if r["quick"]][:4]
    fresh = {"rows": matrix.run_rows(rows)}
    assert matrix.diff(fresh, {"rows": [r for r in committed["rows"] if r["quick"]]}) == []


@pytest.mark.measure
def test_committed_matrix_meets_the_exact_targets() -> None:
    data = json.loads(MATRIX.read_text(encoding="utf-8"))
    assert data["versions"]["torch"].startswith("2.13.0")
    for row in data["rows"]:
        assert "error" not in row, row["id"]
        for name in ("parameters", "gradients", "optimizer", "activations"):
            comp = row["components"][name]
            if not comp["pass"]:
                assert comp.get("explanation"), (row["id"], name)
        for comp in row["components"].values():
            assert comp["pass"] or comp.get("explanation")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_allocator_counts_the_same_states() -> None:
    """On a GPU: parameters, gradients and AdamW states from the CUDA path equal vrammath's."""
    cfg = matrix.CONFIGS["small-gqa"]
    row = dict(matrix.ROWS[0])
    result = measure_training_step(
        cfg,
        batch=row["batch"],
        seq=row["seq"],
        precision="bf16",
        attention="sdpa",
        implementation="fused",
        device="cuda",
    )
    est = matrix.estimate_row({**row, "implementation": "fused"})
    st = result["steady"]
    assert st["start"]["Parameter"] == est["parameters"]
    assert st["backward"]["end"]["Gradient"] == est["gradients"]
    # fused AdamW keeps its step counters on the device
    assert st["start"]["Optstate"] == est["optimizer"]
    assert st["forward"]["peak"]["Total"] > st["start"]["Total"]
