"""The model: its parts (:mod:`~vrammath.model.spec`), exact parameter counts, one reader per
Hugging Face ``model_type``, the Hub client and the presets of ``conf/`` (models and GPUs).
Imports only :mod:`vrammath.notation`.
"""
