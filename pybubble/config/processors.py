"""The image processors of native-resolution encoders: how Qwen2-VL and Qwen2.5-VL turn an image of
``h x w`` pixels (or a video of ``frames`` of them) into a grid ``(frames, rows, columns)`` of
patches (HF transformers' ``smart_resize``: each side a multiple of the patch times the merge size,
the area within ``min_pixels``/``max_pixels``, an aspect ratio of at most 200), its patches and its
LLM tokens (a merger folds ``merge x merge`` patches into one token). Torch-free; data lines in
pixels: :mod:`pybubble.data.pixels`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .checks import positive_int

MAX_ASPECT = 200
"""The largest aspect ratio (long side over short side) the processors take."""


@dataclass(frozen=True, kw_only=True, slots=True)
class VisionProcessor:
    """How a native-resolution encoder's processor turns an image of ``h x w`` pixels (or a video
    of ``frames`` of them) into a grid of patches."""

    patch: int = 14
    """Pixels of a patch's side."""
    merge: int = 2
    """Patches merged into one LLM token along each side (the merger's 2 x 2)."""
    temporal: int = 2
    """Frames of a temporal patch (an image is repeated to fill one; a video's last frame pads it)."""
    min_pixels: int = 56 * 56
    """The smallest area an image is resized to."""
    max_pixels: int = 28 * 28 * 1280
    """The largest area an image is resized to."""

    def __post_init__(self) -> None:
        for name in ("patch", "merge", "temporal", "min_pixels", "max_pixels"):
            positive_int(getattr(self, name), name)
        if self.min_pixels > self.max_pixels:
            raise ValueError(f"min_pixels: {self.min_pixels} is more than max_pixels {self.max_pixels}")

    @property
    def factor(self) -> int:
        """Each resized side is a multiple of this many pixels (the patch times the merge)."""
        return self.patch * self.merge

    def resize(self, height: int, width: int, where: str = "image") -> tuple[int, int]:
        """The size (pixels) the processor resizes an image of ``height x width`` to (HF's
        ``smart_resize``); ValueError naming ``where`` for a size below 1 pixel, not whole,
        or an aspect ratio over :data:`MAX_ASPECT`."""
        height, width = positive_int(height, f"{where}: height"), positive_int(width, f"{where}: width")
        if max(height, width) / min(height, width) > MAX_ASPECT:
            raise ValueError(f"{where}: {height} x {width} pixels: aspect ratio {max(height, width) / min(height, width):g}"
                             f", over the processor's limit of {MAX_ASPECT}")
        f = self.factor
        h, w = round(height / f) * f, round(width / f) * f
        if h * w > self.max_pixels:
            beta = math.sqrt(height * width / self.max_pixels)
            h, w = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
        elif h * w < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
        return h, w

    def grid(self, height: int, width: int, frames: int = 1, where: str = "image") -> tuple[int, int, int]:
        """``(t, rows, columns)`` of patches of ``frames`` frames of ``height x width`` pixels."""
        frames = positive_int(frames, f"{where}: frames")
        h, w = self.resize(height, width, where)
        return -(-frames // self.temporal), h // self.patch, w // self.patch

    def tokens(self, grid: tuple[int, int, int]) -> int:
        """LLM tokens of an image of ``grid`` (its patches over the merge's square)."""
        t, rows, cols = grid
        return t * rows * cols // (self.merge * self.merge)


PROCESSORS = {"qwen2_vl": VisionProcessor(), "qwen2_5_vl": VisionProcessor(),
              "qwen3_5": VisionProcessor(patch=16, min_pixels=65536, max_pixels=16777216)}
"""The processors by the model family that uses them: Qwen2-VL and Qwen2.5-VL share theirs
(transformers' defaults); Qwen3.5 (torchtitan's ``models/qwen3_5``): 16-pixel patches and the pixel
budget of torchtitan's qwen3_5 data config (256 x 256 to 4096 x 4096 pixels)."""


def patches(grid: tuple[int, int, int]) -> int:
    """Patches of an image of ``grid``: the length of its part of the packed sequence."""
    t, rows, cols = grid
    return t * rows * cols


__all__ = ["MAX_ASPECT", "PROCESSORS", "VisionProcessor", "patches"]
