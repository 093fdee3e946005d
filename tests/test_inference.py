"""Serving: KV cache per token (vLLM's figures), GQA/MQA, TP replication, paging, windows, fit."""

from __future__ import annotations

import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from vrammath.model.params import param_count, size_values, tensors
from vrammath.model.presets import gpu, load_model, model_names
from vrammath.model.readers import from_hf_config
from vrammath.notation.errors import InputError
from vrammath.serve.estimate import Serve, serve
from vrammath.serve.kv_cache import kv_bytes_per_token, kv_cache_bytes
from vrammath.serve.profile import loaded_weight_bytes
from vrammath.serve.weights import SERVE_QUANT_RULES, serving_weight_bytes
from vrammath.terms.lora.quant import QLORA_QUANT_RULES, quantized_tensors

KiB = 1024


def test_published_per_token() -> None:
    # vLLM: 2 * L * n_kv * d_head * 2 bytes; Llama-2-7B 512 KiB, Llama-2-70B (GQA 8) 320 KiB.
    assert kv_bytes_per_token(load_model("llama-2-7b"), "fp16") == 512 * KiB
    assert kv_bytes_per_token(load_model("llama-2-70b"), "fp16") == 320 * KiB
    assert kv_bytes_per_token(load_model("llama-2-70b"), "fp8-e4m3") == 160 * KiB
    assert kv_bytes_per_token(load_model("mistral-7b")) == 128 * KiB
    assert kv_bytes_per_token(load_model("qwen2-72b")) == 320 * KiB


@pytest.mark.parametrize(("tp", "heads"), [(1, 8), (2, 4), (4, 2), (8, 1), (16, 1), (64, 1)])
def test_tp_replicates_kv_heads(tp: int, heads: int) -> None:
    spec = load_model("llama-2-70b")
    assert kv_bytes_per_token(spec, tp=tp) == 2 * 80 * heads * 128 * 2


def test_mha_gqa_mqa() -> None:
    base = {
        "model_type": "llama",
        "hidden_size": 1024,
        "intermediate_size": 2048,
        "num_hidden_layers": 4,
        "num_attention_heads": 16,
        "vocab_size": 100,
    }
    mha = from_hf_config(base)
    gqa = from_hf_config({**base, "num_key_value_heads": 4})
    mqa = from_hf_config({**base, "num_key_value_heads": 1})
    wide = from_hf_config({**base, "num_key_value_heads": 4, "head_dim": 128})
    per = [kv_bytes_per_token(x) for x in (mha, gqa, mqa, wide)]
    assert per == [2 * 4 * 16 * 64 * 2, 2 * 4 * 4 * 64 * 2, 2 * 4 * 1 * 64 * 2, 2 * 4 * 4 * 128 * 2]
    assert kv_bytes_per_token(mqa, tp=8) == kv_bytes_per_token(mqa)  # one head, replicated


def test_paged_last_block_and_window() -> None:
    spec = load_model("llama-2-7b")
    assert kv_cache_bytes(spec, 3, 17, block=16) == 3 * 32 * 512 * KiB
    assert kv_cache_bytes(spec, 3, 32, block=16) == 3 * 32 * 512 * KiB
    assert kv_cache_bytes(spec, 3, 33, block=16) == 3 * 48 * 512 * KiB
    mistral = load_model("mistral-7b")  # sliding window 4096 on every layer
    assert kv_cache_bytes(mistral, 1, 32768) == 4096 * 128 * KiB
    assert kv_cache_bytes(mistral, 1, 1000) == 1000 * 128 * KiB
    assert kv_cache_bytes(mistral, 1, 32768, window_layers=0) == 32768 * 128 * KiB
    assert kv_cache_bytes(mistral, 1, 32768, keep_window_minus_one=True) == 4095 * 128 * KiB
    with pytest.raises(InputError, match="^window_layers: needs a model with a sliding_window"):
        kv_cache_bytes(spec, 1, 10, window_layers=2)


@given(st.integers(1, 100_000), st.integers(1, 64), st.sampled_from([1, 8, 16, 32, 128]))
def test_paged_never_less_and_under_one_block_more(tokens: int, batch: int, block: int) -> None:
    spec = load_model("llama-2-70b")
    exact = kv_cache_bytes(spec, batch, tokens)
    paged = kv_cache_bytes(spec, batch, tokens, block=block)
    assert exact <= paged < exact + batch * block * kv_bytes_per_token(spec)


def test_serving_weights_formats() -> None:
    spec = load_model("llama-2-7b")
    psi = param_count(spec)
    assert serving_weight_bytes(spec, "fp16")["weights"] == 2 * psi
    int4 = serving_weight_bytes(spec, "int4")
    quantized = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)
    assert int4["weights"] == quantized // 2 + 2 * (psi - quantized)
    assert int4["quant_constants"] == quantized // 128 * 5 // 2  # fp16 scale + 4-bit zero
    int8 = serving_weight_bytes(spec, "int8")
    assert int8["weights"] == quantized + 2 * (psi - quantized)
    assert int8["quant_constants"] == 4 * 32 * (5 * 4096 + 2 * 11008)  # fp32 per output row
    tp8 = serving_weight_bytes(load_model("llama-2-70b"), "bf16", tp=8)["weights"]
    norms = (2 * 80 + 1) * 8192
    assert tp8 == 2 * ((param_count(load_model("llama-2-70b")) - norms) // 8 + norms)


def test_quantized_serving_formats_quantize_the_experts() -> None:
    # Mixtral-8x7B by hand: 32 layers, h 4096, 8 experts of I_e 14336, a_kv 8 of d 128, V 32000.
    # GPTQ/AWQ quantize every decoder linear, experts included; embeddings, lm_head, norms and
    # the router stay 16-bit (TheBloke/Mixtral-8x7B-v0.1-GPTQ, 4 bit 128 g: 23.8 GB on disk).
    spec = load_model("mixtral-8x7b")
    attention = 32 * (2 * 4096 * 4096 + 2 * 1024 * 4096)
    experts = 32 * 8 * 3 * 14336 * 4096
    sixteen_bit = 2 * 32000 * 4096 + (2 * 32 + 1) * 4096 + 32 * 8 * 4096
    assert param_count(spec) == attention + experts + sixteen_bit
    int4 = serving_weight_bytes(spec, "int4")
    assert int4["weights"] == (attention + experts) // 2 + 2 * sixteen_bit == 23_746_584_576
    assert int4["quant_constants"] == (attention + experts) // 128 * 5 // 2
    int8 = serving_weight_bytes(spec, "int8")
    assert int8["weights"] == attention + experts + 2 * sixteen_bit
    rows = 32 * (4096 + 2 * 1024 + 4096) + 32 * 8 * (2 * 14336 + 4096)  # one fp32 scale per row
    assert int8["quant_constants"] == 4 * rows


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(model_names()), st.sampled_from(["int4", "nf4", "int8"]))
def test_no_quantizable_parameter_stays_16_bit(model: str, weights: str) -> None:
    # what stays 16-bit is exactly the embeddings, head, norms, router and biases
    spec = load_model(model)
    kept = sum(
        t.count * t.numel
        for t in tensors(spec)
        if t.component in ("embedding", "positions", "head", "norms", "router") or len(t.shape) < 2
    )
    values = size_values(spec)
    kept_n = int(sympy.sympify(kept).subs(values))
    psi = param_count(spec)
    per_param = {"int4": sympy.Rational(1, 2), "nf4": sympy.Rational(1, 2), "int8": 1}[weights]
    got = serving_weight_bytes(spec, weights)["weights"]
    assert got == 2 * kept_n + per_param * (psi - kept_n)


def test_a_parameter_kind_without_a_serving_rule_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(SERVE_QUANT_RULES, "experts")
    with pytest.raises(InputError, match="'experts'"):
        serving_weight_bytes(load_model("mixtral-8x7b"), "int4")


def test_a_parameter_kind_without_a_qlora_rule_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(QLORA_QUANT_RULES, "router")
    with pytest.raises(InputError, match="^quant: no quantization rule for the parameter kind"):
        quantized_tensors(load_model("mixtral-8x7b"))


def test_fit_and_largest_batch() -> None:
    spec = load_model("llama-2-7b")
    est = serve(Serve(spec, context=4096, batch=8, gpu="A100-80GB"))
    budget = est.kv_budget_bytes
    assert budget == gpu("A100-80GB").bytes - est.reserve_bytes - 2 * param_count(spec)
    n = est.max_batch()
    assert n is not None
    per_seq = 4096 * 512 * KiB
    assert n * per_seq <= budget < (n + 1) * per_seq
    longest = est.max_context()
    assert longest is not None
    assert kv_cache_bytes(spec, 8, longest, block=16) <= budget
    assert kv_cache_bytes(spec, 8, longest + 16, block=16) > budget
    assert est.fits()
    too_big = serve(Serve(spec, context=32768, batch=8, gpu="H100-80GB"))
    assert too_big.fits() is False
    assert serve(Serve(load_model("mistral-7b"), gpu="H100-80GB")).max_context() == 1 << 24


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"weights": "int3"}, "weights"),
        ({"kv_dtype": "fp4"}, "kv_dtype"),
        ({"gpu": "TPU"}, "gpu"),
        ({"gpu_util": 1.5}, "gpu_util"),
        ({"context": 0}, "context"),
    ],
)
def test_serve_refuses(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InputError, match=f"^{field}: "):
        Serve(load_model("llama-2-7b"), **kwargs)  # type: ignore[arg-type]


def test_cli_serve(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from vrammath.cli import main

    code = main(["serve", "llama-2-7b", "--context", "32768", "--batch", "8", "--gpu", "H100-80GB"])
    out = capsys.readouterr().out
    assert code == 0
    assert "does NOT fit" in out
    assert "largest batch at 32768 tokens: 3" in out
    code = main(["serve", "llama-2-70b", "--tp", "8", "--weights", "int4", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert data["kv_bytes_per_token"] == 40 * KiB
    assert data["gpu"] is None


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--weights", "int3"], "weights"),
        (["--kv-dtype", "fp4"], "kv-dtype"),
        (["--gpu-util", "0"], "gpu-util"),
        (["--gpu", "TPU"], "gpu"),
        (["--context", "-1"], "context"),
    ],
)
def test_cli_serve_bad_input(
    capsys: pytest.CaptureFixture[str], args: list[str], field: str
) -> None:
    from vrammath.cli import main

    try:
        code = main(["serve", "llama-2-7b", *args])
    except SystemExit as exc:  # argparse rejects the value
        code = int(str(exc.code))
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert f"{field}: " in err
    assert "Traceback" not in err


def test_fp8_formats_llama_31_8b() -> None:
    # every decoder linear one byte per weight; embeddings, head and norms in 16 bits
    spec = load_model("llama-3.1-8b")
    h, f, kv = 4096, 14336, 1024
    linear = 32 * (h * (h + kv + kv + h) + 3 * h * f)
    rest = param_count(spec) - linear
    channels = 32 * (h + kv + kv + h + f + f + h)  # output features of the 7 linears
    blocks = 32 * (32 * 32 * 2 + 8 * 32 * 2 + 3 * 112 * 32)  # ceil(out/128) * ceil(in/128)
    for fmt, consts in (
        ("fp8", 4 * channels),
        ("fp8-tensor", 4 * 7 * 32),
        ("fp8-block", 4 * blocks),
    ):
        assert serving_weight_bytes(spec, fmt) == {
            "weights": linear + 2 * rest,
            "quant_constants": consts,
        }


def test_fp8_loaded_as_vllm_prints() -> None:
    # neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8-dynamic (per-channel scales): vLLM printed
    # "Loading model weights took 8.4939 GB" (GiB), a public benchmark note (stored-index file
    # 21991779723, "Benchmark and compare FP8 and FP16 inference for vLLM")
    loaded = loaded_weight_bytes(load_model("llama-3.1-8b"), "fp8", tp=1, group=128)
    assert round(loaded / 2**30, 4) == 8.4939


def test_mxfp4_experts_only() -> None:
    spec = load_model("mixtral-8x7b")
    got = serving_weight_bytes(spec, "mxfp4")
    experts = 8 * 32 * 3 * 4096 * 14336  # E L_e matrices of gate, up, down
    assert got["quant_constants"] == 8 * 32 * (2 * 14336 * 4096 // 32 + 4096 * 14336 // 32)
    assert got["weights"] == experts // 2 + 2 * (param_count(spec) - experts)
    with pytest.raises(InputError, match="mxfp4 quantizes routed experts only"):
        serving_weight_bytes(load_model("llama-3.1-8b"), "mxfp4")
