"""Activation memory in Korthikanti et al.'s convention: the published dense formulas
(``dense``), latent attention (``latent``), mixture-of-experts MLPs with capacity (``moe``) and
per pipeline rank of a layout (``layout``).
"""
