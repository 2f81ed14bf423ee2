"""pybubble's runtime on a trainer's own loop: a two-stage pipeline of a tiny model under torchrun,
with no pybubble helper but the runtime's three calls (marked ``# pybubble``) and ``exit_rank`` at
the end. Everything else is torch's: the process group, the pipeline stage and schedule, the optimizer.

    python -m torch.distributed.run --nproc-per-node 2 examples/own_loop.py --mode pybubble

Each image is 8 patches of 12 values; the encoder (two linear layers) turns them into 8 tokens that
stage 0 puts in front of its 8 text tokens; stage 1 predicts the text's next tokens. Every mode
trains the same model on the same data: rank 0 prints the parameters' sum after the last step,
the same in megatron, coarse and pybubble mode.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from pybubble.runtime import EncoderRuntime, RuntimeOptions, exit_rank

DIM, VOCAB, PATCHES, TEXT, MICROBATCHES, ROWS = 32, 64, 8, 8, 4, 2


class First(nn.Module):
    """Stage 0: the image tokens (from the encoder) in front of the embedded text."""

    def __init__(self):
        super().__init__()
        self.embed, self.mix = nn.Embedding(VOCAB, DIM), nn.Linear(DIM, DIM)
        self.encoder_output = None  # set to the runtime's below

    def forward(self, text: torch.Tensor, microbatch: torch.Tensor) -> torch.Tensor:
        if text.device.type == "meta":  # torch infers the stage's shapes on meta tensors first
            image = torch.zeros(text.shape[0], PATCHES, DIM, device="meta")
        else:
            image = self.encoder_output(int(microbatch[0]))  # pybubble (2): this microbatch's image tokens
        return torch.tanh(self.mix(torch.cat([image, self.embed(text)], dim=1)))


class Last(nn.Module):
    """Stage 1: the text positions' logits."""

    def __init__(self):
        super().__init__()
        self.mix, self.head = nn.Linear(DIM, DIM), nn.Linear(DIM, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mix(x[:, PATCHES:])))


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), target.flatten()) / MICROBATCHES


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The step's images, text and next tokens: the same on every rank (a seeded generator)."""
    g = torch.Generator().manual_seed(step)
    images = torch.randn(MICROBATCHES * ROWS, PATCHES, 12, generator=g)
    tokens = torch.randint(0, VOCAB, (MICROBATCHES * ROWS, TEXT + 1), generator=g)
    return images, tokens[:, :-1], tokens[:, 1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", default="pybubble", choices=("megatron", "coarse", "pybubble"))
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    dist.init_process_group("gloo")  # torchrun's env:// rendezvous
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same weights on every rank: each keeps its own stage's
    encoder = nn.Sequential(nn.Linear(12, DIM), nn.GELU(), nn.Linear(DIM, DIM))
    model = [First(), Last()][rank]
    stage = PipelineStage(model, rank, 2, torch.device("cpu"))
    schedule = Schedule1F1B(stage, MICROBATCHES, loss_fn=loss_fn, scale_grads=False)
    images, _, _ = batch(0)
    runtime = EncoderRuntime(encoder, stage=stage, schedule=schedule, example=images[:ROWS],  # pybubble (1)
                             options=RuntimeOptions(mode=args.mode))
    if rank == 0:
        model.encoder_output = runtime.encoder_output
    opt = torch.optim.SGD([*encoder.parameters(), *model.parameters()], lr=0.1)
    for step in range(args.steps):
        images, text, target = batch(step)
        if rank == 0:
            runtime.step(images, text, torch.arange(MICROBATCHES))  # pybubble (3), in place of schedule.step
        else:
            runtime.step(images, target=target)
        opt.step()
        opt.zero_grad()
    total = torch.tensor([sum(float(p.detach().double().sum()) for p in model.parameters())], dtype=torch.float64)
    dist.all_reduce(total)  # both stages' parameters; the encoder is the same on every rank
    if rank == 0:
        encoder_sum = sum(float(p.detach().double().sum()) for p in encoder.parameters())
        print(f"{args.mode}: parameters' sum {float(total) + encoder_sum:.9f}")
    dist.destroy_process_group()
    # gloo's worker threads can outlive the process group into the interpreter's finalization and
    # abort the rank there after the training succeeded (exit -6): end the process at once
    exit_rank(0)


if __name__ == "__main__":
    main()
