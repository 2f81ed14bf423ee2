"""Writing matplotlib figures: the Agg backend (no display needed), the format from the file name
(PNG when it has no extension), and an atomic write."""

from __future__ import annotations

import os
from typing import Any

from ..config.documents import replacing


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (imported on first use: planning without pictures
    does not load matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def image_format(path: str | os.PathLike[str]) -> str:
    """The image format a file name asks for: its extension, or ``png`` without one."""
    return os.path.splitext(os.fspath(path))[1].lstrip(".").lower() or "png"


def save_figure(fig: Any, path: str | os.PathLike[str], dpi: int = 120) -> None:
    """Writes `fig` to `path` atomically in the format its name asks for, and closes it."""
    try:
        with replacing(path) as tmp:
            fig.savefig(tmp, dpi=dpi, format=image_format(path))
    finally:
        pyplot().close(fig)


__all__ = ["image_format", "pyplot", "save_figure"]
