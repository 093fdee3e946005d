"""Serving: the KV cache, weights in their serving format, and the serving estimate.
Imports :mod:`vrammath.notation`, :mod:`vrammath.model` and :mod:`vrammath.terms`.
"""
