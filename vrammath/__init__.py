"""vrammath: the GPU memory of training, fine-tuning and serving large language models, derived.

Every memory term is a sympy expression in named symbols (:mod:`vrammath.symbols`), written once in
the module that owns it, evaluated for real models read from Hugging Face ``config.json`` files
(:mod:`vrammath.presets`), and checked against memory PyTorch itself counts (``vrammath.measure``,
an optional extra).

Scope: dense decoder-only transformers of the LLaMA family (llama, mistral, qwen2) and of the GPT-2
family; mixed-precision recipes; Adam/AdamW, SGD, 8-bit Adam, Adafactor; ZeRO 0-3 / FSDP with CPU
offload. Units: bytes inside; GB (1e9) and GiB (2**30) are always labelled.

>>> import vrammath
>>> est = vrammath.estimate(vrammath.Setup(vrammath.load_model("llama-7b"), zero=3, gpus=8))
>>> est.component("weights").expr
2*P/N_d
"""

from vrammath.budget import Budget, budget
from vrammath.errors import InputError
from vrammath.estimate import Component, Estimate, estimate
from vrammath.fit import fewest_gpus, fit, largest_micro_batch, longest_sequence
from vrammath.inference import Serve, kv_bytes_per_token, kv_cache_bytes, kv_cache_expr, serve
from vrammath.inverse import Solution
from vrammath.lora import lora_param_count, lora_param_expr, lora_state_exprs
from vrammath.model import ModelSpec, from_hf_config
from vrammath.parallel import convention_bytes, shard_model_states, zero_paper_bytes, zero_stage
from vrammath.params import param_count, param_counts, param_exprs
from vrammath.plan import cheapest_fit
from vrammath.presets import gpu, load_config_file, load_gpus, load_model, model_names
from vrammath.quant import frozen_base_exprs
from vrammath.setup import Setup
from vrammath.states import RECIPES, bytes_per_param, model_state_bytes, model_state_exprs
from vrammath.sweep import sensitivities, sweep
from vrammath.units import GB, GiB, fmt_bytes, fmt_gb, fmt_gib

__version__ = "0.1.0"

__all__ = [
    "GB",
    "RECIPES",
    "Budget",
    "Component",
    "Estimate",
    "GiB",
    "InputError",
    "ModelSpec",
    "Serve",
    "Setup",
    "Solution",
    "budget",
    "bytes_per_param",
    "cheapest_fit",
    "convention_bytes",
    "estimate",
    "fewest_gpus",
    "fit",
    "fmt_bytes",
    "fmt_gb",
    "fmt_gib",
    "from_hf_config",
    "frozen_base_exprs",
    "gpu",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "kv_cache_expr",
    "largest_micro_batch",
    "load_config_file",
    "load_gpus",
    "load_model",
    "longest_sequence",
    "lora_param_count",
    "lora_param_expr",
    "lora_state_exprs",
    "model_names",
    "model_state_bytes",
    "model_state_exprs",
    "param_count",
    "param_counts",
    "param_exprs",
    "sensitivities",
    "serve",
    "shard_model_states",
    "sweep",
    "zero_paper_bytes",
    "zero_stage",
]
