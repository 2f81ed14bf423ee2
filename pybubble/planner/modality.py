"""The modality bubble model: the 1F1B step of a pipeline whose stages hold the modality encoder's
layers (first stages) and the LLM's layers (after them), predicted per stage, and the layer split
that minimises it.

Per pipeline stage ``i`` the model writes the step time as

    T_step = (M_b + B_θ)·(T_fwd + T_bwd) + B_y·M_b·T_fwd − B_θ·f(i)·(T_fwd + T_bwd)

with, for the stage's ``m`` encoder layers and ``l`` LLM layers:

- ``T_fwd``, ``T_bwd``: the stage's forward and backward time for one microbatch,
  ``m·t_enc + l·t_llm`` of each phase (:class:`LayerTimes`, from the cost model);
- ``M_b``: microbatches per step;
- ``B_θ = S − 1``: the pipeline (fill and drain) bubbles of 1F1B on ``S`` stages, in units of the
  stage's own ``T_fwd + T_bwd``: what every stage of a uniform pipeline waits;
- ``f(i)``: the hidden share, ``1 − P_i / (B_θ·(T_fwd + T_bwd))``, where ``P_i`` is the stage's
  actual fill-and-drain idle time: before its first forward, between its warm-up forwards, before
  its first backward, before its cool-down backwards, and after its last backward until the
  gradient has passed the stages before it. ``f > 0``: neighbours faster than the stage hide part
  of its pipeline bubble; ``f < 0``: slower neighbours or point-to-point latency lengthen it
  (``f = 0`` for one stage);
- ``B_y``: the modality bubbles at the stage, in units of its ``T_fwd`` per microbatch:
  ``Y_i / (M_b·T_fwd)``, where ``Y_i`` is the time the stage waits in the steady 1F1B phase for
  stages that are slower (unequal stages are what the encoder's layers create) plus the time from
  its own end to the end of the step.

How ``P_i`` and ``Y_i`` are obtained (our reading of the terms, which the formula leaves open):
stage ``i`` runs its own 1F1B action sequence (``min(S − i − 1, M_b)`` warm-up forwards, then
forward-backward pairs, then the remaining backwards) against a *relaxed* rest of the pipeline in
which every other stage is reduced to the dependencies it certainly imposes:

1. forward 0 arrives after the forwards of the stages before (``Σ_{j<i} T_fwd_j``, plus one
   point-to-point latency per hop);
2. the backward of microbatch ``k`` waits, for each later stage ``j`` (warm-up depth ``w_j``), for
   a chain through ``j``: one of this stage's forwards ``k0 <= min(k + w_j, M_b − 1)``, the
   forwards of the stages in between, stage ``j``'s own actions from its forward ``k0`` through its
   backward ``k`` in 1F1B order, and the backwards in between;
3. the forward of microbatch ``k`` waits, for each earlier stage ``j``, for the forwards and
   backwards that ``j`` runs before its forward ``k``, and for chains through ``j`` from this
   stage's backward ``y <= k − w_j − 1`` (``j``'s actions from its backward ``y`` through its
   forward ``k``);
4. after the stage's last backward the gradient passes the earlier stages (``Σ_{j<i} T_bwd_j``).

All four hold in the real schedule, so each stage's relaxed makespan is a lower bound of the
step; the prediction is the largest of them, ``T_step = max_i (M_b + B_θ·(1 − f(i)))·(T_fwd_i +
T_bwd_i) + (steady idle of i)``, and the terms of every stage sum to that same step (the stages
that end earlier carry the difference as modality bubbles). For a uniform pipeline ``f = B_y = 0``
and the formula is the textbook ``(M_b + S − 1)·(T_fwd + T_bwd)`` (plus the latencies).

Not modelled: interleaved or zero-bubble schedules (1F1B only), DP collectives at the step's ends,
and TP collectives other than inside the layer times. Times are microseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..config.checks import finite, integer, positive, real_array
from ..llm.step import LLMStep
from ..llm.timeline import Timeline, simulate_pipeline
from ..llm.step import even_split
from .layouts import encoder_layer_times
from .relaxed import OtherStage, relaxed_schedules, relaxed_stage

SCHEDULE = "1f1b"
"""The pipeline schedule the model describes."""


def _count(value: object, field: str, minimum: int) -> int:
    return integer(value, field, minimum=minimum)


def _latency(value: object) -> float:
    return finite(value, "p2p", minimum=0.0)


@dataclass(kw_only=True, slots=True)
class LayerTimes:
    """One layer's time for one microbatch on one pipeline stage, per kind and phase (us)."""

    encoder_fwd: float
    """Forward of one encoder layer."""
    encoder_bwd: float
    """Backward of one encoder layer (0 for a frozen encoder)."""
    llm_fwd: float
    """Forward of one LLM layer."""
    llm_bwd: float
    """Backward of one LLM layer."""

    def __post_init__(self) -> None:
        for name in ("encoder_fwd", "llm_fwd"):
            positive(getattr(self, name), name)
        for name in ("encoder_bwd", "llm_bwd"):
            finite(getattr(self, name), name, minimum=0.0)


def layer_times(step: LLMStep) -> LayerTimes:
    """The layer times of a config's MLLM, as the Megatron layouts run them (the stages hold both
    kinds): an LLM layer at the training micro batch and sequence length and the LLM's TP degree
    (:class:`pybubble.llm.step.LLMStep`), an encoder layer at the micro batch's images
    (:func:`pybubble.planner.layouts.encoder_layer_times`)."""
    config = step.config
    if len(config.encoders) != 1:
        raise ValueError(f"encoders: the modality model places one encoder's layers, the config has "
                         f"{len(config.encoders)}")
    (_, enc_fwd, enc_bwd), = encoder_layer_times(step)
    return LayerTimes(encoder_fwd=enc_fwd, encoder_bwd=enc_bwd, llm_fwd=step.layer_fwd, llm_bwd=step.layer_bwd)


@dataclass(kw_only=True, slots=True, frozen=True)
class LayerSplit:
    """Encoder and LLM layers per pipeline stage. Read in stage order, the layers are the encoder's
    followed by the LLM's: a stage that holds LLM layers is followed only by LLM stages. Every
    stage holds at least one layer."""

    encoder_layers: tuple[int, ...]
    """m_i: encoder layers on stage i."""
    llm_layers: tuple[int, ...]
    """l_i: LLM layers on stage i."""

    def __post_init__(self) -> None:
        enc = tuple(_count(v, f"encoder_layers[{i}]", 0) for i, v in enumerate(self.encoder_layers))
        llm = tuple(_count(v, f"llm_layers[{i}]", 0) for i, v in enumerate(self.llm_layers))
        object.__setattr__(self, "encoder_layers", enc)
        object.__setattr__(self, "llm_layers", llm)
        if not enc or len(enc) != len(llm):
            raise ValueError(f"llm_layers: {len(llm)} stages, encoder_layers has {len(enc)} (need equal, >= 1)")
        for i, (m, l) in enumerate(zip(enc, llm)):
            if m + l == 0:
                raise ValueError(f"encoder_layers[{i}]: stage {i} holds no layer")
            if m and any(llm[:i]):
                raise ValueError(f"encoder_layers[{i}]: {m} encoder layers after a stage with LLM layers")

    @property
    def stages(self) -> int:
        """Pipeline stages."""
        return len(self.encoder_layers)

    def stage_times(self, layers: LayerTimes) -> tuple[np.ndarray, np.ndarray]:
        """Per stage: forward and backward time of one microbatch."""
        m, l = np.array(self.encoder_layers, np.float64), np.array(self.llm_layers, np.float64)
        return m * layers.encoder_fwd + l * layers.llm_fwd, m * layers.encoder_bwd + l * layers.llm_bwd


def _split(encoder_layers: int, bounds: Sequence[int]) -> LayerSplit:
    """The split whose stage i holds the layers bounds[i] .. bounds[i+1] - 1 of the sequence
    (encoder layers 0 .. encoder_layers - 1, then the LLM's)."""
    enc, llm = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        m = max(0, min(b, encoder_layers) - a)
        enc.append(m)
        llm.append(b - a - m)
    return LayerSplit(encoder_layers=tuple(enc), llm_layers=tuple(llm))


def _check_layers(encoder_layers: int, llm_layers: int, stages: int) -> tuple[int, int, int]:
    e = _count(encoder_layers, "encoder_layers", 0)
    l_ = _count(llm_layers, "llm_layers", 0)
    s = _count(stages, "stages", 1)
    if e + l_ < s:
        raise ValueError(f"stages: {s} stages for {e + l_} layers (each stage needs one)")
    return e, l_, s


def equal_split(encoder_layers: int, llm_layers: int, stages: int) -> LayerSplit:
    """Equal layer counts per stage, whatever their kind (the first stages take the remainder)."""
    e, l_, s = _check_layers(encoder_layers, llm_layers, stages)
    return _split(e, np.concatenate([[0], np.cumsum(even_split(e + l_, s))]).tolist())


def megatron_split(encoder_layers: int, llm_layers: int, stages: int) -> LayerSplit:
    """Megatron's placement: the whole encoder on the first stage, the LLM's layers spread evenly
    over all stages (the first stages take the remainder)."""
    e, l_, s = _check_layers(encoder_layers, llm_layers, stages)
    if l_ < s:
        raise ValueError(f"llm_layers: {l_} LLM layers for {s} stages")
    llm = even_split(l_, s)
    return LayerSplit(encoder_layers=(e,) + (0,) * (s - 1), llm_layers=tuple(llm))


@dataclass(kw_only=True, slots=True)
class StageTerms:
    """The formula's terms on one stage."""

    fwd: float
    """T_fwd: the stage's forward for one microbatch (us)."""
    bwd: float
    """T_bwd: the stage's backward for one microbatch (us)."""
    microbatches: int
    """M_b."""
    pipeline_bubbles: float
    """B_θ = S - 1, in units of fwd + bwd."""
    hidden_share: float
    """f(i): share of the B_θ pipeline bubbles the stage does not wait (negative: waits more)."""
    modality_bubbles: float
    """B_y: steady-phase waits for slower stages, plus the wait to the step's end, in units of fwd
    per microbatch."""

    @property
    def step_time(self) -> float:
        """The formula: (M_b + B_θ)(T_fwd + T_bwd) + B_y·M_b·T_fwd - B_θ·f·(T_fwd + T_bwd)."""
        t = self.fwd + self.bwd
        return ((self.microbatches + self.pipeline_bubbles) * t + self.modality_bubbles * self.microbatches * self.fwd
                - self.pipeline_bubbles * self.hidden_share * t)


@dataclass(kw_only=True, slots=True)
class Prediction:
    """The model's step time of one pipeline, with each stage's terms."""

    step_time: float
    """Predicted 1F1B step (us)."""
    stages: list[StageTerms]
    """Terms per stage; each one's ``step_time`` equals the prediction."""
    bottleneck: int
    """The stage whose relaxed schedule is longest (B_y = 0 there, unless it waits in the steady
    phase itself)."""
    p2p: float = 0.0
    """Point-to-point latency per stage hop (us)."""
    split: LayerSplit | None = None
    """The layer split predicted, when the prediction came from one."""
    optimal: bool = True
    """For a search: whether the split is proven optimal under the model (False when the search
    stopped at its evaluation limit)."""
    evaluated: int = 0
    """For a search: splits evaluated with the full model."""

    @property
    def fwd(self) -> np.ndarray:
        """Per stage, the forward of one microbatch (us)."""
        return np.array([s.fwd for s in self.stages])

    @property
    def bwd(self) -> np.ndarray:
        """Per stage, the backward of one microbatch (us)."""
        return np.array([s.bwd for s in self.stages])

    def simulate(self) -> Timeline:
        """The same pipeline (per-stage fwd/bwd, p2p) run by the C++ 1F1B simulator."""
        return simulate_pipeline(SCHEDULE, ranks=len(self.stages), microbatches=self.stages[0].microbatches,
                                 fwd=self.fwd, bwd=self.bwd, p2p=float(self.p2p))


def _stage_array(values: object, field: str, positive: bool) -> np.ndarray:
    arr = real_array(values, field, minimum=0.0, positive_values=positive, ndim=None)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{field}: shape {arr.shape} is not one entry per stage")
    return arr


def predict(fwd: Sequence[float] | np.ndarray, bwd: Sequence[float] | np.ndarray, microbatches: int,
            p2p: float = 0.0, split: LayerSplit | None = None) -> Prediction:
    """The model's 1F1B step for per-stage forward and backward times (one microbatch, us),
    `microbatches` microbatches and a point-to-point latency `p2p` per stage hop."""
    f = _stage_array(fwd, "fwd", True)
    b = _stage_array(bwd, "bwd", False)
    if b.shape != f.shape:
        raise ValueError(f"bwd: {b.size} stages, fwd has {f.size}")
    m = _count(microbatches, "microbatches", 1)
    lat = _latency(p2p)
    own, pipe, steady = (a[0] for a in relaxed_schedules(f[None, :], b[None, :], m, lat))
    step = float(own.max())
    s = f.size
    terms = []
    for i in range(s):
        t = f[i] + b[i]
        hidden = 1.0 - pipe[i] / ((s - 1) * t) if s > 1 else 0.0
        wait = steady[i] + (step - own[i])
        terms.append(StageTerms(fwd=float(f[i]), bwd=float(b[i]), microbatches=m, pipeline_bubbles=float(s - 1),
                                hidden_share=float(hidden), modality_bubbles=float(wait / (m * f[i]))))
    return Prediction(step_time=step, stages=terms, bottleneck=int(np.argmax(own)), p2p=lat, split=split)


def predict_split(split: LayerSplit, layers: LayerTimes, microbatches: int, p2p: float = 0.0) -> Prediction:
    """The model's step for a layer split."""
    f, b = split.stage_times(layers)
    return predict(f, b, microbatches, p2p, split=split)


def search_split(encoder_layers: int, llm_layers: int, stages: int, layers: LayerTimes, microbatches: int,
                 p2p: float = 0.0, max_evaluations: int = 200_000) -> Prediction:
    """The layer split (encoder layers first, every stage non-empty) with the shortest predicted step.

    Branch and bound: a weaker relaxation (rule 2 with the later stages as one block, no rule 3)
    depends on a stage's own layers alone, so its best completion of every partial split follows
    from a dynamic program; splits whose bound reaches the best full prediction so far are never
    evaluated. The
    result is optimal under the model unless `max_evaluations` full evaluations did not suffice
    (then ``optimal`` is False and the best split found is returned).
    """
    e, l_, s = _check_layers(encoder_layers, llm_layers, stages)
    m = _count(microbatches, "microbatches", 1)
    lat = _latency(p2p)
    limit = _count(max_evaluations, "max_evaluations", 1)
    n = e + l_
    per_f = np.array([layers.encoder_fwd] * e + [layers.llm_fwd] * l_)
    per_b = np.array([layers.encoder_bwd] * e + [layers.llm_bwd] * l_)
    pf, pb = np.concatenate([[0.0], np.cumsum(per_f)]), np.concatenate([[0.0], np.cumsum(per_b)])
    found = _SplitSearch(pf, pb, s, m, lat, limit)
    found.run()
    pred = predict_split(_split(e, found.best_cuts), layers, m, lat)
    pred.optimal = found.optimal
    pred.evaluated = found.evaluated
    return pred


class _SplitSearch:
    """:func:`search_split`'s branch and bound over the cuts between stages (``cuts[i]``: the first
    layer of stage i, ``cuts[S] = n``), from the prefix sums `pf` and `pb` of the layers' forward
    and backward times."""

    def __init__(self, pf: np.ndarray, pb: np.ndarray, stages: int, microbatches: int, p2p: float, limit: int):
        self.pf, self.pb, self.s, self.m, self.lat, self.limit = pf, pb, stages, microbatches, p2p, limit
        self.bound, self.rest = self.bounds()
        self.best_cuts: list[int] = []
        self.best = np.inf
        self.evaluated = 0
        self.optimal = True
        self.leaves: list[list[int]] = []

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """``bound[i, a, b]``: stage i holding layers a .. b-1, with only its own layers known;
        ``rest[i, a]``: the smallest bound over the stages i .. S-1 when stage i starts at layer a."""
        pf, pb, s, m, lat = self.pf, self.pb, self.s, self.m, self.lat
        n = len(pf) - 1
        pt = pf + pb
        a_idx, b_idx = np.triu_indices(n + 1, 1)
        bound = np.full((s, n + 1, n + 1), np.inf)
        for i in range(s):
            ok = (a_idx >= i) & (n - b_idx >= s - 1 - i) & ((i > 0) | (a_idx == 0)) & ((i < s - 1) | (b_idx == n))
            a, b = a_idx[ok], b_idx[ok]
            # the round trip through all later stages as one block (rule 2 with k0 = k, for j = S - 1)
            none = np.zeros(a.size)
            down = [OtherStage(between=pt[n] - pt[b] + 2 * (s - 1 - i) * lat, fwd=none, bwd=none, warm=0)] \
                if i < s - 1 else []
            own = relaxed_stage(pf[b] - pf[a], pb[b] - pb[a], pf[a] + i * lat, pb[a] + i * lat,
                           min(s - i - 1, m), m, down, [])[0]
            bound[i, a, b] = own
        rest = np.full((s + 1, n + 1), np.inf)
        rest[s, n] = -np.inf
        for i in range(s - 1, -1, -1):
            rest[i] = np.min(np.maximum(bound[i], rest[i + 1][None, :]), axis=1)
        return bound, rest

    def evaluate(self, splits: list[list[int]]) -> np.ndarray:
        """The full model's step of each split."""
        cuts = np.array(splits, np.int64)
        lo, hi = cuts[:, :-1], cuts[:, 1:]
        own = relaxed_schedules(self.pf[hi] - self.pf[lo], self.pb[hi] - self.pb[lo], self.m, self.lat)[0]
        return own.max(axis=1)

    def flush(self) -> None:
        """Evaluates the leaves gathered (within the evaluation limit) and keeps the best."""
        room = self.limit - self.evaluated
        if len(self.leaves) > room:  # the evaluation limit: what is left unevaluated may be better
            self.optimal = False
            del self.leaves[max(0, room):]
        if self.leaves:
            steps = self.evaluate(self.leaves)
            k = int(np.argmin(steps))
            if steps[k] < self.best:
                self.best, self.best_cuts = float(steps[k]), self.leaves[k]
            self.evaluated += len(self.leaves)
            self.leaves.clear()

    def run(self) -> None:
        """From the bound's own best split, every split whose bound beats the best so far."""
        bound, rest, s, n = self.bound, self.rest, self.s, len(self.pf) - 1
        start, a = [0], 0
        for i in range(s):
            a = int(np.argmin(np.maximum(bound[i, a], rest[i + 1])))
            start.append(a)
        self.best_cuts, self.best = start, float(self.evaluate([start])[0])
        self.evaluated = 1
        stack: list[tuple[int, float, list[int]]] = [(0, -np.inf, [0])]
        while stack and self.optimal:
            i, part, cuts = stack.pop()
            a = cuts[-1]
            ends = np.arange(a + 1, n - (s - 1 - i) + 1)
            lb = np.maximum(np.maximum(part, bound[i, a, ends]), rest[i + 1, ends])
            keep = lb < self.best * (1 - 1e-12)
            for b, v in sorted(zip(ends[keep].tolist(), lb[keep].tolist()), key=lambda x: -x[1]):
                if i == s - 1:
                    self.leaves.append(cuts + [b])
                else:
                    stack.append((i + 1, max(part, float(bound[i, a, b])), cuts + [b]))
            if len(self.leaves) >= 1024:
                self.flush()
            if self.evaluated >= self.limit and stack:
                self.optimal = False
        self.flush()


__all__ = ["SCHEDULE", "LayerSplit", "LayerTimes", "Prediction", "StageTerms", "equal_split", "layer_times",
           "megatron_split", "predict", "predict_split", "search_split"]
