"""vLLM's KV-cache layout: groups of sliding and full layers, what it prints from its memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vrammath import Serve, Vllm, load_model, vllm_budget
from vrammath.cli import main
from vrammath.serve.logs import layout_check
from vrammath.serve.vllm_layout import group_size, kv_layout

ROOT = Path(__file__).resolve().parents[1]
GEMMA3 = load_model("gemma-3-27b-text")


def test_groups_of_the_published_hybrid_models() -> None:
    """Gemma-2-9B alternates 21 sliding and 21 full layers: two groups of 21, no padding.
    Gemma-3-27B has 52 sliding and 10 full: groups of 10, six sliding ones (8 padding layers)."""
    g2 = kv_layout(load_model("gemma-2-9b"), "bf16", tp=1, block=16, windowed=True)
    assert (g2.group_size, g2.full_groups, g2.window_groups) == (21, 1, 1)
    assert g2.padding_lines() == []
    g3 = kv_layout(GEMMA3, "bf16", tp=1, block=16, windowed=True)
    assert (g3.group_size, g3.full_groups, g3.window_groups) == (10, 1, 6)
    assert group_size((12, 13)) == 13  # gpt-oss-20b with a drafter layer: padded to 13 each
    flat = kv_layout(GEMMA3, "bf16", tp=1, block=16, windowed=False)
    assert (flat.groups, flat.full_layers, flat.window_layers) == (1, 62, 0)


def test_the_gemma_3_log_to_the_token_and_block() -> None:
    """vLLM 0.11 printed 109.86 GiB, 205,696 tokens, 50.05x at 4,096 tokens, and 89,994 blocks."""
    row = next(
        r
        for r in json.loads((ROOT / "validation" / "serving-logs.json").read_text())["rows"]
        if r["id"] == "gemma-3-27b-rocm"
    )
    check = layout_check(row)
    assert check is not None
    assert check.tokens_hold
    assert check.concurrency_holds
    lay = kv_layout(GEMMA3, "bf16", tp=1, block=16, windowed=True)
    lo, hi = (lay.num_blocks(int((109.86 + d) * 2**30)) for d in (-0.005, 0.005))
    assert lo <= 89994 <= hi


def test_every_published_layout_holds() -> None:
    rows = json.loads((ROOT / "validation" / "serving-logs.json").read_text())["rows"]
    checks = [c for c in (layout_check(r) for r in rows) if c is not None]
    assert len(checks) >= 15
    assert all(c.tokens_hold for c in checks)
    printed = [c for c in checks if c.concurrency_holds is not None]
    assert len(printed) >= 15
    assert all(c.concurrency_holds for c in printed)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["llama-3.1-8b", "qwen2-7b", "gemma-2-9b", "gemma-3-27b-text", "mistral-7b"]),
    st.integers(1, 200).map(lambda g: g * 2**28),
    st.integers(1, 200_000),
    st.sampled_from([2048, 8192]),
)
def test_layout_properties(name: str, available: int, max_len: int, step: int) -> None:
    """One group counts every layer's page (V0's rule); the longest length that starts is the
    last whose layer-by-layer needs fit; a request never needs more than whole full layers."""
    spec = load_model(name)
    lay = kv_layout(spec, "bf16", tp=1, block=16, windowed=True)
    if lay.groups == 1 and lay.window is None:
        assert lay.tokens(available) == available // (lay.page_bytes * spec.layers) * 16
    best = lay.largest_len(available, step, 1 << 22)
    assert best == 0 or lay.needed_bytes(best, step) <= available
    assert best == 1 << 22 or lay.needed_bytes(best + 1, step) > available
    full = kv_layout(spec, "bf16", tp=1, block=16, windowed=False)
    assert lay.needed_bytes(max_len, step) <= full.needed_bytes(max_len, step) + spec.layers * (
        2 * lay.page_bytes
    )


def test_budget_and_cli_for_a_hybrid_model(capsys: pytest.CaptureFixture[str]) -> None:
    setup = Serve(GEMMA3, gpu="H100-80GB")
    hybrid = vllm_budget(setup, Vllm(max_model_len=32768))
    flat = vllm_budget(setup, Vllm(max_model_len=32768, disable_hybrid_kv_cache_manager=True))
    assert hybrid.layout.groups == 7
    assert flat.layout.groups == 1
    # a sliding group holds the window and one step: 1,024 + 8,192 tokens, not 32,768
    assert hybrid.max_concurrency > 2 * flat.max_concurrency
    assert hybrid.starts
    assert hybrid.layout.needed_bytes(hybrid.largest_max_model_len, 8192) <= hybrid.available_bytes
    argv = ["serve", "gemma-3-27b-text", "--engine", "vllm", "--gpu", "H100-80GB"]
    assert main([*argv, "--max-model-len", "32768"]) == 0
    out = capsys.readouterr().out
    assert "Add 8 padding layers, may waste at most 15.38% KV cache memory" in out
    assert f"GPU KV cache size: {hybrid.kv_tokens:,} tokens" in out
    assert main([*argv, "--v0", "--vllm-version", "0.10.0"]) == 2
    assert "V0 engine" in capsys.readouterr().err
