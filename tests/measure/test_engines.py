"""Real engines (Megatron's fp32-master optimizer, ZeroRedundancyOptimizer, FSDP2) on 8 fake ranks.

Quick rows only (the 2-layer ``tiny-llama``, about a second each); ``validation/engines.json``
holds the full document (``python -m vrammath.measure.engines``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from vrammath.measure import deepspeed_runs, engines
from vrammath.measure.build import as_spec
from vrammath.measure.ddp_runs import measure_ddp
from vrammath.model.params import param_count
from vrammath.notation.errors import InputError

pytestmark = [
    pytest.mark.measure,
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

TINY = engines.TINY_LLAMA
P = param_count(as_spec(TINY))
N = 8
SLACK = 1024  # the loss, AdamW's step counters, the buffers: under 1 KiB on this model
COMMITTED = Path(__file__).resolve().parents[2] / "validation" / "engines.json"


def _run(
    engine: str, rank: int = 0, **kw: Any
) -> tuple[dict[str, Any], dict[str, int], dict[str, int]]:
    if engine.startswith("deepspeed"):  # real CPU tensors, its own runner
        shape = {"batch": 1, "seq": 256, "attention": "sdpa", "ranks": N, "rank": rank}
        result = deepspeed_runs.measure_deepspeed_row(engine, as_spec(TINY), **shape)
    else:
        result = engines.measure_engine(engine, TINY, batch=1, seq=256, rank=rank, **kw)
    est = engines.estimate_engine(
        engine, TINY, batch=1, seq=256, attention="sdpa", ranks=N, rank=rank
    )
    return result, engines.measured_engine(result, engine), est


def test_tiny_model_shards_without_padding() -> None:
    assert P == 2_524_416
    assert P % N == 0


def test_megatron_copy_states_exact_and_fp32_gradients_in_step() -> None:
    result, meas, est = _run("megatron-copy")
    states = result["steady"]["states"]
    assert states["parameters"] == (2 + 4) * P  # bf16 weights + fp32 masters
    assert states["gradients"] == 2 * P  # bf16, before the step copies them
    assert states["optimizer"] == 8 * P
    for key in ("parameters", "gradients", "optimizer", "states"):
        assert meas[key] == est[key]
    # the step holds fp32 gradients (4 B/param) for the bf16 ones it frees: master_grad_copies
    assert 0 <= meas["step_peak"] - est["step_peak"] < SLACK
    assert abs(meas["backward_peak"] - est["backward_peak"]) / est["backward_peak"] < 0.01


def test_megatron_main_grad_buffer_is_persistent() -> None:
    result, meas, est = _run("megatron-main-grad")  # --engine megatron, bf16-megatron
    assert result["steady"]["states"]["gradients"] == 4 * P
    assert meas["states"] == est["states"] == 18 * P
    # the fp32 buffer is there from construction: in the forward too, as --engine megatron has it
    assert 0 <= meas["forward_peak"] - est["forward_peak"] < SLACK
    assert abs(meas["step_peak"] - est["step_peak"]) < SLACK  # .float() of fp32: an alias
    assert abs(meas["backward_peak"] - est["backward_peak"]) / est["backward_peak"] < 0.01


def test_megatron_bf16_buffer_is_copied_to_fp32_in_the_step() -> None:
    result, meas, est = _run("megatron-bf16-grad")  # --engine megatron, bf16-mixed
    assert result["steady"]["states"]["gradients"] == 2 * P
    assert meas["states"] == est["states"] == 16 * P
    assert 0 <= meas["forward_peak"] - est["forward_peak"] < SLACK
    # the step's main_grad.float() beside the bf16 buffer: 4 bytes/param, as the copies row has
    assert 0 <= meas["step_peak"] - est["step_peak"] < SLACK


def test_zero_redundancy_optimizer_shards_whole_tensors() -> None:
    result, meas, est = _run("zero1-zro")
    part = result["zro_partition_numel"]
    assert sum(part) == P
    assert len(part) == N
    assert part[0] == TINY["vocab_size"] * TINY["hidden_size"]  # the embedding, alone
    assert meas["optimizer"] == est["optimizer"] == 8 * part[0]  # --engine zero1-torch
    assert meas["parameters"] == est["parameters"] == 4 * P
    assert meas["gradients"] == est["gradients"] == 4 * P
    for key in ("forward_peak", "backward_peak", "step_peak", "first_peak"):
        assert abs(meas[key] - est[key]) / meas[key] < 0.01, key


def test_zero_redundancy_optimizer_last_rank() -> None:
    result, meas, est = _run("zero1-zro", rank=N - 1)
    last = result["zro_partition_numel"][N - 1]
    assert last < P // N  # the embedding's rank is the busiest; the last holds less
    assert meas["optimizer"] == est["optimizer"] == 8 * last
    assert abs(meas["step_peak"] - est["step_peak"]) < SLACK


@pytest.mark.parametrize("engine", ["ddp", "ddp-view"])
def test_ddp_buckets_resident_from_construction(engine: str) -> None:
    row = engines.run_row(
        {
            "id": engine,
            "engine": engine,
            "model": "tiny-llama",
            "batch": 1,
            "seq": 256,
            "attention": "sdpa",
            "ranks": N,
            "rank": 0,
            **engines.ENGINES[engine],
        }
    )
    assert row["pass"], row["components"]
    start = measure_ddp(engine, as_spec(TINY), batch=1, seq=256, attention="sdpa", ranks=N)
    # the bf16 weights and the buckets (2 bytes per parameter each) exist before any forward
    assert 0 <= start["first"]["start"]["Total"] - 4 * P < SLACK


def test_fsdp_zero3_mixed_precision_states() -> None:
    result, meas, est = _run("zero3-fsdp")
    assert meas["parameters"] == meas["gradients"] == 4 * P // N  # fp32 shards
    assert est["parameters"] == est["gradients"] == 4 * P // N  # --engine fsdp2's split
    assert meas["optimizer"] == est["optimizer"] == 8 * P // N
    assert meas["states"] == est["states"] == 16 * P // N
    for key in ("forward_peak", "backward_peak", "step_peak", "first_peak"):
        assert abs(meas[key] - est[key]) / meas[key] < 0.01, key
    # the first step is not inflated by DTensor propagation (the warm-up ran)
    assert result["first"]["step"]["peak"]["Total"] == result["steady"]["step"]["peak"]["Total"]


def test_fsdp_zero2_keeps_the_unsharded_weights_until_backward_ends() -> None:
    result, meas, _ = _run("zero2-fsdp")
    fwd = result["steady"]["forward"]["peak"]
    assert fwd["Unsharded Param"] == 2 * P  # every layer's bf16 weights
    assert meas["gradients"] == 4 * P // N
    assert "Unsharded Param" not in result["steady"]["step"]["peak"] or (
        result["steady"]["step"]["peak"]["Unsharded Param"] == 0
    )


def test_fsdp_offload_host_bytes() -> None:
    _, meas, est = _run("offload-fsdp")
    assert meas["host"] == est["host"] == 16 * P // N  # one fp32 shard is weights and master


def test_loop_keeping_outputs_costs_the_logits() -> None:
    row = engines.run_loop_row(
        {"id": "t", "model": "tiny-llama", "batch": 1, "seq": 256, "quick": True}
    )
    logits = 1 * 256 * TINY["vocab_size"] * 2
    assert row["logits_bytes"] == logits
    steady = row["iterations"]["steady"]
    assert steady["backward"]["peak_difference"] == logits
    # after backward the output also keeps the fp32 loss scalar
    assert steady["step"]["end_difference"] == logits + 4
    # the previous output lives through the next forward: the plain loop rebinds it afterwards
    assert steady["forward"]["peak_difference"] == logits + 4
    assert row["iterations"]["first"]["forward"]["peak_difference"] == 0


def test_bad_engine_and_loop() -> None:
    with pytest.raises(InputError, match="engine"):
        engines.measure_engine("deepspeed", TINY)
    with pytest.raises(InputError, match="loop"):
        engines.measure_engine("plain-bf16", TINY, loop="trainer")


def test_committed_document_explains_every_failure() -> None:
    doc = json.loads(COMMITTED.read_text(encoding="utf-8"))
    assert {r["id"] for r in doc["rows"]} == {r["id"] for r in engines.ROWS}
    for row in doc["rows"]:
        assert "error" not in row, row["id"]
        for name, comp in row["components"].items():
            if not comp["pass"]:
                assert comp["explanation"] != "not yet explained", (row["id"], name)
    assert engines.explain("plain-bf16", "forward_peak") == "not yet explained"


def test_deepspeed_zero3_gathering_keys_replayed() -> None:
    # stage 3 with its gathering keys small against the model: what the coordinator keeps
    # gathered at the loss and at the backward's start follows the replay of its trace
    pytest.importorskip("deepspeed")
    _, meas, est = _run("deepspeed-zero3-live")
    part = P // N  # every tensor divides by 8 on the tiny model
    assert meas["parameters"] == est["parameters"] == 6 * part  # bf16 + fp32 partitions
    assert meas["gradients"] == est["gradients"] == 2 * part  # the partitions' flat buffer
    for phase in ("forward_peak", "backward_peak", "step_peak"):
        # besides the loop's small tensors, DeepSpeed's own bookkeeping: about 2 KiB
        assert abs(meas[phase] - est[phase]) < 3 * SLACK, phase


def test_deepspeed_zero2_states_and_bucket() -> None:
    pytest.importorskip("deepspeed")
    result, meas, est = _run("deepspeed-zero2")
    assert meas["parameters"] == est["parameters"] == 2 * P + 4 * P // N  # bf16 flat + fp32 shard
    assert meas["optimizer"] == est["optimizer"] == 8 * P // N
    # the gradient bucket: reduce_bucket_size = 5e8 elements in bf16, allocated in backward
    temp = result["steady"]["backward"]["peak"]["Temp"]
    assert 10**9 <= temp < 10**9 + 2 * P
    assert abs(meas["forward_peak"] - est["forward_peak"]) < SLACK
    # --engine deepspeed: rank 0 keeps the whole embedding's gradient (524,288 > P/N elements)
    assert meas["gradients"] == est["gradients"] == 2 * 2048 * 256
    # the step's peak is the fp64 norm of its one slice (the partition lies in the embedding)
    assert abs(meas["step_peak"] - est["step_peak"]) < SLACK
    assert abs(meas["backward_peak"] - est["backward_peak"]) < 0.002 * meas["backward_peak"]
