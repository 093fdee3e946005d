"""LoRA and quantization: which projections a target name adapts (``targets``), the adapters'
parameters and states (``adapters``), and the storage formats of a quantized frozen base
(``quant``).
"""
