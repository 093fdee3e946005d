"""The cheapest plan: the first candidate that fits, GPU and host, every cheaper one shown not to."""

from __future__ import annotations

import re
from typing import Any

import pytest

from vrammath.answers.budget import (
    budget,
)
from vrammath.answers.plan import candidates, cheapest_fit, plan_cost
from vrammath.compose.estimate import estimate
from vrammath.compose.setup import Setup
from vrammath.model.presets import load_model
from vrammath.notation.errors import InputError

TEXT: Any = "A100-80GB"  # text where an object belongs: the API must refuse it


@pytest.mark.parametrize("model", ["llama-7b", "llama-2-70b", "qwen2-72b"])
@pytest.mark.parametrize("card", ["A100-40GB", "A100-80GB"])
def test_cheapest_fit_is_first_that_fits(model: str, card: str) -> None:
    setup = Setup(load_model(model), gpus=8, gpu=card)
    plan = cheapest_fit(setup)
    limit = budget(card).usable
    assert all(not t.fits for t in plan.tried[:-1])
    costs = [t.cost for t in plan.tried]
    assert costs == sorted(costs)
    if plan.setup is None:
        assert not plan.tried[-1].fits
        return
    assert plan.estimate is not None
    assert estimate(plan.setup).gpu_bytes == plan.estimate.gpu_bytes <= limit
    assert plan.tried[-1].fits
    for cand in candidates(setup):
        if plan_cost(cand) < plan_cost(plan.setup):
            assert estimate(cand).gpu_bytes > limit


def test_cheapest_fit_ladder() -> None:
    # the 7B model at 8 GPUs: ZeRO-0 (16P + foreach temporaries) misses an A100-80GB, ZeRO-1 fits
    plan = cheapest_fit(Setup(load_model("llama-7b"), gpus=8, gpu="A100-80GB"))
    assert plan.label == "ZeRO-1"
    assert [t.label for t in plan.tried] == ["ZeRO-0", "ZeRO-1"]
    big = cheapest_fit(Setup(load_model("qwen2-72b"), gpus=8, gpu="A100-80GB"))
    assert big.setup is not None
    assert big.setup.zero == 3


def test_offload_plans_check_the_host() -> None:
    setup = Setup(load_model("qwen2-72b"), gpus=8, seq_len=4096, gpu="A100-80GB")
    roomy = cheapest_fit(setup)  # default host: the DGX A100 640GB (2 TiB)
    assert roomy.setup is not None
    assert roomy.estimate is not None
    assert roomy.host is not None
    assert roomy.setup.offload_optimizer
    assert roomy.host.need == 8 * roomy.estimate.cpu_bytes <= 2 * 2**40
    assert roomy.host.fits is True
    small = cheapest_fit(setup, budget("A100-80GB", host_bytes=512 * 2**30))
    refused = [t for t in small.tried if t.host_fits is False]
    assert refused  # offload candidates the GPU takes but the host cannot
    assert all(not t.fits and t.host_bytes > 512 * 2**30 for t in refused)
    assert small.label != roomy.label


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"stages": [7]}, "stages: must be a non-empty selection of 0, 1, 2, 3"),
        ({"stages": []}, "stages: must be a non-empty selection"),
        ({"recompute": ["some"]}, "recompute: must be a non-empty selection of none"),
        ({"offload": "yes"}, "offload: must be True or False"),
        ({"cost": 5}, "cost: must be a function"),
    ],
)
def test_cheapest_fit_bad_input(kwargs: dict[str, Any], message: str) -> None:
    setup = Setup(load_model("gpt2"), gpu="A100-80GB")
    with pytest.raises(InputError, match=re.escape(message)):
        cheapest_fit(setup, **kwargs)
    with pytest.raises(InputError, match="budget: must be a Budget"):
        cheapest_fit(setup, TEXT)
