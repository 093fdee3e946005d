"""The parameter order flat-buffer engines lay out (DeepSpeed ZeRO-1/2's partitions): vrammath's
:func:`~vrammath.terms.parallel.module_order_numels` against transformers' own
``model.parameters()`` for every dense preset and the engine table's small models, built on the
meta device."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch

import vrammath as vm
from vrammath.measure.build import as_spec, build_model
from vrammath.measure.engine_runs import CONFIGS
from vrammath.terms.parallel import module_order_numels

pytestmark = [pytest.mark.measure, pytest.mark.filterwarnings("ignore::UserWarning")]

DENSE = [n for n in vm.model_names() if vm.load_model(n).experts is None]


@pytest.mark.parametrize("name", DENSE + sorted(CONFIGS))
def test_order_is_transformers_own(name: str) -> None:
    spec = as_spec(CONFIGS[name]) if name in CONFIGS else vm.load_model(name)
    # Gemma-2 builds with its eager attention only (soft-capped scores)
    attention = "eager" if spec.attention.softcap is not None else "sdpa"
    with torch.device("meta"):
        net = build_model(spec, precision="bf16", attention=attention)
    assert module_order_numels(spec) == [p.numel() for p in net.parameters()]
