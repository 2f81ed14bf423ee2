"""An encoder's parallel plan over the LLM's GPUs, and the kernel tasks it gives the bubble scheduler.

Lane mapping. The encoder runs on the same GPUs as the LLM with its own plan (Optimus, §4):
``pp_enc`` divides ``pp_llm``, ``tp_enc`` divides ``tp_llm`` and ``dp_enc = m · dp_llm`` with
``m = (pp_llm / pp_enc) · (tp_llm / tp_enc)`` encoder pipelines inside one LLM data-parallel
replica. A lane is one encoder TP group, so LLM pipeline rank ``s`` has ``lanes_per_stage =
tp_llm / tp_enc`` lanes, numbered ``lane = s · lanes_per_stage + k``. Encoder stage ``e`` lives on the
``r = pp_llm / pp_enc`` LLM ranks ``e·r .. e·r + r - 1``; encoder pipeline ``i`` (0 <= i < m) puts
its stage ``e`` on LLM rank ``e·r + i // lanes_per_stage``, lane ``k = i % lanes_per_stage``. The
encoder pipelines thus tile the LLM ranks: every lane holds exactly one stage of one pipeline.

Tasks. Encoder microbatch ``j`` runs on the pipeline that the partition gives it: its forward
through the encoder stages (one ``comm`` task for each stage boundary: the activation send), then
its backward in reverse (a ``comm`` task for each gradient send); a frozen encoder has no backward.
The LLM consumes the encoder's output on LLM rank 0: when the pipeline's last stage sits on another
LLM rank, one more ``comm`` task (on that last stage's lane) sends the output there, and the
backward starts with a ``comm`` task on lane ``i % lanes_per_stage`` of LLM rank 0 that sends its
gradient back. All sends are pipeline point-to-point transfers of ``micro_batch · tokens · hidden``
elements split over the ``tp_enc`` ranks, priced by ``CostModel.p2p_time`` (across nodes).
Several encoders give parallel chains in the same microbatch (all forwards of ``j`` first, then
all backwards). Tasks come out as :class:`~pybubble.problem.arrays.Tasks` (list index = id).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config.checks import flag, integer, positive_int, shown
from ..config.limits import MAX_TASKS
from ..config.models import EncoderConfig
from ..costs.kernels import PHASES
from ..costs.memory import encoder_layer_bytes, recompute_bytes
from ..costs.roofline import CostModel
from ..llm.step import even_split
from .arrays import Tasks
from .template import microbatch_template

if TYPE_CHECKING:
    from .problem import Problem


@dataclass(kw_only=True, slots=True)
class EncoderPlan:
    """The encoder's parallel plan relative to the LLM's (per LLM data-parallel replica)."""

    pp_enc: int
    """Encoder pipeline stages; divides ``pp_llm``."""
    tp_enc: int
    """Encoder tensor-parallel degree; divides ``tp_llm``."""
    pp_llm: int
    """LLM pipeline stages."""
    tp_llm: int
    """LLM tensor-parallel degree."""

    def __post_init__(self) -> None:
        for name in ("pp_enc", "tp_enc", "pp_llm", "tp_llm"):
            positive_int(getattr(self, name), name)
        if self.pp_llm % self.pp_enc:
            raise ValueError(f"pp_enc: {self.pp_enc} does not divide pp_llm ({self.pp_llm})")
        if self.tp_llm % self.tp_enc:
            raise ValueError(f"tp_enc: {self.tp_enc} does not divide tp_llm ({self.tp_llm})")

    @property
    def lanes_per_stage(self) -> int:
        """Encoder TP groups per LLM pipeline rank."""
        return self.tp_llm // self.tp_enc

    @property
    def pipelines(self) -> int:
        """m: encoder pipelines per LLM data-parallel replica (dp_enc = m · dp_llm)."""
        return (self.pp_llm // self.pp_enc) * self.lanes_per_stage

    def llm_rank(self, pipeline: int, stage: int) -> int:
        """The LLM pipeline rank that holds encoder pipeline `pipeline`'s stage `stage`."""
        return stage * (self.pp_llm // self.pp_enc) + pipeline // self.lanes_per_stage

    def lane(self, pipeline: int, stage: int) -> int:
        """The lane of encoder pipeline `pipeline`'s stage `stage` (see the module docstring)."""
        return self.llm_rank(pipeline, stage) * self.lanes_per_stage + pipeline % self.lanes_per_stage

    def llm_input_lane(self, pipeline: int) -> int:
        """The lane on LLM rank 0 that exchanges pipeline `pipeline`'s output and its gradient."""
        return pipeline % self.lanes_per_stage

    def stage_layers(self, layers: int) -> list[int]:
        """Layers per encoder stage (:func:`even_split`)."""
        return even_split(layers, self.pp_enc)


class EncoderWork:
    """The encoder(s)' kernel tasks under one plan, built once and laid out for any partition.

    Every microbatch of a pipeline has the same tasks; only its lanes depend on the pipeline, and
    only its sends on whether the pipeline's last stage sits on LLM stage 0. So the work keeps one
    microbatch's tasks (at most two variants) with each task's lane as a tag (encoder stage, or
    ``pp_enc`` for the LLM rank 0 lane that returns the gradient), and :meth:`tasks` lays out a
    partition with NumPy: a partition costs microseconds, not a Python loop over tasks.

    Arguments as :func:`encoder_tasks` (without the partition); ``like``: a work of the same
    encoders, costs and stages under another count of pipelines, whose per-layer costs and templates
    it shares. ``separate=True`` places the encoder on GPUs of its own (non-colocated): the plan's
    "LLM ranks" are then the encoder's own GPU groups, every pipeline sends its output to the LLM
    and receives the gradient on its last stage's lane.
    """

    def __init__(self, encoders: EncoderConfig | Sequence[EncoderConfig], *, plan: EncoderPlan,
                 micro_batch: int | Sequence[int], costs: CostModel, tokens: int | None = None,
                 frozen: bool | Sequence[bool] = False, sequence_parallel: bool = False,
                 separate: bool = False, recompute: str = "none", like: EncoderWork | None = None):
        models, flags, images = _per_encoder(encoders, frozen, micro_batch)
        self.plan = plan
        """The encoder plan."""
        self.separate = separate
        """Whether the encoder runs on GPUs of its own."""
        self._models, self._images, self._recompute = models, tuple(images), recompute
        self._costs, self._tokens, self._sequence_parallel = costs, tokens, sequence_parallel
        self._layer_costs: dict[tuple[int, ...], list[Any]] = {}
        self._flags = flags
        self._templates: dict[tuple[bool, tuple[int, ...]], dict[str, np.ndarray]] = {}
        self._bytes: tuple[np.ndarray, list[np.ndarray], np.ndarray] | None = None
        key = (plan.pp_enc, plan.tp_enc, self._images, separate, flags, tokens, sequence_parallel, recompute, models)
        if like is not None and like._costs is costs and like._key == key:  # another count of pipelines
            self._layer_costs, self._templates = like._layer_costs, like._templates
        self._key = key
        self._blocks: dict[tuple[int, int], dict[str, np.ndarray]] = {}
        self._spread_blocks: dict[tuple[tuple[int, ...], ...], dict[str, np.ndarray]] = {}
        self._problem_blocks: dict[int, tuple[Problem, list[Problem]]] = {}
        self._pipeline_tasks: list[int] | None = None  # tasks of one microbatch on each pipeline

    @property
    def images(self) -> tuple[int, ...]:
        """Images of one encoder microbatch, per encoder."""
        return self._images

    def _layer_cost(self, images: tuple[int, ...]) -> list[Any]:
        """Per encoder: one layer's kernels with durations at `images` images (forward and
        backward), the send of its output, and its layers per stage; None for an encoder with no
        image. Computed once per image counts."""
        if images not in self._layer_costs:
            plan, costs, out = self.plan, self._costs, []
            for mdl, n in zip(self._models, images):
                if n == 0:
                    out.append(None)
                    continue
                s = self._tokens if self._tokens is not None else mdl.tokens
                per_phase = {phase: costs.layer_kernels(mdl, n, s, tp=plan.tp_enc,
                                                        sequence_parallel=self._sequence_parallel, phase=phase,
                                                        recompute=self._recompute) for phase in PHASES}
                send = costs.p2p_time(float(mdl.dtype_bytes * n * s * mdl.hidden) / plan.tp_enc)
                out.append((per_phase, send, plan.stage_layers(mdl.layers)))
            self._layer_costs[images] = out
        return self._layer_costs[images]

    def _template(self, to_llm: bool, images: tuple[int, ...] | None = None) -> dict[str, np.ndarray]:
        """One microbatch's tasks (at `images` images per encoder, default the microbatch's): lane
        tags, durations, resources, phases and relative `after` (:func:`microbatch_template`)."""
        images = self._images if images is None else images
        key = (to_llm, images)
        if key not in self._templates:
            chains = [(cost, frozen) for cost, frozen in zip(self._layer_cost(images), self._flags) if cost is not None]
            self._templates[key] = microbatch_template(chains, self.plan.pp_enc, to_llm)
        return self._templates[key]

    def _pipeline_template(self, pipeline: int, images: tuple[int, ...] | None = None) -> dict[str, np.ndarray]:
        """The template of `pipeline`'s microbatches (or pieces of `images` images): with the send to
        LLM rank 0 when its last stage sits elsewhere (or the encoder runs on GPUs of its own)."""
        return self._template(self.separate or self.plan.llm_rank(pipeline, self.plan.pp_enc - 1) != 0, images)

    def microbatch_tasks(self, pipeline: int, images: Sequence[int] | None = None) -> Tasks:
        """One microbatch's tasks on `pipeline` (microbatch 0, task ids from 0); with `images` (one
        count per encoder), a piece of that many images instead of the whole microbatch."""
        plan = self.plan
        t = self._pipeline_template(pipeline, None if images is None else self._piece_images(images))
        grad_in = plan.lane(pipeline, plan.pp_enc - 1) if self.separate else plan.llm_input_lane(pipeline)
        lanes = np.array([plan.lane(pipeline, e) for e in range(plan.pp_enc)] + [grad_in], np.int64)
        return Tasks(lane=lanes[t["tag"]], microbatch=np.zeros(len(t["tag"]), np.int64),
                     **{k: v for k, v in t.items() if k != "tag"})

    def piece_compute(self, images: Sequence[int]) -> np.ndarray:
        """The compute time of a piece of `images` (one count per encoder) on each encoder stage's
        lane, forward and backward (stages x 2, us): what its tasks' compute kernels
        (:meth:`microbatch_tasks`) sum to, from one layer's kernels and the layers per stage, without
        building them."""
        out = np.zeros((self.plan.pp_enc, 2))
        for cost, frozen in zip(self._layer_cost(self._piece_images(images)), self._flags):
            if cost is None:
                continue
            per_phase, _, layers = cost
            for ph, phase in enumerate(PHASES):
                if ph == 1 and frozen:
                    continue
                layer = sum(d for k, d in per_phase[phase] if k.resource == "compute")
                out[:, ph] += layer * np.asarray(layers, np.float64)
        return out

    def _block(self, pipeline: int, count: int) -> dict[str, np.ndarray]:
        """`count` microbatches on `pipeline`, numbered from 0, task ids from 0 (cached: a search
        lays out the same blocks in many partitions)."""
        key = (pipeline, count)
        if key not in self._blocks:
            t = self.microbatch_tasks(pipeline)
            n = len(t)
            block = {k: np.tile(getattr(t, k), count) for k in ("lane", "duration", "resource", "phase")}
            block["microbatch"] = np.repeat(np.arange(count, dtype=np.int64), n)
            block["after_counts"] = np.tile(np.diff(t.after_offset), count)
            block["after"] = (t.after[None, :] + n * np.arange(count, dtype=np.int64)[:, None]).reshape(-1)
            self._blocks[key] = block
        return self._blocks[key]

    def check_partition(self, partition: Sequence[int]) -> list[int]:
        """`partition` checked: one count of microbatches per pipeline, their tasks within the
        limit (ValueError naming the field)."""
        partition = _counts(partition, self.plan.pipelines)
        if self._pipeline_tasks is None:
            self._pipeline_tasks = [len(self._pipeline_template(i)["tag"]) for i in range(self.plan.pipelines)]
        total = sum(t * n for t, n in zip(self._pipeline_tasks, partition))
        if total > MAX_TASKS:
            raise ValueError(f"partition: {sum(partition):,} encoder microbatches make {total:,} kernel tasks, "
                             f"more than the limit of {MAX_TASKS:,}")
        return partition

    def lanes_durations(self, partition: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The lane and the duration of each task of :meth:`tasks` (same order), without the rest."""
        blocks = [self._block(i, n) for i, n in enumerate(self.check_partition(partition)) if n > 0]
        return (np.concatenate([np.zeros(0, np.int64)] + [b["lane"] for b in blocks]),
                np.concatenate([np.zeros(0)] + [b["duration"] for b in blocks]))

    def problem(self, bubbles: Problem, partition: Sequence[int]) -> Problem:
        """The problem of `partition`'s tasks (:meth:`tasks`) on `bubbles` (a problem with no task):
        each pipeline's one-microbatch tasks checked once on them as a block (kept for the next
        partition), copied by the core once per microbatch (:meth:`Problem.joined`)."""
        held = self._problem_blocks.get(id(bubbles))
        if held is None or held[0] is not bubbles:
            held = self._problem_blocks[id(bubbles)] = (
                bubbles, [bubbles.with_tasks(self.microbatch_tasks(i)) for i in range(self.plan.pipelines)])
        return bubbles.joined(held[1], self.check_partition(partition))

    def tasks(self, partition: Sequence[int]) -> Tasks:
        """The tasks of a partition (microbatches numbered pipeline by pipeline)."""
        partition = self.check_partition(partition)
        return _joined([self._block(i, n) for i, n in enumerate(partition) if n > 0],
                       [n for n in partition if n > 0])

    def _piece_images(self, images: Sequence[int]) -> tuple[int, ...]:
        """`images` (one count per encoder, each at most the microbatch's) as a checked tuple."""
        if isinstance(images, (str, bytes)) or not isinstance(images, (Sequence, np.ndarray)) \
                or len(images) != len(self._images):
            raise ValueError(f"images: {shown(images)} is not one image count for each of the {len(self._images)} "
                             "encoders")
        out = tuple(integer(n, f"images[{e}]", minimum=0, maximum=full)
                    for e, (n, full) in enumerate(zip(images, self._images)))
        if not any(out):
            raise ValueError(f"images: {shown(images)} holds no image")
        return out

    def split_images(self, share: Sequence[int]) -> list[tuple[int, ...]]:
        """Per pipeline, the images of each encoder that a microbatch spread by `share` (one weight
        per pipeline) gives it: each encoder's images in proportion to the weights, whole images by
        largest remainder (ties to the last pipelines, which sit on the later LLM stages: those idle
        longest at the start and the end of the step). A tile or image is the unit: its layers run
        on one lane, its output goes to LLM stage 0 and its gradient comes back from there."""
        share = _share(list(share), self.plan.pipelines, "share")
        w = np.array(share, np.float64)
        per_encoder = []
        for n in self._images:
            raw = n * w / w.sum()
            got = np.floor(raw).astype(np.int64)
            rest = n - int(got.sum())
            got[(len(raw) - 1 - np.argsort(-(raw - got)[::-1], kind="stable"))[:rest]] += 1
            per_encoder.append(got)
        return [tuple(int(g[i]) for g in per_encoder) for i in range(len(share))]

    def _spread_block(self, share: tuple[int, ...]) -> dict[str, np.ndarray]:
        """One microbatch spread over the pipelines by `share`: each pipeline's piece laid out on its
        lanes, the pieces' tasks merged fraction by fraction (within each phase, the tasks of every
        piece in the order of their place in the piece), so a prefix or suffix of the microbatch's
        tasks in id order holds a like part of every piece. Task ids from 0, microbatch 0 (cached)."""
        split = tuple(self.split_images(share))
        if split not in self._spread_blocks:
            held = [images for images in split if any(images)]
            pieces = [self.microbatch_tasks(i, images) for i, images in enumerate(split) if any(images)]
            self._spread_blocks[split] = _merged_pieces(pieces, held)
        return self._spread_blocks[split]

    def layout_tasks(self, layout: Sequence[int | Sequence[int]]) -> Tasks:
        """The tasks of a layout: encoder microbatch j runs whole on pipeline ``layout[j]`` (an
        int), or spread over the pipelines by the share ``layout[j]`` (one weight per pipeline,
        :meth:`split_images`). Microbatches are numbered in the layout's order."""
        if isinstance(layout, (str, bytes)) or not isinstance(layout, (Sequence, np.ndarray)):
            raise ValueError(f"layout: {shown(layout)} is not a list of placements")
        shares = [_share(p, self.plan.pipelines, f"layout[{j}]") for j, p in enumerate(layout)]
        total = sum(sum(len(self._pipeline_template(i, images)["tag"]) for i, images in
                        enumerate(self.split_images(sh)) if any(images)) for sh in dict.fromkeys(shares))
        if total > MAX_TASKS:  # the distinct placements alone: checked before the whole layout is built
            raise ValueError(f"layout: {len(layout):,} encoder microbatches make more than {MAX_TASKS:,} kernel tasks")
        blocks = [self._spread_block(sh) for sh in shares]
        if sum(len(b["lane"]) for b in blocks) > MAX_TASKS:
            raise ValueError(f"layout: {len(layout):,} encoder microbatches make "
                             f"{sum(len(b['lane']) for b in blocks):,} kernel tasks, more than the limit of {MAX_TASKS:,}")
        return _joined(blocks, [1] * len(blocks))

    def layout_images(self, layout: Sequence[int | Sequence[int]]) -> np.ndarray:
        """Per task of :meth:`layout_tasks` (same order), the images of each encoder its piece holds
        (tasks x encoders): a whole microbatch's tasks hold all of them."""
        blocks = [self._spread_block(_share(p, self.plan.pipelines, f"layout[{j}]")) for j, p in enumerate(layout)]
        return np.concatenate([b["images"] for b in blocks]) if blocks else np.zeros((0, len(self._images)), np.int64)

    def _lane_bytes_terms(self) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
        """:func:`_lane_memory` of the work (computed once)."""
        if self._bytes is None:
            self._bytes = _lane_memory(self._models, self._flags, self._images, self.plan, self._recompute)
        return self._bytes

    def _bytes_held(self, held: np.ndarray) -> np.ndarray:
        """Per lane, the bytes when pipeline i holds ``held[e, i]`` microbatches' worth of encoder e's
        images at once (see :meth:`lane_bytes`)."""
        states, acts, rebuild = self._lane_bytes_terms()
        return (states + sum(held[e] @ act for e, act in enumerate(acts))
                + (rebuild * (held.sum(axis=0) > 0)[:, None]).max(axis=0))

    def lane_bytes(self, partition: Sequence[int]) -> np.ndarray:
        """Per lane, the encoders' model states and worst-case activations on one GPU of that lane's
        TP group under `partition` (every microbatch of a pipeline held at once: bubble scheduling
        may run all forwards before the first backward), and under full recomputation the largest
        layer's activations rebuilt during its backward."""
        counts = np.array(_counts(partition, self.plan.pipelines), np.float64)
        return self._bytes_held(np.tile(counts, (len(self._images), 1)))

    def layout_bytes(self, layout: Sequence[int | Sequence[int]]) -> np.ndarray:
        """:meth:`lane_bytes` of a layout (:meth:`layout_tasks`): a piece holds its share of its
        microbatch's activations (its images of each encoder over the microbatch's), every piece
        of every microbatch at once; the rebuilt layer counts in full on a pipeline with any piece."""
        held = np.zeros((len(self._images), self.plan.pipelines))
        for j, placement in enumerate(layout):
            for i, images in enumerate(self.split_images(_share(placement, self.plan.pipelines, f"layout[{j}]"))):
                held[:, i] += np.array(images, np.float64) / np.array(self._images, np.float64)
        return self._bytes_held(held)


def _share(placement: int | Sequence[int], m: int, where: str) -> tuple[int, ...]:
    """A microbatch's placement as its share per pipeline of the `m`: a pipeline index (the whole
    microbatch there) or one non-negative weight per pipeline, not all zero."""
    if isinstance(placement, (int, np.integer)) and not isinstance(placement, bool):
        i = integer(placement, where, minimum=0, maximum=m - 1)
        return tuple(int(k == i) for k in range(m))
    if isinstance(placement, (str, bytes)) or not isinstance(placement, (Sequence, np.ndarray)) \
            or len(placement) != m:
        raise ValueError(f"{where}: {shown(placement)} is neither a pipeline nor a share for each of the {m} "
                         "encoder pipelines")
    share = tuple(integer(w, f"{where}[{i}]", minimum=0) for i, w in enumerate(placement))
    if not any(share):
        raise ValueError(f"{where}: {shown(placement)} gives the microbatch to no pipeline")
    return share


def _counts(partition: Sequence[int], pipelines: int) -> list[int]:
    """`partition` checked: one count of microbatches >= 0 for each of `pipelines` (ValueError
    naming the field)."""
    if isinstance(partition, (str, bytes)) or not isinstance(partition, (Sequence, np.ndarray)):
        raise ValueError(f"partition: {shown(partition)} is not a list of microbatch counts")
    if len(partition) != pipelines:
        raise ValueError(f"partition: {len(partition)} entries, the plan has {pipelines} encoder pipelines")
    if all(type(n) is int and n >= 0 for n in partition):  # a search's own partitions: nothing to name
        return list(partition)
    return [integer(n, f"partition[{i}]", minimum=0) for i, n in enumerate(partition)]


def _per_encoder(encoders: EncoderConfig | Sequence[EncoderConfig], frozen: bool | Sequence[bool],
                 micro_batch: int | Sequence[int]) -> tuple[list[EncoderConfig], list[bool], list[int]]:
    """:class:`EncoderWork`'s arguments checked, one model, frozen flag and image count per encoder."""
    models = [encoders] if isinstance(encoders, EncoderConfig) else list(encoders)
    if not models:
        raise ValueError("encoders: empty")
    for mdl in models:
        if not isinstance(mdl, EncoderConfig):
            raise ValueError(f"encoders: {shown(mdl)} is not an EncoderConfig")
    flags = [frozen] * len(models) if isinstance(frozen, bool) else list(frozen)
    if len(flags) != len(models):
        raise ValueError(f"frozen: {len(flags)} flags for {len(models)} encoders")
    flags = [flag(f, f"frozen[{i}]") for i, f in enumerate(flags)]
    images = [micro_batch] * len(models) if not isinstance(micro_batch, Sequence) else list(micro_batch)
    if len(images) != len(models):
        raise ValueError(f"micro_batch: {len(images)} counts for {len(models)} encoders")
    images = [positive_int(n, f"micro_batch[{i}]" if isinstance(micro_batch, Sequence) else "micro_batch")
              for i, n in enumerate(images)]
    return models, flags, images


def _lane_memory(models: list[EncoderConfig], frozen: list[bool], images: tuple[int, ...], plan: EncoderPlan,
                 recompute: str) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """Per lane, the model states; per encoder, per pipeline and lane, the activations of one
    microbatch's images of that encoder; per pipeline and lane, the memory full recomputation
    rebuilds."""
    lanes = plan.pp_llm * plan.lanes_per_stage
    states, rebuild = np.zeros(lanes), np.zeros((plan.pipelines, lanes))
    acts = []
    for model, is_frozen, n in zip(models, frozen, images):
        act = np.zeros((plan.pipelines, lanes))
        s_bytes, a_bytes = encoder_layer_bytes(model, n, plan.tp_enc, is_frozen, recompute)
        rebuilt = 0.0 if is_frozen else recompute_bytes(model, n, model.tokens, plan.tp_enc, recompute)
        for e, layers in enumerate(plan.stage_layers(model.layers)):
            for pipeline in range(plan.pipelines):
                lane = plan.lane(pipeline, e)
                states[lane] += layers * s_bytes
                act[pipeline, lane] += layers * a_bytes
                if layers:
                    rebuild[pipeline, lane] = max(rebuild[pipeline, lane], rebuilt)
        acts.append(act)
    return states, acts, rebuild


def _merged_pieces(pieces: list[Tasks], held: list[tuple[int, ...]]) -> dict[str, np.ndarray]:
    """The pieces of one spread microbatch (each on its pipeline's lanes, holding `held` images of
    each encoder) as one block: their tasks merged fraction by fraction, within each phase in the
    order of their place in their piece, the predecessor lists renumbered."""
    sizes = np.array([len(t) for t in pieces])
    first = np.concatenate([[0], np.cumsum(sizes)])
    phase = np.concatenate([t.phase for t in pieces])
    place = np.concatenate([_place_in_phase(t.phase) for t in pieces])
    piece = np.repeat(np.arange(len(pieces)), sizes)
    order = np.lexsort((piece, place, phase))
    new_id = np.empty(len(order), np.int64)
    new_id[order] = np.arange(len(order))
    counts = np.concatenate([np.diff(t.after_offset) for t in pieces])
    after = np.concatenate([t.after + first[i] for i, t in enumerate(pieces)])
    offset = np.concatenate([[0], np.cumsum(counts)])
    # the predecessor lists of the tasks in their new order
    take = np.repeat(offset[:-1][order], counts[order]) + _ranks_within(counts[order])
    block = {k: np.concatenate([getattr(t, k) for t in pieces])[order] for k in ("lane", "duration", "resource")}
    block.update(phase=phase[order], microbatch=np.zeros(len(order), np.int64), after_counts=counts[order],
                 after=new_id[after[take]], images=np.array(held, np.int64).reshape(len(held), -1)[piece[order]])
    return block


def _joined(blocks: list[dict[str, np.ndarray]], counts: list[int]) -> Tasks:
    """Blocks of tasks one after another: block b holds `counts[b]` microbatches numbered from 0 and
    task ids from 0; both are shifted into place."""
    if not blocks:
        return Tasks.empty()
    keys = ("lane", "duration", "resource", "phase", "microbatch", "after_counts", "after")
    out = {k: np.concatenate([blk[k] for blk in blocks]) for k in keys}
    sizes = np.array([len(blk["lane"]) for blk in blocks])
    n = np.array(counts)
    out["microbatch"] += np.repeat(np.cumsum(n) - n, sizes)
    out["after"] += np.repeat(np.cumsum(sizes) - sizes, [len(blk["after"]) for blk in blocks])
    out["after_offset"] = np.concatenate([[0], np.cumsum(out.pop("after_counts"))]).astype(np.int64)
    return Tasks(**out)


def _place_in_phase(phase: np.ndarray) -> np.ndarray:
    """Each task's place among the tasks of its phase (0 or 1), as a fraction in [0, 1)."""
    fwd = phase == 0
    rank = np.where(fwd, np.cumsum(fwd) - 1, np.cumsum(~fwd) - 1)
    count = np.where(fwd, fwd.sum(), len(phase) - fwd.sum())
    return rank / np.maximum(count, 1)


def _ranks_within(counts: np.ndarray) -> np.ndarray:
    """0 .. c - 1 for each count c, concatenated."""
    total = int(counts.sum())
    return np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)


def encoder_tasks(encoders: EncoderConfig | Sequence[EncoderConfig], *, plan: EncoderPlan,
                  partition: Sequence[int], micro_batch: int | Sequence[int], costs: CostModel,
                  tokens: int | None = None, frozen: bool | Sequence[bool] = False,
                  sequence_parallel: bool = False, recompute: str = "none") -> list[dict[str, Any]]:
    """Kernel tasks of the encoder(s) for one training step, as problem/1 task dicts (no ``id``).

    `partition[i]` is the number of encoder microbatches that encoder pipeline ``i`` runs
    (``len(partition) == plan.pipelines``); microbatches are numbered pipeline by pipeline, so
    pipeline 0 runs ``j = 0 .. partition[0] - 1`` and so on. Each microbatch has `micro_batch`
    images (one count, or one per encoder) of `tokens` tokens (default: each encoder's own
    ``tokens``). `frozen` (one flag, or one per encoder) drops the backward; `recompute` adds the
    recomputed forward work to each layer's backward. Durations come from `costs`.
    :class:`EncoderWork` gives the same tasks as arrays, fast, for many partitions.
    """
    work = EncoderWork(encoders, plan=plan, micro_batch=micro_batch, costs=costs, tokens=tokens,
                       frozen=frozen, sequence_parallel=sequence_parallel, recompute=recompute)
    return work.tasks(partition).to_dicts()


__all__ = ["EncoderPlan", "EncoderWork", "encoder_tasks"]
