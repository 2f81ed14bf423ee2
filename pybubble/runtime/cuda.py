"""The CUDA side of the bubble filler: a lowest-priority side stream, ordered with events.

With NCCL the CPU does not block in ``Work.wait()``: the wait is a dependency of the LLM's stream
on the communication stream, and the GPU's bubble comes later, when the LLM's stream gets there.
So on CUDA the filler does not run tasks while it waits, it enqueues them: :meth:`SideStream.launch`
records an event on the current (the LLM's) stream where the window opens, makes the side stream
wait for it and enqueues the task's kernels on the side stream. The LLM's stream waits for the
side stream only where it consumes a forward task's result (:meth:`SideStream.join` of the event
:meth:`SideStream.mark` recorded after the task) and at the end of the step
(:meth:`SideStream.drain`).

Stream priorities are a hint: a running kernel is never preempted, and NCCL's kernels hold whole
SMs. The filler therefore launches into a window only the tasks whose measured durations fit in
the predicted window (see :class:`~pybubble.runtime.filler.BubbleFiller`); this module only
orders streams.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch


def _cuda_device(device: torch.device | str | int | None) -> torch.device:
    if not torch.cuda.is_available():
        raise ValueError("device: 'cuda' but no CUDA device is available (torch.cuda.is_available() is False)")
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device: {str(device)!r} is not a CUDA device")
    return torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)


class SideStream:
    """A CUDA stream of the lowest priority for the encoder's tasks, ordered after the LLM's stream
    (the current stream where a task is launched) with events."""

    def __init__(self, device: torch.device | str | int | None = None):
        self.device = _cuda_device(device)
        least, _greatest = torch.cuda.Stream.priority_range()  # lower numbers are higher priorities
        self.stream = torch.cuda.Stream(device=self.device, priority=least)

    def _current(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    def launch(self, fn: Callable[[], None]) -> None:
        """Enqueues ``fn``'s kernels on the side stream, after everything enqueued so far on the
        current stream (the window opens when that stream gets here). ``fn`` runs under
        ``torch.cuda.stream(side)``, so autograd's backward calls in it take the side stream as
        their ambient stream; its inputs from the current stream are ordered by the event."""
        opened = self._current().record_event()
        self.stream.wait_event(opened)
        with torch.cuda.stream(self.stream):
            fn()

    def mark(self) -> torch.cuda.Event:
        """An event recorded on the side stream after everything launched so far."""
        return self.stream.record_event()

    def join(self, event: torch.cuda.Event) -> None:
        """The current stream waits for ``event`` (a :meth:`mark`) before its next kernels."""
        self._current().wait_event(event)

    def drain(self) -> None:
        """The current stream waits for everything launched on the side stream."""
        self._current().wait_stream(self.stream)


def side_stream(device: torch.device | str) -> SideStream | None:
    """The filler's mode for ``device``: None (tasks run on the host, the CPU path) for ``cpu``, a
    :class:`SideStream` on that GPU for ``cuda``. Raises ``ValueError`` for other devices and for
    ``cuda`` without a CUDA device."""
    device = torch.device(device)
    if device.type == "cpu":
        return None
    if device.type == "cuda":
        return SideStream(device)
    raise ValueError(f"device: {str(device)!r} is not cpu or cuda")


def llm_stream(device: torch.device | str | int | None = None) -> torch.cuda.Stream:
    """A stream of the highest priority for the LLM's step. The default stream has the lowest
    priority, the side stream's: run the step on this one so that the LLM's kernels go first."""
    device = _cuda_device(device)
    _least, greatest = torch.cuda.Stream.priority_range()
    return torch.cuda.Stream(device=device, priority=greatest)


def serialised_streams_note() -> str | None:
    """What ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (Megatron's setting for TP overlap) costs the filler,
    when it is set; None otherwise."""
    if os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1":
        return None
    return ("CUDA_DEVICE_MAX_CONNECTIONS=1 serialises all streams in launch order: encoder kernels "
            "launched after the communication that opens a window wait for it and then delay the "
            "LLM's next kernels instead of filling the bubble")
