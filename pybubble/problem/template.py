"""One encoder microbatch's kernel tasks as a template, the same for every microbatch of a pipeline:
for each encoder with images, its layers' kernels stage by stage with an activation send after
each stage but the last (the forward), then its stages in reverse with a gradient send before each
but the first (the backward; none for a frozen encoder). With ``to_llm`` the forward ends with the
send of the encoder's output to LLM rank 0 and the backward starts with its gradient's return.
Each task carries a lane tag (its encoder stage, or ``pp_enc`` for the lane on LLM rank 0 that
returns the gradient) and its predecessors as task ids within the microbatch;
:class:`~pybubble.problem.encoder.EncoderWork` lays the template out on a pipeline's lanes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..costs.kernels import PHASES, RESOURCES

TEMPLATE_KEYS = ("tag", "duration", "resource", "phase", "after", "after_offset")
"""The arrays of a template: per task its lane tag, duration (us), resource and phase (indices in
``RESOURCES`` and ``PHASES``), and its predecessors (``after``, task ids, task i's from
``after_offset[i]`` to ``after_offset[i + 1]``)."""


class _Template:
    """A template as it is built: its arrays in parts, and how many tasks they hold."""

    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {k: [] for k in ("tag", "duration", "resource", "phase", "counts",
                                                                    "after")}
        self.size = 0

    def add(self, tag: np.ndarray, duration: np.ndarray, resource: np.ndarray, phase: int, counts: np.ndarray,
            after: np.ndarray) -> None:
        """Tasks with these lane tags, durations and resources, all of `phase`, with `counts`
        predecessors each, listed in `after`."""
        for key, value in (("tag", tag), ("duration", duration), ("resource", resource),
                           ("phase", np.full(len(tag), phase, np.int64)), ("counts", counts), ("after", after)):
            self.parts[key].append(value)
        self.size += len(tag)

    def task(self, lane_tag: int, duration: float, resource: str, phase: str, preds: list[int]) -> int:
        """One task (a send); returns its id."""
        self.add(np.array([lane_tag]), np.array([duration]), np.array([RESOURCES.index(resource)]),
                 PHASES.index(phase), np.array([len(preds)]), np.array(preds, np.int64))
        return self.size - 1

    def layers(self, per_layer: list[tuple[Any, float]], count: int, lane_tag: int, phase: str,
               prev: int | None) -> int | None:
        """Lays out `count` layers; returns the task that ends the last layer's dependency chain.
        Within a layer the kernels wait as the decomposition says; its root kernels (no
        predecessor in the layer) wait for the previous layer's chain end, or for `prev`."""
        if count == 0:
            return prev
        k_n = len(per_layer)
        # the chain continues from the last kernel that is not a dangling weight-gradient GEMM
        last = max(i for i, (k, _) in enumerate(per_layer) if not k.name.endswith("_wgrad"))
        rel = np.array([a for k, _ in per_layer for a in (k.after or (-1,))], np.int64)
        counts = np.array([len(k.after) or 1 for k, _ in per_layer], np.int64)
        root_kernel = np.array([not k.after for k, _ in per_layer])
        root = rel < 0
        base = self.size + k_n * np.arange(count, dtype=np.int64)[:, None]  # first task of each layer
        after = np.where(root, base - k_n + last, base + rel)  # roots: the previous layer's end
        all_counts = np.tile(counts, count)
        if prev is None:  # the first layer's roots wait for nothing
            after = np.concatenate([after[0][~root], after[1:].reshape(-1)])
            all_counts[:k_n][root_kernel] = 0
        else:
            after[0][root] = prev
            after = after.reshape(-1)
        self.add(np.full(count * k_n, lane_tag, np.int64), np.tile([t for _, t in per_layer], count),
                 np.tile([RESOURCES.index(k.resource) for k, _ in per_layer], count), PHASES.index(phase),
                 all_counts, after)
        return self.size - k_n + last

    def arrays(self) -> dict[str, np.ndarray]:
        """The template's arrays (:data:`TEMPLATE_KEYS`)."""
        out = {k: np.concatenate(v) for k, v in self.parts.items()}
        out["duration"] = out["duration"].astype(np.float64)
        out["after_offset"] = np.concatenate([[0], np.cumsum(out.pop("counts"))]).astype(np.int64)
        return out


def _chain(prev: int | None) -> list[int]:
    """The predecessors of a task that waits for `prev` (none when None)."""
    return [] if prev is None else [prev]


def microbatch_template(chains: list[tuple[Any, bool]], pp_enc: int, to_llm: bool) -> dict[str, np.ndarray]:
    """One microbatch's tasks (:data:`TEMPLATE_KEYS`) from `chains`: per encoder with images,
    ((one layer's kernels with durations per phase, the send of its output, its layers per
    encoder stage), whether it is frozen); all forwards first, then all backwards, in the order of
    `chains`. `to_llm`: with the sends of the output to LLM rank 0 and of its gradient back."""
    build = _Template()
    last_stage = pp_enc - 1
    ends = []
    for (per_phase, send, layers), _ in chains:
        prev: int | None = None
        for e, n in enumerate(layers):
            prev = build.layers(per_phase["fwd"], n, e, "fwd", prev)
            if e < last_stage:
                prev = build.task(e, send, "comm", "fwd", _chain(prev))
        if to_llm:  # the encoder's output goes to LLM stage 0
            prev = build.task(last_stage, send, "comm", "fwd", _chain(prev))
        ends.append(prev)
    for ((per_phase, send, layers), frozen), end in zip(chains, ends):
        if frozen:
            continue
        prev = end
        if to_llm:  # its gradient comes back from LLM stage 0
            prev = build.task(pp_enc, send, "comm", "bwd", _chain(prev))
        for e in range(last_stage, -1, -1):
            prev = build.layers(per_phase["bwd"], layers[e], e, "bwd", prev)
            if e > 0:
                prev = build.task(e, send, "comm", "bwd", _chain(prev))
    return build.arrays()


__all__ = ["TEMPLATE_KEYS", "microbatch_template"]
