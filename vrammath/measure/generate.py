"""Count what transformers' ``generate()`` holds at its peaks, for :mod:`vrammath.serve.generate`.

:func:`measure_generate` builds the Hugging Face model of a config (random weights, SDPA, in
eval mode) and runs ``model.generate(ids, max_new_tokens=N, do_sample=False, use_cache=True,
eos_token_id=None)`` under the recorder of :mod:`vrammath.measure.allocator_events`, which logs
every storage an op creates and the moment it dies. A forward pre-hook on the model starts a new
phase at every forward: forward 0 is the prefill, forward k the k-th decode step (each phase runs
to the next forward, so it includes ``generate()``'s own work on the step's logits). The peak of
a phase is the most bytes alive during it, above the parameters, the buffers and the prompt.

The tensors are real, on the CPU: ``generate()`` reads values (its stopping checks call
``.item()``), which fake tensors refuse (``aten._local_scalar_dense``). The configs are small,
so a run takes a second; the bytes are exact whatever the weights' values. What a CPU run cannot
show of CUDA: SDPA's CPU flash kernel stands in for the CUDA one (the same output and fp32
log-sum-exp shapes) and a GEMM's workspace is not a tensor.

``python -m vrammath.measure.generate --out validation/generate.json`` writes every row of
:data:`GENERATE_RUNS` with vrammath's figures beside the measured ones.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from vrammath.measure.allocator_events import _recorder_class
from vrammath.measure.build import as_spec, build_model, hf_config
from vrammath.measure.matrix_rows import SMALL_GQA, SMALL_TIED
from vrammath.model.presets import load_model
from vrammath.model.readers import from_hf_config
from vrammath.serve.generate import generate_peaks

#: small decoders of every accepted family: GQA, MQA with tied embeddings and q/k/v biases, MHA,
#: a head dimension that is not h / a, and a vocabulary larger than the layers' tensors
CONFIGS: dict[str, dict[str, Any]] = {
    "small-gqa": SMALL_GQA,  # the validation matrix's own small decoders
    "small-tied-mqa": SMALL_TIED,
    "small-mha-one-layer": {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 172,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 300,
    },
    "small-mistral-wide-vocab": {
        "model_type": "mistral",
        "hidden_size": 64,
        "intermediate_size": 224,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 32768,
        "sliding_window": None,
    },
    # wide heads and a narrow MLP: the peak moves to RoPE on K (MHA), RoPE on Q (GQA)...
    "small-wide-heads": {
        "model_type": "llama",
        "hidden_size": 32,
        "intermediate_size": 24,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "head_dim": 32,
        "vocab_size": 64,
    },
    "small-wide-gqa-heads": {
        "model_type": "qwen2",
        "hidden_size": 32,
        "intermediate_size": 24,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": 64,
    },
    # ... and narrow heads with a narrow MLP to the second norm
    "small-narrow-heads": {
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 8,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 8,
        "vocab_size": 64,
    },
}

#: (config, batch, prompt, new tokens, dtype): short and long prompts, one and several sequences,
#: no decode step (one new token) and several
GENERATE_RUNS: tuple[tuple[str, int, int, int, str], ...] = (
    ("small-gqa", 1, 1, 4, "bf16"),
    ("small-gqa", 2, 16, 3, "bf16"),
    ("small-gqa", 3, 57, 5, "fp16"),
    ("small-gqa", 1, 300, 2, "bf16"),
    ("small-tied-mqa", 1, 5, 1, "bf16"),
    ("small-tied-mqa", 2, 33, 4, "bf16"),
    ("small-tied-mqa", 4, 128, 3, "fp16"),
    ("small-mha-one-layer", 2, 9, 3, "bf16"),
    ("small-mha-one-layer", 1, 200, 2, "bf16"),
    ("small-mistral-wide-vocab", 2, 3, 3, "bf16"),
    ("small-mistral-wide-vocab", 1, 400, 3, "bf16"),
    ("small-wide-heads", 2, 24, 2, "bf16"),
    ("small-wide-gqa-heads", 2, 24, 2, "bf16"),
    ("small-narrow-heads", 3, 40, 2, "fp16"),
)

#: presets at full width, two layers (Qwen2 with its q/k/v biases)
PRESET_RUNS: tuple[tuple[str, int, int, int, str], ...] = (
    ("llama-3.1-8b", 1, 64, 3, "bf16"),
    ("qwen2-7b", 2, 32, 2, "bf16"),
    ("mistral-7b-v0.3", 1, 48, 3, "fp16"),
)


def measure_generate(
    config: Mapping[str, Any], *, batch: int, prompt: int, new_tokens: int, dtype: str = "bf16"
) -> dict[str, int]:
    """Peak bytes of the prefill and of the largest decode step (0 without one) of a real
    ``generate()``, above the weights, the buffers and the prompt's ids."""
    import torch

    spec = as_spec(dict(config))
    torch.manual_seed(0)
    net = build_model(spec, precision=dtype, attention="sdpa").eval()
    pad = 0
    ids = torch.randint(pad + 1, spec.vocab, (batch, prompt))  # no pad id: no padding mask
    recorder = _recorder_class()()
    for tensor in [*net.parameters(), *net.buffers(), ids]:
        recorder.track(tensor)
    recorder.phase = "generate"  # what generate() makes before the first forward is counted
    forwards = iter(range(new_tokens))

    def new_phase(*_: Any) -> None:
        recorder.phase = f"forward {next(forwards)}"
        recorder.mark()

    hook = net.register_forward_pre_hook(new_phase)
    try:
        with torch.no_grad(), recorder:
            net.generate(
                ids,
                max_new_tokens=new_tokens,
                do_sample=False,
                use_cache=True,
                eos_token_id=None,
                pad_token_id=pad,
            )
    finally:
        hook.remove()
        recorder.active = False
    setup = {e.storage for e in recorder.events if e.phase == "setup" and e.kind == "alloc"}
    alive = 0
    sizes: dict[int, int] = {}
    peaks: dict[str, int] = {}
    for event in recorder.events:
        if event.kind == "alloc" and event.storage not in setup:
            sizes[event.storage] = event.nbytes
            alive += event.nbytes
        elif event.kind == "free":
            alive -= sizes.pop(event.storage, 0)
        peaks[event.phase] = max(peaks.get(event.phase, 0), alive)
    decode = [v for k, v in peaks.items() if k.startswith("forward ") and k != "forward 0"]
    gen = net.generation_config  # the ids generate() made tensors of (eos was set to None)
    special = sum(x is not None for x in (gen.bos_token_id, pad, gen.decoder_start_token_id))
    return {"prefill": peaks["forward 0"], "decode": max(decode, default=0), "special": special}


def run_all() -> dict[str, Any]:
    """Every run of :data:`GENERATE_RUNS`: measured peaks beside vrammath's, and the versions."""
    import torch
    import transformers

    configs = dict(CONFIGS)
    for name, *_ in PRESET_RUNS:
        configs[name] = hf_config(
            replace(load_model(name), layers=2), attention="sdpa"
        ).to_diff_dict()
    rows = []
    for name, batch, prompt, new, dtype in GENERATE_RUNS + PRESET_RUNS:
        measured = measure_generate(
            configs[name], batch=batch, prompt=prompt, new_tokens=new, dtype=dtype
        )
        spec = from_hf_config(configs[name], name=name)
        special = measured.pop("special")  # the ids generate() made tensors of
        model = generate_peaks(
            spec, prompt=prompt, new_tokens=new, batch=batch, dtype=dtype, special_tokens=special
        )
        rows.append(
            {
                "config": name,
                "batch": batch,
                "prompt": prompt,
                "new_tokens": new,
                "dtype": dtype,
                "special_tokens": special,
                "measured": measured,
                "vrammath": {
                    "prefill": model.prefill_bytes,
                    "prefill_point": model.prefill_point,
                    "decode": model.decode_bytes,
                    "decode_point": model.decode_point,
                },
            }
        )
    for row in rows:
        row["pass"] = all(row["measured"][k] == row["vrammath"][k] for k in ("prefill", "decode"))
    worst = {
        k: max(abs(r["vrammath"][k] - r["measured"][k]) / max(r["measured"][k], 1) for r in rows)
        for k in ("prefill", "decode")
    }
    return {
        "about": "peak bytes above the weights of transformers' generate() (greedy, every step "
        "run, DynamicCache, SDPA) on real CPU tensors, prefill and largest decode step, against "
        "vrammath.serve.generate",
        "configs": configs,
        "rows": rows,
        "worst_rel_error": worst,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Measure every run; write JSON to ``--out`` (or print it)."""
    parser = argparse.ArgumentParser(prog="python -m vrammath.measure.generate")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    data = run_all()
    text = json.dumps(data, indent=1) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        print(text, end="")
    return 0 if all(r["pass"] for r in data["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
