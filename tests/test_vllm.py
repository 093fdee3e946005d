"""vLLM's startup budget: its rule, what it prints, what it refuses, and the published logs."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vrammath import GiB, Serve, Vllm, compare_log, load_model, vllm_budget
from vrammath.cli import main
from vrammath.notation.errors import InputError
from vrammath.serve.profile import forward_peak_bytes, sampler_peak_bytes

ROOT = Path(__file__).resolve().parents[1]


def _h100_argv(model: str) -> list[str]:
    """``serve MODEL --engine vllm`` on an H100 at 32k tokens per request."""
    return ["serve", model, "--engine", "vllm", "--gpu", "H100-80GB", "--max-model-len", "32768"]


LLAMA = load_model("llama-3.1-8b")


def test_weights_are_what_vllm_prints_for_llama_3_1_8b() -> None:
    # "Model loading took 14.9888 GiB" (vllm-project/vllm issue #10517 and every Llama-3.1-8B log)
    b = vllm_budget(Serve(LLAMA, gpu="H100-80GB"))
    assert f"{b.weights_bytes / GiB:.4f}" == "14.9888"


@pytest.mark.parametrize(
    ("max_len", "peak_gib"), [(20000, 17.06 - 14.9888), (29000, 17.98 - 14.9888)]
)
def test_forward_peak_matches_the_v0_profile_lines(max_len: int, peak_gib: float) -> None:
    # issue #10517 prints peak_torch_memory (weights + the profile's peak) for 20000 and 29000
    # tokens of Llama-3.1-8B on one RTX 3090 (V0: one sequence batch of max_model_len tokens)
    ours = forward_peak_bytes(LLAMA, max_len, 1) / GiB
    assert abs(ours - peak_gib) < 0.02  # the log's two decimals, twice


def test_v0_sampler_peak_matches_the_printed_activation_peaks() -> None:
    """The V0 profile's peak where the sampler dominates: the activation peaks two published
    V0 logs print (vllm-project/vllm PR #10511, Meta-Llama-3-8B, 8192 tokens as 256 requests;
    the phi-4 GPTQ readme of validation/serving-logs.json, 2048 tokens as 256 requests)."""
    for row_id, printed in (("llama-3-8b-pr10511", 1.26), ("phi-4-gptq-0.15", 0.94)):
        rows = json.loads((ROOT / "validation" / "serving-logs.json").read_text())["rows"]
        budget = compare_log(next(r for r in rows if r["id"] == row_id)).budget
        assert budget is not None
        assert budget.sampler_peak_bytes > budget.forward_peak_bytes
        assert abs(budget.activation_peak_bytes / GiB / printed - 1) < 0.04


def test_sampler_dominates_a_v1_profile_on_big_cards() -> None:
    b = vllm_budget(Serve(LLAMA, gpu="H100-80GB"), Vllm(max_model_len=32768))
    assert (b.profile_tokens, b.profile_seqs) == (8192, 1024)
    # the PyTorch sort: bf16 and float32 logits, sorted values and indices, cub's alternates
    assert b.activation_peak_bytes == b.sampler_peak_bytes == 1024 * LLAMA.vocab * (2 + 4 + 32)
    fi = vllm_budget(Serve(LLAMA, gpu="H100-80GB"), Vllm(max_model_len=32768, sampler="flashinfer"))
    assert fi.sampler_peak_bytes == 1024 * LLAMA.vocab * (2 + 8)
    assert fi.kv_tokens > b.kv_tokens
    a100 = vllm_budget(Serve(LLAMA, gpu="A100-80GB"), Vllm(max_model_len=32768))
    assert (a100.profile_tokens, a100.profile_seqs) == (2048, 256)  # A100s keep the small defaults


def test_v1_lines_and_whole_block_concurrency() -> None:
    b = vllm_budget(Serve(LLAMA, gpu="H100-80GB"), Vllm(max_model_len=32768))
    assert b.kv_tokens == b.num_blocks * 16
    assert b.num_blocks == b.available_bytes // (131072 * 16)
    assert b.max_concurrency == b.num_blocks / 2048
    lines = b.lines()
    assert lines[1] == f"GPU KV cache size: {b.kv_tokens:,} tokens"
    assert (
        lines[2] == f"Maximum concurrency for 32,768 tokens per request: {b.max_concurrency:.2f}x"
    )
    old = vllm_budget(Serve(LLAMA, gpu="H100-80GB"), Vllm(version="0.10.1", max_model_len=32768))
    assert old.max_concurrency == old.kv_tokens / 32768  # tokens over max_model_len before 0.11


def test_v0_lines_and_refusal() -> None:
    b = vllm_budget(Serve(LLAMA, gpu="RTX-4090-24GB"), Vllm(version="0.6.4", max_model_len=29000))
    assert b.engine_v0
    assert (b.profile_tokens, b.profile_seqs) == (29000, 256)
    assert b.lines()[2].startswith("# GPU blocks: ")
    assert not b.starts
    assert b.lines()[-1].startswith("ValueError: The model's max seq len (29000)")
    later = vllm_budget(
        Serve(LLAMA, gpu="RTX-4090-24GB"), Vllm(version="0.7.3", max_model_len=8192)
    )
    assert later.lines()[2].startswith("# cuda blocks: ")
    assert later.starts


def test_cuda_graphs_are_subtracted_from_0_20() -> None:
    a = vllm_budget(
        Serve(LLAMA, gpu="H100-80GB"), Vllm(version="0.19.1", gpu_memory_utilization=0.9)
    )
    b = vllm_budget(
        Serve(LLAMA, gpu="H100-80GB"), Vllm(version="0.20.0", gpu_memory_utilization=0.9)
    )
    assert a.cuda_graph_bytes == 0 < b.cuda_graph_bytes
    assert a.available_bytes - b.available_bytes == b.cuda_graph_bytes
    eager = Vllm(version="0.20.0", gpu_memory_utilization=0.9, enforce_eager=True)
    assert vllm_budget(Serve(LLAMA, gpu="H100-80GB"), eager).available_bytes == a.available_bytes
    assert vllm_budget(Serve(LLAMA, gpu="H100-80GB"), Vllm(version="0.20.0")).utilization == 0.92


def test_a_sliding_window_request_holds_its_window() -> None:
    phi = load_model("phi-3-mini")  # every layer slides over 2047 tokens
    b = vllm_budget(Serve(phi, gpu="RTX-4090-24GB"), Vllm(version="0.19.1", max_model_len=4096))
    assert b.blocks_per_request == -(-min(2047 - 1 + 2048, 4096) // 16) + 1


@settings(max_examples=40, deadline=None)
@given(
    seqs=st.integers(1, 4096),
    more=st.integers(1, 4096),
    util=st.floats(0.3, 1.0),
    tp=st.sampled_from([1, 2, 4, 8]),
)
def test_more_requests_never_leave_more_cache(seqs: int, more: int, util: float, tp: int) -> None:
    setup = Serve(load_model("llama-3.1-70b"), gpu="H100-80GB", tp=tp)
    a = vllm_budget(setup, Vllm(max_num_seqs=seqs, gpu_memory_utilization=util))
    b = vllm_budget(setup, Vllm(max_num_seqs=seqs + more, gpu_memory_utilization=util))
    assert b.available_bytes <= a.available_bytes
    assert a.kv_tokens % a.block_size == 0
    assert sampler_peak_bytes(setup.model, seqs, v0=False) <= sampler_peak_bytes(
        setup.model, seqs + more, v0=False
    )


@pytest.mark.parametrize(
    ("flags", "setup", "field"),
    [
        ({"version": "0.5.5"}, {}, "vllm_version"),
        ({"version": "0.34.0"}, {}, "vllm_version"),
        ({"version": "banana"}, {}, "vllm_version"),
        ({"version": "0.8.5"}, {}, "vllm_version"),  # V1 before 0.9.2
        ({"version": "0.11.0", "v0": True}, {}, "v0"),
        ({"version": "0.10.0", "v0": True, "sampler": "pytorch"}, {}, "sampler"),
        ({"sampler": "numpy"}, {}, "sampler"),
        ({"gpu_memory_utilization": 1.5}, {}, "gpu_memory_utilization"),
        ({}, {"weights": "nf4"}, "weights"),
        ({}, {"model": "mixtral-8x7b"}, "model"),
        ({"version": "0.10.0", "v0": True}, {"model": "gemma-2-9b"}, "model"),  # V0's windows
        ({}, {"gpu": None}, "gpu"),
        ({}, {"block": None}, "block"),
    ],
)
def test_what_is_not_modelled_is_refused_by_name(
    flags: dict[str, object], setup: dict[str, object], field: str
) -> None:
    model = load_model(str(setup.pop("model", "llama-3.1-8b")))
    with pytest.raises(InputError) as err:
        vllm_budget(Serve(model, **{"gpu": "H100-80GB", **setup}), Vllm(**flags))  # type: ignore[arg-type]
    assert err.value.field == field


def test_cli_answers_and_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    argv = _h100_argv("llama-3.1-8b")
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    b = vllm_budget(Serve(LLAMA, gpu="H100-80GB"), Vllm(max_model_len=32768))
    assert data["vllm"]["kv_tokens"] == b.kv_tokens
    assert data["vllm"]["lines"] == b.lines()
    assert main(argv) == 0
    assert f"GPU KV cache size: {b.kv_tokens:,} tokens" in capsys.readouterr().out
    for bad, word in (
        (["--vllm-version", "0.4.0"], "vllm_version"),
        (["--max-num-seqs", "0"], "max-num-seqs"),
        (["--gpu-util", "0.8"], "gpu-util"),
        (["--context", "8192"], "context"),
    ):
        assert main([*argv, *bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert word in err
        assert "Traceback" not in err
    assert main(["serve", "llama-3.1-8b", "--max-model-len", "100"]) == 2
    assert "max-model-len: is read by --engine vllm only" in capsys.readouterr().err
    assert main([*argv[:-1], "200000"]) == 0
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in capsys.readouterr().err
    assert main(["serve", "llama-3.1-8b", "--engine", "vllm", "--gpu", "V100-32GB"]) == 0
    assert "no measured usable total" in capsys.readouterr().err


def test_published_startup_logs() -> None:
    """The validation page's claims and the issue's target: at least 15 rows, the median error
    at most 2 % (1.08 % over 25 rows once the sampler's sort and the all-reduce without P2P
    were modelled; pinned at 1.2 % as a regression guard), a named cause for every row over
    2 %, every row vrammath cannot express with its reason."""
    rows = json.loads((ROOT / "validation" / "serving-logs.json").read_text())["rows"]
    found = [compare_log(r) for r in rows]
    done = [c for c in found if c.error is not None]
    assert len(found) >= 15
    assert len(done) >= 8
    assert statistics.median(abs(c.error) for c in done) <= 0.012
    assert all(c.row.get("cause") for c in done if abs(c.error) > 0.02)
    assert all(c.reason for c in found if c.budget is None)


def test_fewest_tp_and_smallest_gpu_hold_the_concurrency(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from vrammath.answers.vllm_fit import fewest_tp, smallest_gpu

    setup = Serve(load_model("llama-3.1-70b"), gpu="H100-80GB")
    flags = Vllm(max_model_len=32768)
    tp = fewest_tp(setup, flags, 8)
    assert tp is not None
    import dataclasses

    assert vllm_budget(dataclasses.replace(setup, tp=tp), flags).max_concurrency >= 8
    smaller = [t for t in (1, 2, 4, 8) if t < tp]
    assert all(
        vllm_budget(dataclasses.replace(setup, tp=t), flags).max_concurrency < 8 for t in smaller
    )
    assert fewest_tp(setup, flags, 10**6) is None
    assert smallest_gpu(setup, flags, 8) is None  # 70B in bf16 fits no single preset
    argv = _h100_argv("llama-3.1-70b")
    assert main([*argv, "--concurrency", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["concurrency"]["fewest_tp"] == tp


def test_weights_larger_than_the_card_fail_at_load() -> None:
    b = vllm_budget(Serve(load_model("llama-3.1-70b"), gpu="H100-80GB"))
    assert not b.starts
    assert b.lines() == [
        f"torch.OutOfMemoryError while loading the weights ({b.weights_bytes / GiB:.2f} GiB, "
        f"{b.total_bytes / GiB:.2f} GiB GPU)"
    ]


def test_the_sampler_each_log_prints_is_the_one_read() -> None:
    """A row's flags say what its log's lines say: "Using FlashInfer for top-p & top-k
    sampling." is ``sampler: flashinfer``, "FlashInfer is not available" the PyTorch sort (the
    default before 0.16), "Custom allreduce is disabled" ``disable_custom_all_reduce``. The rows
    that print the PyTorch fallback land within 2 % with its sort, and would not all with
    FlashInfer's bytes."""
    rows = json.loads((ROOT / "validation" / "serving-logs.json").read_text())["rows"]

    def says(row: dict[str, object], text: str) -> bool:
        return any(text in line for line in row["lines"])  # type: ignore[attr-defined]

    fi = [r for r in rows if says(r, "Using FlashInfer for top-p & top-k sampling")]
    native = [r for r in rows if says(r, "FlashInfer is not available")]
    plain = [r for r in rows if says(r, "Custom allreduce is disabled")]
    assert (len(fi), len(native), len(plain)) == (3, 8, 2)
    assert all(r["flags"].get("sampler") == "flashinfer" for r in fi)
    assert {r["id"] for r in rows if r.get("flags", {}).get("sampler")} == {r["id"] for r in fi}
    assert all(r["flags"].get("disable_custom_all_reduce") for r in plain)
    for r in native:
        c = compare_log(r)
        assert c.budget is not None
        assert c.budget.sampler == "pytorch"
    small = [compare_log(r) for r in native if not r.get("cause")]
    assert small
    assert all(abs(c.error or 1) <= 0.02 for c in small)
    as_fi = [compare_log({**r, "flags": {**r["flags"], "sampler": "flashinfer"}}) for r in native]
    assert max(abs(c.error or 0) for c in as_fi) > 0.02


def test_sort_peak_and_release_defaults() -> None:
    """CUDA sort's scratch per element (SortStable.cu) by rows; the release defaults; the
    warning where the release's sampler is not known; the all-reduce's constant."""
    from vrammath.serve.profile import sort_bytes

    assert [sort_bytes(n) for n in (1, 2, 127, 128, 1024)] == [32, 44, 44, 32, 32]
    assert Vllm(version="0.10.0").sampler_path == "pytorch"
    assert Vllm(version="0.10.0", v0=True).sampler_path == "v0"
    assert Vllm(version="0.15.1").warnings() == []
    assert Vllm(version="0.17.1", sampler="triton").warnings() == []
    assert "pass --sampler" in Vllm(version="0.17.1").warnings()[0]
    assert len(Vllm(version="0.21.0", sampler="pytorch").warnings()) == 0
    assert "V2 model runner" in Vllm(version="0.22.0", sampler="pytorch").warnings()[0]
    few = sampler_peak_bytes(LLAMA, 64, v0=False)
    assert few == 64 * LLAMA.vocab * (2 + 4 + 44)
    assert sampler_peak_bytes(LLAMA, 64, v0=True) == few  # V0's sort outweighs its gather
    assert sampler_peak_bytes(LLAMA, 256, v0=True) == 256 * LLAMA.vocab * (2 + 38)
    setup = Serve(load_model("qwen2-7b"), gpu="A100-80GB", tp=2)
    plain = vllm_budget(setup, Vllm(disable_custom_all_reduce=True))
    ar = vllm_budget(setup, Vllm())
    assert (plain.non_torch_key, ar.non_torch_key) == ("non_torch_tp_plain", "non_torch_tp")
    assert plain.non_torch_bytes < ar.non_torch_bytes
    assert plain.kv_tokens > ar.kv_tokens
    one = vllm_budget(Serve(LLAMA, gpu="A100-80GB"), Vllm(disable_custom_all_reduce=True))
    assert one.non_torch_key == "non_torch"  # one GPU has no all-reduce


def test_vllm_flag_names_and_values(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM's own names for the tensor-parallel degree and the cache dtype, with its values
    (``fp8`` is ``fp8_e4m3``), give the answer vrammath's names give; an unknown one is refused."""
    argv = _h100_argv("llama-3.1-8b")
    assert main([*argv, "--json", "--tensor-parallel-size", "2", "--kv-cache-dtype", "fp8"]) == 0
    theirs = json.loads(capsys.readouterr().out)
    assert main([*argv, "--json", "--tp", "2", "--kv-dtype", "fp8-e4m3"]) == 0
    ours = json.loads(capsys.readouterr().out)
    assert theirs == ours
    assert ours["vllm"]["kv_tokens"] > 0
    assert main([*argv, "--kv-cache-dtype", "fp8_e5m2"]) == 0
    assert "KV cache fp8-e5m2" in capsys.readouterr().out
    assert main([*argv, "--kv-cache-dtype", "auto"]) == 2
    assert "kv-dtype: must be one of" in capsys.readouterr().err
