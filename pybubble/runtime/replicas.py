"""Encoder work moved between data-parallel replicas, and its outputs sent back.

Each data-parallel replica owns its samples, and with data that varies per step one replica's
images can take several times the encoder time of another's: every replica then waits at the
next data-parallel collective for the one with the most (VeOmni's ``EncoderDataBalance``,
LoongForge's ViT balance). Before each step every rank learns every replica's images (their tile
counts, per LLM slot) and all decide the same moves (:func:`pybubble.schedule.balance.balance_replicas`,
slot by slot then the totals): a moved image's tiles go to the replica with room, which runs them
as part of its own chain for that slot (after its own tiles, so one chain, one deadline), and sends
their encoder output to the first stage of the replica that owns the sample; the gradient comes
back the same way. The owner's first stage puts every image's tokens back in its samples' order.

:class:`ReplicaMoves` is the decision (numpy, the same on every rank); :class:`MovedWork` does
the step's traffic over a gloo group of every rank (tags of its own, so early receives wait for
their own message).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from ..schedule.balance import balance_replica_chunks, balance_replica_stream, balance_replicas
from .batch import EncoderBatch, chunk_counts
from ..placement.step_placement import producers
from .probe import WorkProbe

MOVE_TAG_BASE = 1 << 22
"""The moves' tags start here (pixels, outputs, gradients: three blocks of ``1 << 20``)."""


@dataclass(frozen=True)
class ReplicaMoves:
    """Which images' encoder work runs on which replica in one step. Images are numbered over all
    replicas: replica-major, then slot, then their place in the slot (flat ids)."""

    replicas: int
    """Data-parallel replicas."""
    slots: int
    """LLM slots (microbatches) of a step."""
    owner: np.ndarray
    """Each image's replica."""
    slot: np.ndarray
    """Each image's LLM slot."""
    tiles: np.ndarray
    """Each image's tiles."""
    runs_on: np.ndarray
    """The replica that runs each image's encoder work."""

    @classmethod
    def decide(cls, images: Sequence[Sequence[Sequence[int]]], cost: Callable[[np.ndarray], np.ndarray] | None = None,
               chunk_tiles: int | None = None, packed: bool = False) -> ReplicaMoves:
        """``images[r][k]``: the tile counts of replica r's images in slot k. Without
        ``chunk_tiles``: whole images move (:func:`~pybubble.schedule.balance.balance_replicas` on
        ``cost``, each image's encoder cost from its tiles, default its tiles). With
        ``chunk_tiles`` (the encoder's tiles are independent and each slot's chain runs them in
        chunks of this many): tiles move, a slot's last chunk at a time
        (:func:`~pybubble.schedule.balance.balance_replica_chunks`: the most chunks a replica runs
        is what the step waits for), each move taking the last tiles the giver still holds in
        that slot; an image whose tiles go to two replicas is split into two parts, and the parts
        are what :attr:`owner`, :attr:`slot`, :attr:`tiles` and :attr:`runs_on` list. With
        ``packed`` (each replica runs its tiles as one stream: packed chains), the moves by the
        stream's chunks (:func:`~pybubble.schedule.balance.balance_replica_stream`)."""
        owner, slot, tiles = [], [], []
        for r, per_slot in enumerate(images):
            for k, counts in enumerate(per_slot):
                owner += [r] * len(counts)
                slot += [k] * len(counts)
                tiles += [int(t) for t in counts]
        owner_a, slot_a, tiles_a = (np.asarray(x, np.int64) for x in (owner, slot, tiles))
        replicas, slots = len(images), len(images[0]) if images else 0
        unmoved = cls(replicas=replicas, slots=slots, owner=owner_a, slot=slot_a, tiles=tiles_a, runs_on=owner_a.copy())
        if chunk_tiles is not None:
            decide_moves = balance_replica_stream if packed else balance_replica_chunks
            return _cut(unmoved, decide_moves(unmoved.slot_tiles(False), chunk_tiles))
        if tiles_a.size:
            moves = balance_replicas(tiles_a.astype(np.float64) if cost is None else cost(tiles_a), owner_a,
                                     replicas, slot_a)
            unmoved.runs_on[moves[:, 0]] = moves[:, 2]
        return unmoved

    def slot_tiles(self, after: bool, kept: bool = False) -> np.ndarray:
        """replicas x slots: the tiles each replica runs per slot, before the moves (``after``
        False) or after (``kept``: of its own images only)."""
        where = self.runs_on if after else self.owner
        w = self.tiles if not kept else np.where(self.runs_on == self.owner, self.tiles, 0)
        return np.bincount(where * self.slots + self.slot, weights=w,
                           minlength=self.replicas * self.slots).reshape(self.replicas, self.slots)

    def chunks(self, after: bool, chunk_tiles: int) -> np.ndarray:
        """Chunks of ``chunk_tiles`` each replica runs (every slot's chain padded to whole chunks),
        before the moves (``after`` False) or after."""
        return np.ceil(self.slot_tiles(after) / chunk_tiles).sum(axis=1)

    def kept(self, replica: int, slot: int) -> np.ndarray:
        """Flat ids of ``replica``'s images of ``slot`` it runs itself, in their order."""
        return np.flatnonzero((self.owner == replica) & (self.slot == slot) & (self.runs_on == replica))

    def moved_in(self, replica: int, slot: int) -> np.ndarray:
        """Flat ids of other replicas' images of ``slot`` that ``replica`` runs (owner by owner)."""
        return np.flatnonzero((self.runs_on == replica) & (self.slot == slot) & (self.owner != replica))

    def sent(self, owner: int, runner: int, slot: int) -> np.ndarray:
        """Flat ids of ``owner``'s images of ``slot`` run on ``runner`` (``runner != owner``)."""
        return np.flatnonzero((self.owner == owner) & (self.runs_on == runner) & (self.slot == slot))

    def chain_tiles(self, replica: int) -> list[int]:
        """Per slot: the tiles ``replica`` runs (its kept images', then the moved-in ones')."""
        return self.slot_tiles(True)[replica].astype(int).tolist()

    def chain_images(self, replica: int) -> list[list[int]]:
        """Per slot: the tiles of each image (or part of one) ``replica`` runs, its kept ones first,
        then the moved-in ones (as its chains' inputs come)."""
        return [self.tiles[np.concatenate([self.kept(replica, k), self.moved_in(replica, k)])].astype(int).tolist()
                for k in range(self.slots)]

    def kept_tiles(self, replica: int) -> list[int]:
        """Per slot: the tiles of ``replica``'s own images it runs itself (what its own first
        stage gets from its own chains)."""
        return self.slot_tiles(True, kept=True)[replica].astype(int).tolist()

    def load(self, after: bool) -> np.ndarray:
        """Tiles per replica, before the moves (``after`` False) or after."""
        return self.slot_tiles(after).sum(axis=1)

    def imbalance(self, after: bool) -> float:
        """The replicas' most over mean tiles (1: even)."""
        load = self.load(after)
        return float(load.max() / load.mean()) if load.sum() > 0 else 1.0

    def _offsets(self, replica: int, slot: int) -> dict[int, int]:
        """Each of ``replica``'s images of ``slot``: its first tile among the slot's tiles."""
        ids = np.flatnonzero((self.owner == replica) & (self.slot == slot))
        return dict(zip(ids.tolist(), np.concatenate([[0], np.cumsum(self.tiles[ids])[:-1]]).tolist()))

    def tile_rows(self, ids: np.ndarray, replica: int, slot: int) -> list[int]:
        """The rows (tiles) of images ``ids`` among ``replica``'s tiles of ``slot``, in order."""
        at = self._offsets(replica, slot)
        return [at[i] + t for i in ids.tolist() for t in range(int(self.tiles[i]))]


def _cut(unmoved: ReplicaMoves, moves: np.ndarray) -> ReplicaMoves:
    """``unmoved``'s images (none moved yet) cut where tile moves ``(slot, from, to, tiles)`` begin:
    each (replica, slot)'s first move takes its last tiles, the next the ones before them, and so
    on."""
    parts: list[tuple[int, int, int, int]] = []  # (owner, slot, tiles, runs_on)
    sends: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for k, giver, taker, n in moves.tolist():
        sends.setdefault((giver, k), []).append((taker, n))
    n_images = np.bincount(unmoved.owner * unmoved.slots + unmoved.slot, minlength=unmoved.replicas * unmoved.slots)
    at = 0
    for r in range(unmoved.replicas):
        for k in range(unmoved.slots):
            counts = unmoved.tiles[at:at + n_images[r * unmoved.slots + k]].tolist()
            at += len(counts)
            # the slot's tiles as runs (runner, length): kept first, then the moves, the first one last
            out = [(taker, n) for taker, n in reversed(sends.get((r, k), []))]
            runs = [(r, sum(counts) - sum(n for _, n in out)), *out]
            i, left = 0, runs[0][1]
            for count in counts:
                if count == 0:
                    parts.append((r, k, 0, r))
                while count:
                    while left == 0:
                        i, left = i + 1, runs[i + 1][1]
                    take = min(count, left)
                    parts.append((r, k, take, runs[i][0]))
                    count, left = count - take, left - take
    a = np.asarray(parts, np.int64).reshape(-1, 4)
    return ReplicaMoves(replicas=unmoved.replicas, slots=unmoved.slots, owner=a[:, 0], slot=a[:, 1], tiles=a[:, 2],
                        runs_on=a[:, 3])


def _tag(block: int, slot: int, owner: int, runner: int, replicas: int, part: int = 0) -> int:
    return MOVE_TAG_BASE + (block << 20) + ((slot * replicas + owner) * replicas + runner) * 8 + part


class MovedWork:
    """One step's moved encoder work on this rank (replica ``replica``, pipeline rank ``pp_rank``):
    the tiles exchanged before the step, the outputs sent to their owners' first stage, the
    gradients back. ``grid[r][q]``: the world rank of replica r's pipeline rank q (ranks of
    ``group``, a gloo group of every rank in world order)."""

    def __init__(self, moves: ReplicaMoves, *, replica: int, pp_rank: int, grid: Sequence[Sequence[int]],
                 group: dist.ProcessGroup | None, first_stage: int, device: torch.device):
        self.moves, self.replica, self.pp_rank = moves, replica, pp_rank
        self.grid, self.group, self.first_stage, self.device = grid, group, first_stage, torch.device(device)
        self._sends: list[dist.Work] = []
        self._outputs: dict[tuple[int, int], tuple[torch.Tensor, WorkProbe]] = {}
        self._grads: dict[tuple[int, int], tuple[torch.Tensor, WorkProbe]] = {}
        self.producers: list[list[int]] = []
        """Per replica, per slot: the pipeline rank that runs its chain (from the shared moves)."""

    # -- before the step: the tiles ------------------------------------------------------------
    def exchange_tiles(self, inputs: Sequence[Sequence[torch.Tensor]]) -> list[tuple[torch.Tensor, ...]]:
        """This replica's chains' inputs per slot: its kept images' tiles, then the moved-in ones'
        (received from the owner's rank of the same pipeline rank). ``inputs[k]``: this replica's
        own tiles of slot k (one tensor per encoder input)."""
        mv, me = self.moves, self.replica
        recvs: list[tuple[int, int, list[torch.Tensor], list[dist.Work]]] = []
        for k in range(mv.slots):
            for runner in range(mv.replicas):
                if runner != me and (ids := mv.sent(me, runner, k)).size:
                    rows = torch.as_tensor(mv.tile_rows(ids, me, k), dtype=torch.long)
                    for i, t in enumerate(inputs[k]):
                        self._sends.append(dist.isend(t.index_select(0, rows.to(t.device)).contiguous().cpu(),
                                                      group=self.group, group_dst=self.grid[runner][self.pp_rank],
                                                      tag=_tag(0, k, me, runner, mv.replicas, i)))
            for owner in range(mv.replicas):
                if owner != me and (ids := mv.sent(owner, me, k)).size:
                    count = int(mv.tiles[ids].sum())
                    bufs = [torch.empty((count, *t.shape[1:]), dtype=t.dtype) for t in inputs[k]]
                    works = [dist.irecv(b, group=self.group, group_src=self.grid[owner][self.pp_rank],
                                        tag=_tag(0, k, owner, me, mv.replicas, i)) for i, b in enumerate(bufs)]
                    recvs.append((k, owner, bufs, works))
        extra: dict[int, list[list[torch.Tensor]]] = {}
        for k, _owner, bufs, works in recvs:
            for w in works:
                w.wait()
            extra.setdefault(k, []).append([b.to(self.device) for b in bufs])
        out = []
        for k in range(mv.slots):
            rows = torch.as_tensor(mv.tile_rows(mv.kept(me, k), me, k), dtype=torch.long)
            parts = [[t.index_select(0, rows.to(t.device)) for t in inputs[k]], *extra.get(k, [])]
            out.append(tuple(torch.cat([p[i] for p in parts]) for i in range(len(inputs[k]))))
        self.wait_sends()
        return out

    # -- the step: outputs to owners, gradients back -------------------------------------------
    def begin_step(self, output_shape: Sequence[int], dtype: torch.dtype) -> None:
        """Posts this step's receives: on this replica's first stage the moved images' outputs,
        on the ranks that run moved-in images their gradients."""
        m, me = self.moves, self.replica
        for k in range(m.slots):
            for other in range(m.replicas):
                if other == me:
                    continue
                if self.pp_rank == self.first_stage and (ids := m.sent(me, other, k)).size:
                    buf = torch.empty((int(m.tiles[ids].sum()), *output_shape), dtype=dtype)
                    src = self.grid[other][self.producers[other][k]]
                    self._outputs[k, other] = (buf, WorkProbe(dist.irecv(buf, group=self.group, group_src=src,
                                                                         tag=_tag(1, k, me, other, m.replicas))))
                if self.producers[me][k] == self.pp_rank and (ids := m.sent(other, me, k)).size:
                    buf = torch.empty((int(m.tiles[ids].sum()), *output_shape), dtype=dtype)
                    src = self.grid[other][self.first_stage]
                    self._grads[k, other] = (buf, WorkProbe(dist.irecv(buf, group=self.group, group_src=src,
                                                                       tag=_tag(2, k, other, me, m.replicas))))

    def send_outputs(self, slot: int, moved: torch.Tensor) -> None:
        """On the rank that ran slot ``slot``'s chain: the moved-in images' outputs (the chain's
        rows after its kept tiles), each owner's part to its first stage."""
        at = 0
        for owner in range(self.moves.replicas):
            if owner == self.replica or not (ids := self.moves.sent(owner, self.replica, slot)).size:
                continue
            n = int(self.moves.tiles[ids].sum())
            self._sends.append(dist.isend(moved[at:at + n].contiguous().cpu(), group=self.group,
                                          group_dst=self.grid[owner][self.first_stage],
                                          tag=_tag(1, slot, owner, self.replica, self.moves.replicas)))
            at += n

    def grads_ready(self, slot: int) -> bool:
        """Whether every gradient of slot ``slot``'s moved-in outputs has arrived."""
        return all(p.done() for (k, _), (_, p) in self._grads.items() if k == slot)

    def moved_grads(self, slot: int) -> list[torch.Tensor]:
        """The gradients of slot ``slot``'s moved-in outputs, owner by owner (waits for them)."""
        out = []
        for (k, _owner), (buf, probe) in sorted(self._grads.items()):
            if k == slot:
                probe.result()
                out.append(buf.to(self.device))
        return out

    def assemble(self, slot: int, local: torch.Tensor, track: bool = True) -> torch.Tensor:
        """On the first stage: slot ``slot``'s image tokens in its samples' order, from ``local``
        (the kept images' outputs) and the outputs other replicas ran (waits for them); with
        ``track`` their gradients go back to the ranks that ran them."""
        m, me = self.moves, self.replica
        ids = np.flatnonzero((m.owner == me) & (m.slot == slot))
        if not any(k == slot for k, _ in self._outputs):
            return local
        sources: dict[int, torch.Tensor] = {me: local}
        for (k, runner), (buf, probe) in self._outputs.items():
            if k == slot:
                probe.result()
                leaf = buf.to(self.device)
                if track:
                    leaf.requires_grad_(True).register_hook(lambda g, runner=runner: self._send_grad(slot, runner, g))
                sources[runner] = leaf
        taken = dict.fromkeys(sources, 0)
        parts = []
        for i in ids.tolist():
            src, n = int(m.runs_on[i]), int(m.tiles[i])
            parts.append(sources[src][taken[src]:taken[src] + n])
            taken[src] += n
        return torch.cat(parts)

    def _send_grad(self, slot: int, runner: int, grad: torch.Tensor) -> None:
        self._sends.append(dist.isend(grad.detach().contiguous().cpu(), group=self.group,
                                      group_dst=self.grid[runner][self.producers[runner][slot]],
                                      tag=_tag(2, slot, self.replica, runner, self.moves.replicas)))

    def wait_sends(self) -> None:
        """Waits for this rank's sends so far (tiles, outputs, gradients)."""
        for w in self._sends:
            w.wait()
        self._sends.clear()




def replica_grid(group: dist.ProcessGroup | None, dp_group: dist.ProcessGroup | None, pp_rank: int, pp_ranks: int
                 ) -> list[list[int]] | None:
    """``grid[r][q]``: the rank in ``group`` (every rank, world order) of replica r's pipeline rank q,
    gathered once from every rank's (replica, pipeline rank); None with one replica (nothing to
    balance)."""
    replicas = 1 if dp_group is None else dist.get_world_size(dp_group)
    if replicas == 1:
        return None
    replica = dist.get_rank(dp_group)
    every = [torch.zeros(2, dtype=torch.int64) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, torch.tensor([replica, pp_rank]), group=group)
    grid = [[-1] * pp_ranks for _ in range(replicas)]
    for rank, place in enumerate(every):
        r, q = (int(x) for x in place)
        if grid[r][q] != -1:
            raise ValueError(f"balance_replicas: ranks {grid[r][q]} and {rank} are both replica {r}'s pipeline rank "
                             f"{q} (tensor parallelism beside the moves is not supported)")
        grid[r][q] = rank
    return grid


def gather_images(images: Sequence[Sequence[int]], replica: int, replicas: int, group: dist.ProcessGroup | None
                  ) -> list[list[list[int]]]:
    """Every replica's images (tile counts per slot), from every rank's (every rank of a replica
    holds the same)."""
    every: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, (replica, [list(x) for x in images]), group=group)
    out: list = [None] * replicas
    for r, imgs in every:
        out[r] = imgs if out[r] is None else out[r]
    return out


def move_work(batch: EncoderBatch, *, replica: int, replicas: int, pp_rank: int, pp_ranks: int,
              grid: Sequence[Sequence[int]], group: dist.ProcessGroup | None, first_stage: int, chunk_tiles: int,
              device: torch.device, packed: bool = False, whole: bool = False
              ) -> tuple[EncoderBatch, list[int], MovedWork]:
    """One step's moves (every rank decides the same from every replica's images; ``whole``: whole
    images move where some replica has one of several chunks, which must move as one), the moved
    tiles exchanged: this
    replica's chains' inputs per slot (its kept tiles, then the moved-in ones; their images), the
    rows of each slot's chain for its own first stage, and the step's :class:`MovedWork`."""
    if batch.images is None:
        raise ValueError("batch: balancing over replicas needs each microbatch's images (EncoderBatch(images=...))")
    every = gather_images(batch.images, replica, replicas, group)
    whole = whole and any(t > 1 for mine in every for slot in mine for t in slot)  # the same on every rank
    moves = ReplicaMoves.decide(every, chunk_tiles=None if whole else chunk_tiles, packed=packed)
    moved = MovedWork(moves, replica=replica, pp_rank=pp_rank, grid=grid, group=group, first_stage=first_stage,
                      device=device)
    moved.producers = [producers("pybubble", moves.slots, pp_ranks, first_stage,
                                 chunk_counts(moves.chain_tiles(r), chunk_tiles)) for r in range(replicas)]
    return (EncoderBatch(moved.exchange_tiles(batch.inputs), moves.chain_images(replica)), moves.kept_tiles(replica),
            moved)


class ReplicaBalance:
    """Each step's encoder work balanced over the data-parallel replicas (:func:`move_work`), on
    this rank (pipeline rank ``pp_rank`` of ``pp_ranks``, the first stage's rank ``first_stage``):
    every rank builds it at once (one gather of every rank's place over ``group``, a gloo group of
    every rank)."""

    def __init__(self, *, group: dist.ProcessGroup | None, dp_group: dist.ProcessGroup | None, pp_rank: int,
                 pp_ranks: int, first_stage: int, chunk_tiles: int, device: torch.device, packed: bool):
        self.group, self.dp_group, self.pp_rank, self.pp_ranks = group, dp_group, pp_rank, pp_ranks
        self.first_stage, self.chunk_tiles, self.device, self.packed = first_stage, chunk_tiles, device, packed
        self.grid = replica_grid(group, dp_group, pp_rank, pp_ranks)
        """The world rank of each replica's pipeline ranks (the moves' traffic); None: one replica."""
        self.moves: ReplicaMoves | None = None
        """The last step's moves (None: none)."""

    def balance(self, batch: EncoderBatch, whole: bool = False) -> tuple[EncoderBatch, list[int], MovedWork | None]:
        """This replica's chains' inputs (its kept tiles, then the moved-in ones), each chain's rows
        for its own first stage, and the step's moved work (None with one replica; ``whole``: whole
        images move)."""
        if self.grid is None:
            self.moves = None
            return batch, batch.tiles, None
        chains, own, moved = move_work(
            batch, replica=dist.get_rank(self.dp_group), replicas=len(self.grid), pp_rank=self.pp_rank,
            pp_ranks=self.pp_ranks, grid=self.grid, group=self.group, first_stage=self.first_stage,
            chunk_tiles=self.chunk_tiles, device=self.device, packed=self.packed, whole=whole)
        self.moves = moved.moves
        return chains, own, moved


__all__ = ["MovedWork", "ReplicaBalance", "ReplicaMoves", "gather_images", "move_work", "replica_grid"]
