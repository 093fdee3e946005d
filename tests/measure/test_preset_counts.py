"""Every dense preset's parameter count equals transformers' own count of the same config.

The model is built by transformers from the preset's raw ``config.json`` (``AutoConfig`` and
``AutoModelForCausalLM`` on the meta device: no weights, no ModelSpec in between) and its
parameters counted with ``numel``; vrammath's :func:`~vrammath.model.params.param_count` of the
preset must equal it exactly. Mixture-of-experts presets are left to ``test_moe.py``. Run by
``nox -s measure``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from vrammath.model.params import param_count  # noqa: E402
from vrammath.model.presets import load_model, model_names, raw_config  # noqa: E402

pytestmark = [
    pytest.mark.measure,
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

MOE = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")
DENSE = [n for n in model_names() if raw_config(n).get("model_type") not in MOE]


def _transformers_count(cfg: dict[str, object]) -> int:
    fields = {k: v for k, v in cfg.items() if k != "model_type"}
    config = transformers.AutoConfig.for_model(str(cfg["model_type"]), **fields)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def test_the_dense_presets_are_all_here() -> None:
    """The issue's list, and none of them taken for a mixture of experts."""
    named = {"llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen2.5-7b", "qwen2.5-72b"}
    assert named | {"mistral-7b-v0.3", "phi-4", "gpt-neox-20b"} <= set(DENSE)
    assert len(DENSE) == len(model_names()) - 5


@pytest.mark.parametrize("name", DENSE)
def test_preset_count_equals_transformers(name: str) -> None:
    assert param_count(load_model(name)) == _transformers_count(raw_config(name))
