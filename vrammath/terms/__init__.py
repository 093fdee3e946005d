"""The formulas, one module per kind of memory: model states, sharding conventions, activations
(the Hugging Face-exact and Korthikanti families side by side), mixture of experts, LoRA and
quantization, the caching allocator. Each is a pure function of a model's parts and symbols;
nothing here composes a setup. Imports :mod:`vrammath.notation` and :mod:`vrammath.model`.
"""
