"""timm and transformers beside a CPU-only torch (:func:`import_vision_libraries`)."""

from __future__ import annotations

import sys

import torch


def import_vision_libraries() -> None:
    """Makes timm and transformers importable beside a CPU-only torch: PyPI's torchvision wheels
    link CUDA torch libraries, so beside the CPU build their operator library does not load and
    ``import torchvision`` fails registering ``torchvision::nms``; defining the two operators' schemas
    lets its pure-Python models import (nothing here calls them)."""
    try:
        import torchvision  # noqa: F401
    except RuntimeError as e:
        if "torchvision::nms" not in str(e):
            raise
        lib = torch.library.Library("torchvision", "FRAGMENT")
        for name in ("nms", "qnms"):
            lib.define(f"{name}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _keep.append(lib)
        for mod in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[mod]


_keep: list = []


__all__ = ["import_vision_libraries"]
