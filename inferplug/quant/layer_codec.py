"""The loader's weights (float tensors and the quantized layers) as a JSON-able layout plus a list of tensors, and
back: what the conversion cache (models/conversion_cache.py) writes and maps.

    flatten(obj, tensors)  -> a layout dict; obj's tensors appended to `tensors`, the layout naming their indices
    rebuild(layout, tensor) -> the object again, `tensor(i)` giving the i-th tensor (a view of the mapped file)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from inferplug.quant.block_linear import MXFP4Linear, Q4G128Linear, Q4Linear, Q8HeadLinear, Q8Linear
from inferplug.quant.kquant_linear import Q4KLinear, Q5_0Linear, Q5KLinear, Q6KHeadLinear, Q6KLinear
from inferplug.quant.checkpoint_layers import GroupInt4Linear, PermutedLinear, RowPartsLinear

BLOCK_KINDS = {cls.__name__: cls for cls in (Q4Linear, Q4G128Linear, Q4KLinear, Q5_0Linear, Q5KLinear, Q6KLinear,
                                                   Q6KHeadLinear, Q8Linear, Q8HeadLinear, MXFP4Linear)}
GROUP_FIELDS = ("qweight", "scales", "zeros", "bias")


def flatten(obj, tensors: list[torch.Tensor]) -> dict:
    """TypeError for an object the cache cannot hold (a new layer class needs a case here and in rebuild)."""

    def add(tensor: torch.Tensor | None) -> int | None:
        if tensor is None:
            return None
        tensors.append(tensor.detach().cpu().contiguous())
        return len(tensors) - 1

    if isinstance(obj, torch.Tensor):
        return {"kind": "tensor", "tensor": add(obj)}
    if type(obj) in BLOCK_KINDS.values():  # exactly: a subclass may hold more than its blocks
        return {"kind": type(obj).__name__, "blocks": add(obj.blocks), "bias": add(obj.bias)}
    if isinstance(obj, PermutedLinear):
        return {"kind": "PermutedLinear", "inner": flatten(obj.inner, tensors), "order": add(obj.order)}
    if isinstance(obj, RowPartsLinear):
        return {"kind": "RowPartsLinear", "parts": [flatten(part, tensors) for part in obj.parts]}
    if isinstance(obj, GroupInt4Linear):
        return {"kind": "GroupInt4Linear", "group_size": obj.group_size,
                **{field: add(getattr(obj, field)) for field in GROUP_FIELDS}}
    raise TypeError(f"the conversion cache cannot hold a {type(obj).__name__}; give quant/layer_codec.py a case for it")


def rebuild(layout: dict, tensor: Callable[[int], torch.Tensor]):
    """ValueError (or KeyError / TypeError) for a layout flatten did not write: the cache then rebuilds the entry."""

    def get(index: int | None) -> torch.Tensor | None:
        return None if index is None else tensor(index)

    kind = layout["kind"]
    if kind == "tensor":
        return tensor(layout["tensor"])
    if kind in BLOCK_KINDS:
        return BLOCK_KINDS[kind](tensor(layout["blocks"]), get(layout["bias"]))
    if kind == "PermutedLinear":
        return PermutedLinear(rebuild(layout["inner"], tensor), tensor(layout["order"]))
    if kind == "RowPartsLinear":
        return RowPartsLinear([rebuild(part, tensor) for part in layout["parts"]])
    if kind == "GroupInt4Linear":
        qweight, scales, zeros, bias = (get(layout[field]) for field in GROUP_FIELDS)
        return GroupInt4Linear(qweight, scales, zeros, int(layout["group_size"]), bias)
    raise ValueError(f"unknown layer kind {kind!r}")
