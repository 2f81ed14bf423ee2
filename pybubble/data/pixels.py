"""Data lines that describe samples in pixels, for native-resolution encoders:
``{"images": [[h, w], ...], "videos": [[frames, h, w], ...], "text": N}``, each image's grid of
patches decided by its processor's rules (:mod:`pybubble.config.processors`, also named here).
Torch-free."""

from __future__ import annotations

from typing import Any

from ..config.checks import array, integer
from ..config.processors import MAX_ASPECT, PROCESSORS, VisionProcessor, patches


def pixel_sample(doc: dict[str, Any], where: str, processor: VisionProcessor) -> tuple[list[tuple[int, int, int]], int]:
    """The grids of a data line's images then videos, and its text tokens:
    ``{"images": [[h, w], ...], "videos": [[frames, h, w], ...], "text": N}`` (each key optional);
    ValueError naming ``where`` and the field."""
    grids = []
    for key, fields in (("images", ("height", "width")), ("videos", ("frames", "height", "width"))):
        for i, size in enumerate(array(doc.get(key, []), f"{where}: {key}")):
            at = f"{where}: {key}[{i}]"
            size = array(size, at)
            if len(size) != len(fields):
                raise ValueError(f"{at}: {size!r} is not [{', '.join(fields)}] (sizes in pixels)")
            *frames, height, width = size
            grids.append(processor.grid(height, width, *frames, where=at))
    return grids, integer(doc.get("text", 0), f"{where}: text", minimum=0)


__all__ = ["MAX_ASPECT", "PROCESSORS", "VisionProcessor", "patches", "pixel_sample"]
