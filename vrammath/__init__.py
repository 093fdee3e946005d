"""vrammath: the GPU memory of training, fine-tuning and serving large language models, derived.

Every memory term is a sympy expression in named symbols (:mod:`vrammath.notation.symbols`), written once in
the module that owns it, evaluated for real models read from Hugging Face ``config.json`` files
(:mod:`vrammath.model.presets`), and checked against memory PyTorch itself counts (``vrammath.measure``,
an optional extra).

Scope: decoder-only transformers read from their config.json by one reader per ``model_type``
(:data:`vrammath.model.readers.READERS`: LLaMA, Mistral, Qwen2/3, Gemma 1-3, Phi-3, OLMo-2, StarCoder2,
GPT-2, GPT-NeoX, and the mixture-of-experts Mixtral, Qwen2/3-MoE and DeepSeek-V3 with its
latent attention (trained in bf16 with SDPA and expert parallelism, or in Korthikanti-style
layouts with a capacity factor); mixed-precision recipes; Adam/AdamW, SGD, 8-bit Adam,
Adafactor; ZeRO 0-3 / FSDP with CPU offload; tensor, sequence, pipeline and expert parallelism;
LoRA/QLoRA; serving with the KV cache. Units: bytes inside; GB (1e9) and GiB (2**30) are always labelled.

>>> import vrammath
>>> est = vrammath.estimate(vrammath.Setup(vrammath.load_model("llama-7b"), zero=3, gpus=8))
>>> est.component("weights").expr
2*P/N_d
"""

from vrammath.answers.budget import DEFAULT_RESERVE_BYTES, Budget, budget, exact_bytes
from vrammath.answers.claims import lora_gpt3_claims, qlora_65b_claims
from vrammath.answers.fit import Fit, fewest_gpus, fit, largest_micro_batch, longest_sequence
from vrammath.answers.formulas import FORMULAS, formula_exprs
from vrammath.answers.inverse import Solution, largest, smallest
from vrammath.answers.moe_layouts import (
    DEEPSEEK_V3_LAYOUT,
    LayoutMemory,
    deepseek_v3_training_memory,
    ep_state_bytes,
    ep_state_exprs,
    layout_memory,
)
from vrammath.answers.plan import Plan, cheapest_fit, recompute_cost
from vrammath.answers.report import (
    engine_line,
    engine_name,
    estimate_dict,
    estimate_table,
    hf_table,
    serve_dict,
    serve_table,
    vllm_table,
)
from vrammath.answers.sweep import sensitivities, sweep
from vrammath.compose.accelerate_config import accelerate_fields, simple_yaml
from vrammath.compose.engine_config import deepspeed_fields
from vrammath.compose.estimate import Component, Estimate, estimate
from vrammath.compose.setup import Setup
from vrammath.compose.torchtitan_config import torchtitan_fields
from vrammath.model.params import (
    COMPONENTS,
    largest_tensor_numel,
    param_count,
    param_counts,
    param_exprs,
    param_total_expr,
    size_values,
    tensors,
)
from vrammath.model.presets import (
    gpu,
    load_config_file,
    load_gpus,
    load_model,
    model_names,
    raw_config,
)
from vrammath.model.readers import from_hf_config
from vrammath.model.spec import ModelSpec
from vrammath.notation import symbols
from vrammath.notation.errors import ContextWarning, InputError
from vrammath.notation.units import (
    GB,
    GiB,
    MiB,
    dtype_bytes,
    fmt_bytes,
    fmt_gb,
    fmt_gib,
)
from vrammath.serve.estimate import Serve, serve
from vrammath.serve.generate import GeneratePeaks, decode_points, generate_peaks, prefill_points
from vrammath.serve.hf import Hf, HfServeEstimate, hf_serve
from vrammath.serve.kv_cache import kv_bytes_per_token, kv_cache_bytes, kv_cache_expr
from vrammath.serve.logs import LogComparison, compare_log
from vrammath.serve.vllm import Vllm, VllmBudget, vllm_budget
from vrammath.serve.weights import serving_weight_bytes
from vrammath.terms.activations.layer import hf_layer_bytes, hf_layer_terms

# Formula access for the handbook's pages, which import only from this package.
from vrammath.terms.activations.model import (
    activation_exprs,
    hf_activation_bytes,
    hf_activation_terms,
    hf_logits_loss_terms,
)
from vrammath.terms.korthikanti.dense import (
    korthikanti_first_stage_bytes,
    korthikanti_interleave_factor,
    korthikanti_layer_bytes,
    korthikanti_layer_terms,
)
from vrammath.terms.korthikanti.latent import mla_attention_terms
from vrammath.terms.korthikanti.layout import (
    BF16_FLASH,
    DEEPSEEK_V3_POLICY,
    ActivationPolicy,
    moe_layer_exprs,
)
from vrammath.terms.korthikanti.moe import expert_capacity, expert_rows, moe_mlp_terms
from vrammath.terms.lora.adapters import (
    lora_param_count,
    lora_param_expr,
    lora_state_exprs,
    lora_values,
)
from vrammath.terms.lora.quant import (
    NF4_BLOCK,
    NF4_DQ_BLOCK,
    frozen_base_exprs,
    nf4_published_bits_per_param,
)
from vrammath.terms.moe.layout import (
    DEEPSEEK_V3_RECIPE,
    Layout,
    RankParams,
    layout_state_bytes,
    layout_state_exprs,
)
from vrammath.terms.parallel import (
    FSDP_STRATEGIES,
    convention_bytes,
    zero_communication_elements,
    zero_paper_bytes,
    zero_stage,
)
from vrammath.terms.states import (
    BNB_BLOCK,
    BNB_MIN_8BIT_SIZE,
    RECIPES,
    bytes_per_param,
    model_state_bytes,
    model_state_exprs,
    optimizer_step_temp_bytes,
    state_values,
)

__version__ = "0.1.0"

__all__ = [
    "BF16_FLASH",
    "BNB_BLOCK",
    "BNB_MIN_8BIT_SIZE",
    "COMPONENTS",
    "DEEPSEEK_V3_LAYOUT",
    "DEEPSEEK_V3_POLICY",
    "DEEPSEEK_V3_RECIPE",
    "DEFAULT_RESERVE_BYTES",
    "FORMULAS",
    "FSDP_STRATEGIES",
    "GB",
    "NF4_BLOCK",
    "NF4_DQ_BLOCK",
    "RECIPES",
    "ActivationPolicy",
    "Budget",
    "Component",
    "ContextWarning",
    "Estimate",
    "Fit",
    "GeneratePeaks",
    "GiB",
    "Hf",
    "HfServeEstimate",
    "InputError",
    "Layout",
    "LayoutMemory",
    "LogComparison",
    "MiB",
    "ModelSpec",
    "Plan",
    "RankParams",
    "Serve",
    "Setup",
    "Solution",
    "Vllm",
    "VllmBudget",
    "accelerate_fields",
    "activation_exprs",
    "budget",
    "bytes_per_param",
    "cheapest_fit",
    "compare_log",
    "convention_bytes",
    "decode_points",
    "deepseek_v3_training_memory",
    "deepspeed_fields",
    "dtype_bytes",
    "engine_line",
    "engine_name",
    "ep_state_bytes",
    "ep_state_exprs",
    "estimate",
    "estimate_dict",
    "estimate_table",
    "exact_bytes",
    "expert_capacity",
    "expert_rows",
    "fewest_gpus",
    "fit",
    "fmt_bytes",
    "fmt_gb",
    "fmt_gib",
    "formula_exprs",
    "from_hf_config",
    "frozen_base_exprs",
    "generate_peaks",
    "gpu",
    "hf_activation_bytes",
    "hf_activation_terms",
    "hf_layer_bytes",
    "hf_layer_terms",
    "hf_logits_loss_terms",
    "hf_serve",
    "hf_table",
    "korthikanti_first_stage_bytes",
    "korthikanti_interleave_factor",
    "korthikanti_layer_bytes",
    "korthikanti_layer_terms",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "kv_cache_expr",
    "largest",
    "largest_micro_batch",
    "largest_tensor_numel",
    "layout_memory",
    "layout_state_bytes",
    "layout_state_exprs",
    "load_config_file",
    "load_gpus",
    "load_model",
    "longest_sequence",
    "lora_gpt3_claims",
    "lora_param_count",
    "lora_param_expr",
    "lora_state_exprs",
    "lora_values",
    "mla_attention_terms",
    "model_names",
    "model_state_bytes",
    "model_state_exprs",
    "moe_layer_exprs",
    "moe_mlp_terms",
    "nf4_published_bits_per_param",
    "optimizer_step_temp_bytes",
    "param_count",
    "param_counts",
    "param_exprs",
    "param_total_expr",
    "prefill_points",
    "qlora_65b_claims",
    "raw_config",
    "recompute_cost",
    "sensitivities",
    "serve",
    "serve_dict",
    "serve_table",
    "serving_weight_bytes",
    "simple_yaml",
    "size_values",
    "smallest",
    "state_values",
    "sweep",
    "symbols",
    "tensors",
    "torchtitan_fields",
    "vllm_budget",
    "vllm_table",
    "zero_communication_elements",
    "zero_paper_bytes",
    "zero_stage",
]
