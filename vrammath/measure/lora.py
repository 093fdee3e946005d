"""Measure LoRA fine-tuning (real peft) and the KV cache (transformers' own cache objects).

* :func:`measure_lora_step` -- a Hugging Face model of a ModelSpec with peft LoRA adapters, one or
  more training steps (forward with HF's loss, backward, AdamW step, ``zero_grad``) inside
  ``FakeTensorMode`` under PyTorch's ``MemTracker``: exact bytes of parameters, gradients,
  optimizer states and of what the forward pass keeps, nothing allocated. With
  ``adapters=False`` the same frozen model runs without adapters (the baseline that isolates what
  the adapters add).
* :func:`measure_kv_cache` -- real (small) tensors on the CPU: the bytes held by transformers'
  ``DynamicCache`` after a prefill and after decode steps, and by a ``StaticCache``.

Run as ``python -m vrammath.measure.lora`` to write ``validation/lora_kv.json``.
Needs torch (2.13.0 CPU build is enough), transformers 5.x and peft; imported inside functions.
QLoRA cannot be measured here: bitsandbytes' 4-bit kernels need CUDA.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vrammath.measure.build import as_spec, build_model, real_training_masks
from vrammath.measure.step import _by_category
from vrammath.model.spec import ModelSpec
from vrammath.terms.lora.linears import adapted_linears
from vrammath.terms.lora.targets import lora_targets


class _NoHook:
    """Stands in for the hook handle of a frozen parameter (nothing to remove)."""

    def remove(self) -> None:
        return None


def _snapshot(tracker: Any) -> dict[str, int]:
    return _by_category(tracker.get_tracker_snapshot("current"))


def _diff(after: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    return {k: int(after[k]) - int(before.get(k, 0)) for k in after}


@contextlib.contextmanager
def _module_to_in_place() -> Any:
    """Let peft build adapters inside FakeTensorMode.

    peft moves each new adapter (and the replaced module) to the base layer's device and dtype
    with ``Module.to``, which swaps parameters when they are fake tensors, and the swap fails.
    While peft builds the model, ``Module.to`` here changes nothing for a device move (everything
    is on the CPU already) and converts a dtype by ``param.data = param.data.to(dtype)``, which
    is how peft's own ``autocast_adapter_dtype`` upcasts 16-bit adapters to fp32.
    """
    import torch

    original = torch.nn.Module.to

    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        _device, dtype, _non_blocking, _fmt = torch._C._nn._parse_to(*args, **kwargs)
        if dtype is not None:
            for tensor in (*self.parameters(), *self.buffers()):
                if tensor.is_floating_point():
                    tensor.data = tensor.data.to(dtype)
        return self

    torch.nn.Module.to = to  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.to = original  # type: ignore[method-assign]


def peft_targets(spec: ModelSpec, targets: str | Sequence[str]) -> dict[str, list[str]]:
    """``target_modules`` / ``target_parameters`` that make peft adapt what ``targets`` names.

    >>> from vrammath.model.presets import load_model
    >>> peft_targets(load_model("mixtral-8x7b"), "o,gate,up,down,router")
    {'target_modules': ['self_attn.o_proj', 'w1', 'w3', 'w2', 'gate']}
    >>> peft_targets(load_model("qwen3-30b-a3b"), "q,experts")  # doctest: +NORMALIZE_WHITESPACE
    {'target_modules': ['self_attn.q_proj'],
     'target_parameters': ['experts.gate_up_proj', 'experts.down_proj']}
    """
    out: dict[str, list[str]] = {}
    for m in adapted_linears(spec, targets):
        out.setdefault(m.peft_field, []).extend(m.peft_names)
    return out


def measure_lora_step(
    model: ModelSpec | str | Mapping[str, object],
    *,
    rank: int = 8,
    targets: str | Sequence[str] = ("q", "v"),
    batch: int = 1,
    seq: int = 512,
    precision: str = "bf16",
    dropout: float = 0.0,
    adapters: bool = True,
    input_grads: bool = False,
    steps: int = 2,
    layers: int | None = None,
    attention: str = "sdpa",
) -> dict[str, Any]:
    """Count one LoRA training step of the real peft model with fake tensors.

    Returns the trainable count, bytes of parameters (frozen and trainable apart), and per
    iteration: the bytes the forward pass added (``forward``), what backward left
    (``backward``) and what ``optimizer.step()`` left (``step``), each by MemTracker category.
    ``input_grads`` calls ``enable_input_require_grads()`` (as ``prepare_model_for_kbit_training``
    and gradient checkpointing do): it makes the frozen baseline comparable with the LoRA run.
    """
    import peft
    import torch
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    spec = as_spec(model)
    chosen = lora_targets(targets)
    started = time.perf_counter()
    with real_training_masks(), FakeTensorMode():
        torch.manual_seed(0)
        net = build_model(spec, precision=precision, attention=attention, layers=layers)
        for param in net.parameters():
            param.requires_grad_(False)
        if adapters:
            cfg = peft.LoraConfig(
                r=rank,
                lora_alpha=16,
                lora_dropout=dropout,
                **peft_targets(spec, chosen),
                task_type="CAUSAL_LM",
            )
            with _module_to_in_place(), warnings.catch_warnings():
                # peft 0.21 asks transformers 5 a deprecated question; not ours to fix
                warnings.filterwarnings(
                    "ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning
                )
                # peft 0.21.2 warns that the 2r rank_pattern it writes for the experts' fused
                # gate_up_proj matched no module: it matches the parameter, and applies
                warnings.filterwarnings(
                    "ignore", message=".*rank_pattern keys did not match.*", category=RuntimeWarning
                )
                warnings.filterwarnings(
                    "ignore",
                    message=".*alpha_pattern keys did not match.*",
                    category=RuntimeWarning,
                )
                net = peft.get_peft_model(net, cfg)
        if input_grads:
            net.enable_input_require_grads()
        net.train()
        trainable = [p for p in net.parameters() if p.requires_grad]
        frozen = [p for p in net.parameters() if not p.requires_grad]
        n_trainable = sum(p.numel() for p in trainable)
        trainable_bytes = sum(p.numel() * p.element_size() for p in trainable)
        frozen_bytes = sum(p.numel() * p.element_size() for p in frozen)
        opt = torch.optim.AdamW(
            trainable or [torch.nn.Parameter(torch.zeros(1))], lr=1e-4, foreach=True
        )
        ids = torch.randint(0, spec.vocab, (batch, seq))
        tracker = MemTracker()
        # MemTracker installs a gradient hook on every parameter, which a frozen one refuses:
        # mark the frozen parameters as already hooked.
        for param in frozen:
            tracker._param_to_grad_hook_handles[param] = (_NoHook(), _NoHook())
        tracker.track_external(net, opt)
        iterations = []
        with tracker, warnings.catch_warnings():
            # peft's ParamWrapper (router/experts) registers parametrizations on the fly; their
            # modules are gone by backward, and MemTracker says it skips their module hooks
            warnings.filterwarnings("ignore", message="Module is None", category=UserWarning)
            for _ in range(steps):
                tracker.reset_mod_stats()
                start = _snapshot(tracker)
                loss = net(input_ids=ids, labels=ids).loss
                fwd = _snapshot(tracker)
                record: dict[str, Any] = {"start": start, "forward": _diff(fwd, start)}
                if trainable or input_grads:
                    loss.backward()
                del loss
                bwd = _snapshot(tracker)
                record["backward_end"] = bwd
                if trainable:
                    opt.step()
                record["step_end"] = _snapshot(tracker)
                opt.zero_grad(set_to_none=True)
                iterations.append(record)
    return {
        "model": spec.name,
        "setup": {
            "rank": rank if adapters else None,
            "targets": list(chosen) if adapters else [],
            "batch": batch,
            "seq": seq,
            "precision": precision,
            "dropout": dropout,
            "input_grads": input_grads,
            "attention": "sdpa",
            "optimizer": "adamw (foreach)",
            "layers": spec.layers if layers is None else layers,
        },
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
        },
        "trainable_params": n_trainable,
        "trainable_bytes": trainable_bytes,
        "frozen_bytes": frozen_bytes,
        "iterations": iterations,
        "seconds": round(time.perf_counter() - started, 2),
    }


def _kv_config(kind: str) -> Any:
    import transformers

    common = {
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 48,  # explicit, not hidden / heads = 32
        "vocab_size": 1000,
        "max_position_embeddings": 4096,
    }
    if kind == "llama-gqa":
        return transformers.LlamaConfig(**common)
    if kind == "mistral-window":
        return transformers.MistralConfig(**common, sliding_window=16)
    if kind == "qwen2-mixed-window":
        return transformers.Qwen2Config(
            **common, use_sliding_window=True, sliding_window=16, max_window_layers=2
        )
    raise ValueError(kind)


KV_CONFIGS = ("llama-gqa", "mistral-window", "qwen2-mixed-window")


def config_dict(kind: str) -> dict[str, Any]:
    """The small config ``kind`` as a config.json dict (for :func:`vrammath.from_hf_config`)."""
    cfg = _kv_config(kind).to_dict()
    return {k: v for k, v in cfg.items() if not k.startswith("_")}


def _cache_bytes(cache: Any) -> int:
    total = 0
    for layer in cache.layers:
        for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if tensor is not None and hasattr(tensor, "untyped_storage"):
                total += tensor.numel() * tensor.element_size()
    return total


def measure_kv_cache(
    kind: str,
    *,
    batch: int = 2,
    prompt: int = 37,
    decode: int = 5,
    dtype: str = "bf16",
    static_len: int = 64,
) -> dict[str, Any]:
    """Bytes of transformers' DynamicCache (after prefill, after decode) and StaticCache."""
    import torch
    import transformers

    cfg = _kv_config(kind)
    cfg._attn_implementation = "sdpa"
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    torch.manual_seed(0)
    cls = {
        "llama-gqa": transformers.LlamaForCausalLM,
        "mistral-window": transformers.MistralForCausalLM,
        "qwen2-mixed-window": transformers.Qwen2ForCausalLM,
    }[kind]
    model = cls._from_config(cfg, dtype=torch_dtype).eval()
    ids = torch.randint(0, cfg.vocab_size, (batch, prompt))
    rows: dict[str, Any] = {}
    with torch.no_grad():
        cache = transformers.DynamicCache(config=cfg)  # what generate() builds by default
        out = model(input_ids=ids, cache=cache, use_cache=True)
        rows["dynamic_prefill"] = {
            "tokens": prompt,
            "bytes": _cache_bytes(cache),
            "class": type(cache).__name__,
        }
        nxt = out.logits[:, -1:].argmax(-1)
        for _ in range(decode):
            out = model(input_ids=nxt, cache=cache, use_cache=True)
            nxt = out.logits[:, -1:].argmax(-1)
        rows["dynamic_decode"] = {"tokens": prompt + decode, "bytes": _cache_bytes(cache)}
        static = transformers.StaticCache(config=cfg, max_cache_len=static_len)
        model(input_ids=ids, cache=static, use_cache=True)
        rows["static"] = {
            "max_cache_len": static_len,
            "bytes": _cache_bytes(static),
            "class": type(static).__name__,
        }
    return {
        "config": kind,
        "config_dict": config_dict(kind),
        "batch": batch,
        "dtype": dtype,
        "rows": rows,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }


LORA_RUNS: tuple[dict[str, Any], ...] = (
    {"model": "llama-7b", "rank": 8, "targets": "q,v"},
    {"model": "llama-7b", "rank": 16, "targets": "q,v"},
    {"model": "llama-7b", "rank": 16, "targets": "all-linear"},
    {"model": "llama-7b", "rank": 8, "targets": "q,v", "dropout": 0.05},
    {"model": "qwen2-7b", "rank": 8, "targets": "q,k,v"},
    {"model": "qwen2-7b", "rank": 16, "targets": "all-linear"},
)


def run_all(seq: int = 512, batch: int = 1, layers: int | None = None) -> dict[str, Any]:
    """Every LoRA run (with its frozen baseline) and every KV-cache config: the validation data.

    ``layers`` cuts each model to its first layers (the per-layer terms scale with L; the
    embeddings and head stay whole), for a quick run.
    """
    lora = []
    baselines: dict[str, Any] = {}

    def measured(name: str, **options: Any) -> dict[str, Any]:
        return measure_lora_step(name, batch=batch, seq=seq, layers=layers, **options)

    for run in LORA_RUNS:
        name = run["model"]
        if name not in baselines:
            baselines[name] = measured(name, adapters=False, input_grads=True, steps=1)
        adapter = {
            "rank": run["rank"],
            "targets": run["targets"],
            "dropout": run.get("dropout", 0.0),
        }
        raw = measured(name, **adapter)
        paired = measured(name, **adapter, input_grads=True, steps=1)
        lora.append({"run": raw, "with_input_grads": paired})
    kv = [measure_kv_cache(kind) for kind in KV_CONFIGS]
    return {"lora": lora, "lora_baselines": baselines, "kv": kv}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m vrammath.measure.lora [OUT.json] [--layers N]``: measure, write the data."""
    args = list(sys.argv[1:] if argv is None else argv)
    layers = None
    if "--layers" in args:
        at = args.index("--layers")
        layers = int(args[at + 1])
        del args[at : at + 2]
    out = Path(args[0]) if args else Path("validation/lora_kv.json")
    data = run_all(layers=layers)
    data["command"] = (
        "python -m vrammath.measure.lora " + str(out) + (f" --layers {layers}" if layers else "")
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        out.unlink()
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
