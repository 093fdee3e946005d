"""The one composition of a training setup: the setup and its checks (``setup``), the rows of
the term table and the context they read (``rows``, ``table``), the phase model (``peak``), the
busiest pipeline rank (``moe_stage``), the engines' own rules (``engines``, ``fsdp2``) and their
configuration files (``engine_config``, ``accelerate_config``), and
:func:`~vrammath.compose.estimate.estimate` itself.
"""
