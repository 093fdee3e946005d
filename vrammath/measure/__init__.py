"""Measure real training steps with PyTorch and compare them with vrammath (extra ``measure``).

Needs ``torch`` (2.13.0, CPU build is enough) and ``transformers`` 5.x; they are imported only when a
function here runs, so ``import vrammath.measure`` works without them.

* :func:`measure_training_step` -- bytes per category and per phase of real Hugging Face training
  steps, counted by PyTorch (fake tensors + ``MemTracker`` on a CPU, the CUDA allocator on a GPU).
* :mod:`vrammath.measure.matrix` -- the validation matrix (``python -m vrammath.measure.matrix``).
"""

from vrammath.measure.step import measure_training_step

__all__ = ["measure_training_step"]
