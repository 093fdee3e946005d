"""FSDP2 applied to a Hugging Face decoder the way the engines that run it apply it.

:func:`wrap_fsdp2` shards a model built in ``FakeTensorMode`` over a fake mesh, as
:mod:`vrammath.measure.engine_runs` measures it:

* ``wrap="torchtitan"``: ``fully_shard`` on every decoder layer, then on the model (the root
  keeps the embeddings, the final norm and the head), ``MixedPrecisionPolicy(param_dtype=bf16,
  reduce_dtype=fp32)``, as torchtitan's ``apply_fsdp`` does;
* ``wrap="accelerate"``: as accelerate 1.15's ``fsdp2_prepare_model``
  (``accelerate/utils/fsdp_utils.py``) does under ``mixed_precision: bf16`` on an untied model:
  every decoder layer, the input embedding, ``[final norm, head]`` with
  ``reshard_after_forward=False``, then the model with FSDP2's own default for the root;
  ``MixedPrecisionPolicy(param_dtype=reduce_dtype=output_dtype=bf16)``; and the forward
  wrapped as ``Accelerator.prepare_model`` wraps it under native AMP: ``torch.autocast`` (here
  the CPU's) and ``convert_outputs_to_fp32``, so the outputs come back in fp32.
"""

from __future__ import annotations

from types import MethodType
from typing import Any, Literal

from vrammath.measure.step import _decoder_layers

Wrap = Literal["torchtitan", "accelerate"]


def wrap_fsdp2(net: Any, mesh: Any, *, wrap: Wrap, reshard: bool, offload: bool) -> None:
    """Apply ``fully_shard`` to ``net`` in place (call inside FakeTensorMode)."""
    import torch
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )

    bf16 = torch.bfloat16
    policy = (
        MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16, output_dtype=bf16)
        if wrap == "accelerate"
        else MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=torch.float32)
    )
    kw: dict[str, Any] = {
        "mesh": mesh,
        "mp_policy": policy,
        "reshard_after_forward": reshard,
        "offload_policy": CPUOffloadPolicy(pin_memory=False) if offload else OffloadPolicy(),
    }
    for block in _decoder_layers(net):
        fully_shard(block, **kw)
    if wrap == "accelerate":
        inner = net.get_input_embeddings()
        head = net.get_output_embeddings()
        if head is None or head.weight is inner.weight:
            raise ValueError("model: the accelerate wrap is replicated for untied models only")
        fully_shard(inner, **kw)
        fully_shard([net.model.norm, head], **{**kw, "reshard_after_forward": False})
        kw = {k: v for k, v in kw.items() if k != "reshard_after_forward"}
    fully_shard(net, **kw)
    if wrap == "accelerate":
        from accelerate.utils import convert_outputs_to_fp32

        forward = torch.autocast(device_type="cpu", dtype=bf16)(type(net).forward)
        net.forward = MethodType(convert_outputs_to_fp32(forward), net)


__all__ = ["Wrap", "wrap_fsdp2"]
