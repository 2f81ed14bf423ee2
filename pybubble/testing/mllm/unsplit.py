"""The test trainer's oracle: the same training in one process, without a pipeline or an encoder
runtime (the whole batch, its microbatches in turn): the parameters every mode, schedule and mesh
must reach."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .inputs import loss_fn, make_batch, packed_loss, sample_row, step_samples
from .model import PACKED_KINDS, ModelConfig, build_encoder, build_stages, checksum, encoder_tokens, unpacked_encoder


def reference_checksum(cfg: ModelConfig, ranks: int, steps: int, kind: str = "vit") -> float:
    """The same training in one process, unsplit: the parameters the pipeline runs must reach."""
    encoder, stages = build_encoder(cfg, kind), build_stages(cfg, ranks, kind)
    params = [p for m in (encoder, *stages) for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=cfg.lr)
    loss = loss_fn(cfg)
    for step in range(steps):
        images, tokens, targets = make_batch(cfg, step, kind)
        for k in range(cfg.microbatches):
            sl = slice(k * cfg.microbatch_size, (k + 1) * cfg.microbatch_size)
            image = encoder(images[sl])
            stages[0].encoder_output = lambda _k, image=image: image
            x = stages[0](tokens[sl], torch.tensor([k]))
            for s in stages[1:]:
                x = s(x)
            loss(x, targets[sl]).backward()
        opt.step()
        opt.zero_grad()
    return checksum((encoder, *stages))


def reference_varying(args: Any, cfg: ModelConfig) -> float:
    """The same training on varying data in one process, unsplit, the step's samples in their
    given order: the parameters every mode and balance must reach."""
    kind = args.encoder
    stages = build_stages(cfg, args.pp, kind, packed=True)
    if kind in PACKED_KINDS:  # the encoder's library's own forward on each microbatch's images, unpacked
        tower, encoder = unpacked_encoder(cfg, kind)
    else:
        tower = encoder = build_encoder(cfg, kind)
    modules = (tower, *stages)
    opt = torch.optim.SGD([p for m in modules for p in m.parameters()], lr=cfg.lr)
    scale = [0.0]
    loss, per_tile = packed_loss(scale), encoder_tokens(cfg, kind)
    for step in range(args.steps):
        samples = step_samples(args, cfg, step)
        scale[0] = 1.0 / max(int(samples.text.sum()), 1)
        tiles = samples.sample_tiles
        grids = (None if samples.grids is None else
                 [[tuple(map(int, g)) for g in x] for x in np.split(samples.grids, np.cumsum(samples.images)[:-1])])
        rows = [sample_row(cfg, kind, step, i, int(tiles[i]), int(samples.text[i]), grids and grids[i])
                for i in range(len(samples))]
        for k in range(cfg.microbatches):
            mine = range(k * cfg.microbatch_size, (k + 1) * cfg.microbatch_size)
            if kind in PACKED_KINDS:
                images = [x for i in mine for x in rows[i][0]]
                image = (encoder(images, [g for i in mine for g in grids[i]]) if images
                         else torch.zeros(0, cfg.llm_dim))
            else:
                pixels = torch.cat([rows[i][0] for i in mine])
                image = encoder(pixels) if pixels.shape[0] else torch.zeros(0, per_tile, cfg.llm_dim)
            stages[0].encoder_output = lambda _k, image=image: image
            x = stages[0](torch.stack([rows[i][1] for i in mine]), torch.tensor([k]),
                          torch.as_tensor(tiles[list(mine)] * per_tile))
            for st in stages[1:]:
                x = st(x)
            loss(x, torch.stack([rows[i][2] for i in mine])).backward()
        opt.step()
        opt.zero_grad()
    return checksum(modules)
