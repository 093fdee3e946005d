"""Budgets: GPU capacity less headroom and reserve; node presets for the host side; exact evaluation."""

from __future__ import annotations

import math
from typing import Any

import pytest

from vrammath.answers.budget import (
    DEFAULT_RESERVE_BYTES,
    Budget,
    branches,
    budget,
    exact_bytes,
    host_check,
    load_nodes,
    node_preset,
)
from vrammath.compose.estimate import estimate
from vrammath.compose.setup import Setup
from vrammath.model.presets import gpu, load_gpus, load_model
from vrammath.notation.errors import InputError
from vrammath.notation.symbols import P

TEXT: Any = "A100-80GB"  # text where an object belongs: the API must refuse it
NOT_A_NAME: Any = None


def test_budget() -> None:
    bud = budget("A100-80GB", headroom=0.1)
    assert bud.usable == math.floor(gpu("A100-80GB").bytes * 0.9) - DEFAULT_RESERVE_BYTES
    assert Budget(10**9, reserve_bytes=0).usable == 10**9
    with pytest.raises(InputError, match=r"headroom: must be a fraction in \[0, 1\)"):
        Budget(10**9, headroom=1.0)
    with pytest.raises(InputError, match="reserve_bytes"):
        Budget(10**9, reserve_bytes=-1)
    with pytest.raises(InputError, match="gpu: must be one of"):
        budget("B200")

    with pytest.raises(
        InputError, match="reserve_bytes: must leave part of the GPU's 85899345920 bytes"
    ):
        budget("A100-80GB", reserve_bytes=100 * 2**30)
    with pytest.raises(InputError, match="device: must be a GPU preset name"):
        budget(NOT_A_NAME)


def test_node_presets() -> None:
    nodes = load_nodes()
    assert {n.gpu for n in nodes.values()} <= set(load_gpus())
    assert node_preset("DGX-A100-640GB").host_bytes == 32 * 64 * 2**30  # 2 TB = 32 x 64 GiB
    assert node_preset("DGX-A100-320GB").host_bytes == 16 * 64 * 2**30
    assert node_preset("DGX-H100").host_bytes == node_preset("DGX-H200").host_bytes == 2**41
    assert all(n.gpus == 8 and n.source for n in nodes.values())
    bud = budget("H100-80GB")
    assert (bud.node, bud.host_bytes, bud.gpus_per_node) == ("DGX-H100", 2**41, 8)
    assert budget("RTX-4090-24GB").host_bytes is None
    own = budget("H100-80GB", host_bytes=10**12, gpus_per_node=4)
    assert (own.node, own.host_bytes, own.gpus_per_node) == (None, 10**12, 4)
    with pytest.raises(InputError, match="node: holds A100-80GB, not H100-80GB"):
        budget("H100-80GB", node="DGX-A100-640GB")
    with pytest.raises(InputError, match="node: must be one of DGX-A100-320GB"):
        budget("H100-80GB", node="DGX-1")
    with pytest.raises(InputError, match="gpus_per_node: must be a positive integer"):
        Budget(10**10, host_bytes=10**12, gpus_per_node=0)


def test_host_check_counts_ranks_per_node() -> None:
    spec = load_model("llama-7b")
    bud = budget("A100-80GB", host_bytes=10**12)
    one = host_check(estimate(Setup(spec, zero=2, gpus=2, offload_optimizer=True)), bud)
    many = host_check(estimate(Setup(spec, zero=2, gpus=32, offload_optimizer=True)), bud)
    assert one.ranks_per_node == 2
    assert many.ranks_per_node == 8
    assert one.need == 2 * one.per_rank
    assert many.need == 8 * many.per_rank
    assert one.fits is True
    none = host_check(estimate(Setup(spec, zero=2, gpus=2)), bud)
    assert none.per_rank == 0
    assert str(none) == "host: nothing offloaded"


def test_text_is_never_parsed() -> None:
    with pytest.raises(InputError, match="expr: must be a sympy expression"):
        branches(TEXT)
    with pytest.raises(InputError, match="terms: must be a sympy expression"):
        exact_bytes([TEXT], {P: 1})
    assert exact_bytes([2 * P, 3], {P: 5}) == 13
