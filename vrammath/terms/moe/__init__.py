"""Mixture of experts: total and active parameters and expert parallelism (``params``), the
states of a PP x EP x TP x DP layout (``layout``), and the op-by-op phase peaks of the MoE block
(``peaks``, ``deepseek``).
"""
