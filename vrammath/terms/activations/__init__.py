"""Activation memory as transformers' implementations keep it, exactly: the shared options
(:mod:`~vrammath.terms.activations.parts`), one layer (``layer``, ``gpt``, ``latent``), the
whole model (``model``) and the op-by-op peaks inside a layer (``peaks``).
"""
