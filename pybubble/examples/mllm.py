"""A small multimodal LLM trained with a 1F1B pipeline over CPU ranks (gloo) or GPUs (NCCL, one per
rank), with the encoder run the Megatron way (inside stage 0), coarse (spread over all ranks before
and after the LLM) or by pybubble (its kernel-level tasks inside the pipeline's bubbles).

    python -m pybubble.examples.mllm --ranks 2 --steps 20 --mode pybubble --report out.json [--device cuda]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import socket
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..runtime import (BoundaryCommunicator, EncoderStep, MeasuredCosts, MicrobatchRun, ViTBlock,
                       check_torch_version, fill_pipeline_waits, llm_stream, make_plan, predict_step_s,
                       side_stream, split_into_pieces)
from ..runtime.cuda import serialised_streams_note
from ..runtime.plan import MODES  # noqa: F401  (re-used by bench/runtime_modes.py)


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """Sizes of the example's ViT and GPT, and of its batch."""

    microbatches: int = 4
    """LLM (and encoder) microbatches per step."""
    microbatch_size: int = 2
    """Samples per microbatch."""
    patches: int = 128
    """Image patches per sample (the encoder's sequence length and the image tokens of the LLM)."""
    patch_dim: int = 192
    """Values per patch."""
    enc_dim: int = 128
    enc_layers: int = 12
    enc_heads: int = 4
    llm_dim: int = 256
    llm_layers_per_stage: int = 2
    llm_heads: int = 4
    text_len: int = 64
    """Text tokens per sample."""
    vocab: int = 512
    lr: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("microbatches", "microbatch_size", "patches", "patch_dim", "enc_dim", "enc_layers",
                     "enc_heads", "llm_dim", "llm_layers_per_stage", "llm_heads", "text_len", "vocab"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: {v!r} is not an integer >= 1")
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            raise ValueError(f"lr: {self.lr!r} is not a number > 0")


SIZES = {
    "small": ModelConfig(),
    "tiny": ModelConfig(microbatches=2, microbatch_size=2, patches=8, patch_dim=16, enc_dim=16, enc_layers=2,
                        enc_heads=2, llm_dim=16, llm_layers_per_stage=1, llm_heads=2, text_len=8, vocab=32),
}


# -- models ------------------------------------------------------------------------------------
class PatchEmbed(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.linear = nn.Linear(cfg.patch_dim, cfg.enc_dim)
        self.pos = nn.Parameter(0.02 * torch.randn(cfg.patches, cfg.enc_dim))

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return self.linear(patches) + self.pos


class EncoderHead(nn.Module):
    """Final norm and the projection into the LLM's width."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.enc_dim)
        self.proj = nn.Linear(cfg.enc_dim, cfg.llm_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


def build_encoder(cfg: ModelConfig) -> nn.Sequential:
    torch.manual_seed(cfg.seed)
    return nn.Sequential(PatchEmbed(cfg), *(ViTBlock(cfg.enc_dim, cfg.enc_heads) for _ in range(cfg.enc_layers)),
                         EncoderHead(cfg))


class FirstStage(nn.Module):
    """Token embedding, image tokens from the encoder in front of the text, the first GPT blocks.
    ``encoder_output(k)`` gives the image tokens of microbatch k."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.llm_dim)
        self.pos = nn.Parameter(0.02 * torch.randn(cfg.patches + cfg.text_len, cfg.llm_dim))
        self.blocks = nn.Sequential(*(ViTBlock(cfg.llm_dim, cfg.llm_heads, causal=True)
                                      for _ in range(cfg.llm_layers_per_stage)))
        self.encoder_output = None
        self.image_shape = (cfg.microbatch_size, cfg.patches, cfg.llm_dim)

    def forward(self, tokens: torch.Tensor, microbatch: torch.Tensor) -> torch.Tensor:
        if tokens.device.type == "meta":  # shape inference by torch.distributed.pipelining
            image = torch.zeros(self.image_shape, device="meta")
        else:
            image = self.encoder_output(int(microbatch[0]))
        return self.blocks(torch.cat([image, self.embed(tokens)], dim=1) + self.pos)


class MiddleStage(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.blocks = nn.Sequential(*(ViTBlock(cfg.llm_dim, cfg.llm_heads, causal=True)
                                      for _ in range(cfg.llm_layers_per_stage)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class LastStage(MiddleStage):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.norm = nn.LayerNorm(cfg.llm_dim)
        self.head = nn.Linear(cfg.llm_dim, cfg.vocab)
        self.text_len = cfg.text_len

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(x)[:, -self.text_len:]))


def build_stages(cfg: ModelConfig, ranks: int) -> list[nn.Module]:
    """The GPT cut into ``ranks`` pipeline stages (same initial weights whatever the rank)."""
    stages: list[nn.Module] = []
    for s in range(ranks):
        torch.manual_seed(cfg.seed + 1 + s)
        stages.append(FirstStage(cfg) if s == 0 else LastStage(cfg) if s == ranks - 1 else MiddleStage(cfg))
    return stages


def make_batch(cfg: ModelConfig, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Synthetic patches, tokens and next tokens of one step, from the seed."""
    g = torch.Generator().manual_seed(cfg.seed * 100003 + step)
    b = cfg.microbatches * cfg.microbatch_size
    patches = torch.randn(b, cfg.patches, cfg.patch_dim, generator=g)
    tokens = torch.randint(0, cfg.vocab, (b, cfg.text_len + 1), generator=g)
    return patches, tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def loss_fn(cfg: ModelConfig):
    def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), target.flatten()) / cfg.microbatches
    return loss


def checksum(modules) -> float:
    """float64 sum of all parameters."""
    return float(sum(p.detach().double().sum() for m in modules for p in m.parameters()))


def reference_checksum(cfg: ModelConfig, ranks: int, steps: int) -> float:
    """The same training in one process, unsplit: the parameters the pipeline runs must reach."""
    encoder, stages = build_encoder(cfg), build_stages(cfg, ranks)
    params = [p for m in (encoder, *stages) for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=cfg.lr)
    loss = loss_fn(cfg)
    for step in range(steps):
        patches, tokens, targets = make_batch(cfg, step)
        for k in range(cfg.microbatches):
            sl = slice(k * cfg.microbatch_size, (k + 1) * cfg.microbatch_size)
            image = encoder(patches[sl])
            stages[0].encoder_output = lambda _k, image=image: image
            x = stages[0](tokens[sl], torch.tensor([k]))
            for s in stages[1:]:
                x = s(x)
            loss(x, targets[sl]).backward()
        opt.step()
        opt.zero_grad()
    return checksum((encoder, *stages))


# -- one rank ------------------------------------------------------------------------------------
def _now(device: torch.device) -> float:
    """``time.perf_counter()`` once ``device`` has finished what was enqueued (CUDA runs
    asynchronously to the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _timed(fn, repeats: int, device: torch.device) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t = _now(device)
        fn()
        times.append(_now(device) - t)
    return statistics.median(times)


def measure_costs(cfg: ModelConfig, rank: int, ranks: int, encoder, stage, pieces, patches, tokens,
                  pipe_group, side_group, repeats: int = 5, grad_group=None) -> MeasuredCosts:
    """Times this rank's stage, the encoder's pieces, p2p, the gradient sync (on ``grad_group``,
    default ``side_group``) and the optimizer on the device of ``patches``, and shares the figures
    so that every rank plans from the same costs."""
    mb = cfg.microbatch_size
    device = patches.device
    grad_group = side_group if grad_group is None else grad_group
    # Encoder pieces, forward and backward, one microbatch.
    n = len(pieces)
    fwd_t = [[] for _ in range(n)]
    bwd_t = [[] for _ in range(n)]
    for rep in range(repeats + 1):
        run = MicrobatchRun(pieces, (patches[:mb],))
        for i in range(n):
            t = _now(device)
            run.forward_piece(i)
            fwd_t[i].append(_now(device) - t)
        run.output_grad = torch.ones_like(run.output())
        for i in range(n - 1, -1, -1):
            t = _now(device)
            run.backward_piece(i)
            bwd_t[i].append(_now(device) - t)
    piece_fwd = [statistics.median(x[1:]) for x in fwd_t]
    piece_bwd = [statistics.median(x[1:]) for x in bwd_t]
    # This rank's stage.
    act = torch.randn(mb, cfg.patches + cfg.text_len, cfg.llm_dim, device=device)
    if rank == 0:
        image = torch.randn(mb, cfg.patches, cfg.llm_dim, device=device)
        stage.encoder_output = lambda _k: image
        run_fwd = lambda: stage(tokens[:mb], torch.tensor([0]))  # noqa: E731
    else:
        leaf = act.clone().requires_grad_(True)
        run_fwd = lambda: stage(leaf)  # noqa: E731
    stage_fwd = _timed(lambda: run_fwd(), repeats, device)
    bwd_times = []
    for _ in range(repeats + 1):
        out = run_fwd()
        grad = torch.ones_like(out)
        t = _now(device)
        out.backward(grad)
        bwd_times.append(_now(device) - t)
    stage_bwd = statistics.median(bwd_times[1:])
    # Pipeline p2p latency: ping-pong of one activation between neighbours.
    p2p = 0.0
    dist.barrier(group=side_group)
    if ranks > 1 and rank < 2:
        buf = act.clone()

        def ping() -> None:
            if rank == 0:
                dist.send(buf, 1, group=pipe_group)
                dist.recv(buf, 1, group=pipe_group)
            else:
                dist.recv(buf, 0, group=pipe_group)
                dist.send(buf, 0, group=pipe_group)

        for _ in range(2):  # warm-up
            ping()
        t = _now(device)
        for _ in range(repeats):
            ping()
        p2p = (_now(device) - t) / (2 * repeats)
    # Gradient sync of the encoder and the optimizer step.
    dist.barrier(group=side_group)
    sync = _timed(lambda: sync_grads(encoder, grad_group, zero=True), repeats, device) if ranks > 1 else 0.0
    params = [p for m in (encoder, stage) for p in m.parameters()]
    for p in params:
        p.grad = torch.zeros_like(p)
    opt = torch.optim.SGD(params, lr=0.0)
    optimizer = _timed(lambda: (opt.step(), opt.zero_grad(set_to_none=False)), repeats, device)
    for p in params:
        p.grad = None
    mine = {"stage_fwd": stage_fwd, "stage_bwd": stage_bwd, "p2p": p2p, "piece_fwd": piece_fwd,
            "piece_bwd": piece_bwd, "sync": sync, "optimizer": optimizer}
    every: list = [None] * ranks
    dist.all_gather_object(every, mine, group=side_group)
    return MeasuredCosts(
        stage_fwd_s=[e["stage_fwd"] for e in every], stage_bwd_s=[e["stage_bwd"] for e in every],
        p2p_s=max(e["p2p"] for e in every),
        piece_fwd_s=[statistics.mean(e["piece_fwd"][i] for e in every) for i in range(n)],
        piece_bwd_s=[statistics.mean(e["piece_bwd"][i] for e in every) for i in range(n)],
        grad_sync_s=max(e["sync"] for e in every), optimizer_s=max(e["optimizer"] for e in every))


def sync_grads(module: nn.Module, group, zero: bool = False) -> None:
    """Sums ``module``'s gradients over the ranks of ``group`` (one flat all-reduce)."""
    params = list(module.parameters())
    flat = torch.cat([p.new_zeros(p.numel()) if zero or p.grad is None else p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, group=group)
    if zero:
        return
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
        offset += p.numel()


def run_rank(rank: int, args: argparse.Namespace, cfg: ModelConfig, port: int, result_path: str) -> None:
    """One rank: gloo on the CPU; on CUDA, NCCL for the pipeline and the gradient sync, GPU
    ``rank % device_count`` and the step on a high-priority stream (the filler's side stream has
    the lowest)."""
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=args.timeout)
    if args.device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=args.ranks, timeout=timeout)
    try:
        with torch.cuda.stream(llm_stream(device)) if device.type == "cuda" else contextlib.nullcontext():
            _train(rank, args, cfg, result_path, device)
    finally:
        dist.destroy_process_group()


def _train(rank: int, args: argparse.Namespace, cfg: ModelConfig, result_path: str, device: torch.device) -> None:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    check_torch_version()
    trace_path = os.environ.get("PYBUBBLE_TRACE")  # last step's tasks, ops and waits per rank
    ranks, m, mb = args.ranks, cfg.microbatches, cfg.microbatch_size
    pipe_group = dist.group.WORLD
    # Barriers, cost sharing and the boundary's tagged sends stay on gloo (in host memory); on
    # CUDA the encoder's gradient all-reduce goes through NCCL after the pipeline step.
    side_group = dist.new_group(list(range(ranks)), backend="gloo", timeout=datetime.timedelta(seconds=args.timeout))
    grad_group = pipe_group if device.type == "cuda" else side_group
    encoder = build_encoder(cfg).to(device)
    stage_module = build_stages(cfg, ranks)[rank].to(device)
    pieces = split_into_pieces(encoder)
    patches, tokens, targets = (t.to(device) for t in make_batch(cfg, 0))
    costs = measure_costs(cfg, rank, ranks, encoder, stage_module, pieces, patches, tokens, pipe_group, side_group,
                          grad_group=grad_group)
    plan = make_plan(args.mode, costs, m)
    predicted = predict_step_s(args.mode, costs, m)

    # Shapes are inferred by torch.distributed.pipelining (FirstStage answers meta inputs).
    stage = PipelineStage(stage_module, rank, ranks, device, group=pipe_group)
    schedule = Schedule1F1B(stage, m, loss_fn=loss_fn(cfg), scale_grads=False)
    params = [p for mod in (encoder, stage_module) for p in mod.parameters()]
    opt = torch.optim.SGD(params, lr=cfg.lr)
    boundary = BoundaryCommunicator(group=side_group, rank=rank, first_stage_rank=0, producer=plan.producer,
                                    assignment=plan.assignment, output_shape=(mb, cfg.patches, cfg.llm_dim),
                                    device=device)
    side = side_stream(device)  # None on the CPU: the filler runs tasks on the host
    starts, ends, stats = [], [], []
    for step in range(args.steps):
        if rank == args.fail_rank and step == args.fail_step:
            raise RuntimeError(f"injected fault on rank {rank} at step {step} (--fail-rank/--fail-step)")
        patches, tokens, targets = (t.to(device) for t in make_batch(cfg, step))
        dist.barrier(group=side_group)
        starts.append(time.perf_counter())
        boundary.begin_step()
        work = EncoderStep(plan=plan, rank=rank, pieces=pieces, costs=costs, boundary=boundary,
                           inputs=lambda k: (patches[k * mb:(k + 1) * mb],), side=side)
        filler = work.filler
        if trace_path:
            filler.trace = []
        if rank == 0:
            stage_module.encoder_output = work.output
        filler.run_front()
        if args.mode != "megatron":
            # Frame 0 of the plan is the same on every rank: the end of the longest front part.
            dist.barrier(group=side_group)
        filler.begin_step()
        with fill_pipeline_waits(filler, stage):
            if rank == 0:
                schedule.step(tokens, torch.arange(m, dtype=torch.int64))
            elif rank == ranks - 1:
                schedule.step(target=targets)
            else:
                schedule.step()
        filler.drain()
        boundary.end_step()
        if args.mode != "megatron":
            sync_grads(encoder, grad_group)
        opt.step()
        opt.zero_grad()
        ends.append(_now(device))
        stats.append(asdict(filler.stats))
        if trace_path and step == args.steps - 1:
            with open(f"{trace_path}.rank{rank}.json", "w") as f:
                json.dump({"start": starts[-1], "events": filler.trace}, f)
    mine = checksum([stage_module] + ([encoder] if rank == 0 else []))
    every: list = [None] * ranks
    dist.all_gather_object(every, {"starts": starts, "ends": ends, "checksum": mine, "stats": stats}, group=side_group)
    if rank == 0:
        step_times = [max(e["ends"][s] for e in every) - min(e["starts"][s] for e in every)
                      for s in range(args.steps)]
        report = {
            "format": "pybubble.runtime_report/1", "mode": args.mode, "ranks": ranks, "steps": args.steps,
            "size": args.size, "device": device.type, "step_times_s": step_times,
            "median_step_s": statistics.median(step_times),
            "predicted_step_s": predicted, "param_checksum": sum(e["checksum"] for e in every),
            "costs": asdict(costs),
            "filler": [e["stats"][-1] for e in every],
        }
        with open(result_path, "w") as f:
            json.dump(report, f, indent=1)


# -- launcher ------------------------------------------------------------------------------------
def _worker(rank: int, args: argparse.Namespace, cfg: ModelConfig, port: int, result_path: str) -> None:
    try:
        run_rank(rank, args, cfg, port, result_path)
    except BaseException as e:
        print(f"rank {rank}: error: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        if os.environ.get("PYBUBBLE_TRACEBACK"):
            traceback.print_exc()
        os._exit(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args: argparse.Namespace) -> dict:
    """Runs the ranks as processes; returns the report or raises ``RuntimeError`` when a rank failed
    (after every rank has ended)."""
    import tempfile

    import torch.multiprocessing as mp

    cfg = SIZES[args.size]
    with tempfile.TemporaryDirectory() as tmp:
        result_path = os.path.join(tmp, "report.json")
        ctx = mp.start_processes(_worker, args=(args, cfg, _free_port(), result_path), nprocs=args.ranks,
                                 join=False, start_method="spawn")
        failed_at = None
        deadline = None
        while True:
            codes = [p.exitcode for p in ctx.processes]
            if all(c is not None for c in codes):
                break
            if failed_at is None and any(c not in (None, 0) for c in codes):
                failed_at = time.monotonic()
                deadline = failed_at + args.timeout
            if deadline is not None and time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.exitcode is None:
                        p.kill()
            time.sleep(0.05)
        for p in ctx.processes:
            p.join()
        codes = [p.exitcode for p in ctx.processes]
        if any(c != 0 for c in codes):
            bad = [f"rank {r} exit {c}" for r, c in enumerate(codes) if c != 0]
            raise RuntimeError(f"training failed ({', '.join(bad)})")
        with open(result_path) as f:
            report = json.load(f)
    if args.reference:
        report["reference_checksum"] = reference_checksum(cfg, args.ranks, args.steps)
    return report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pybubble.examples.mllm", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2, help="pipeline stages, one process each (default 2)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--mode", default="pybubble", help="megatron, coarse or pybubble")
    p.add_argument("--report", help="write the report (JSON) here")
    p.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, one GPU per rank)")
    p.add_argument("--size", default="small", help=f"model size: {', '.join(SIZES)}")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a rank waits for a failed peer")
    p.add_argument("--fail-rank", type=int, default=-1, help="inject a fault on this rank (tests)")
    p.add_argument("--fail-step", type=int, default=0, help="... at this step")
    p.add_argument("--reference", action="store_true", help="also train in one process and report its checksum")
    return p.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    if args.ranks < 2:
        raise ValueError(f"ranks: {args.ranks} is not >= 2")
    if args.steps < 1:
        raise ValueError(f"steps: {args.steps} is not >= 1")
    if args.mode not in MODES:
        raise ValueError(f"mode: {args.mode!r} is not one of {', '.join(MODES)}")
    if args.size not in SIZES:
        raise ValueError(f"size: {args.size!r} is not one of {', '.join(SIZES)}")
    if args.device not in ("cpu", "cuda"):
        raise ValueError(f"device: {args.device!r} is not one of cpu, cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' but no CUDA device is available (torch.cuda.is_available() is False)")
    if args.device == "cuda" and torch.cuda.device_count() < args.ranks:
        # NCCL refuses two ranks of one communicator on the same GPU.
        raise ValueError(f"device: 'cuda' needs one GPU per rank ({args.ranks} ranks, "
                         f"{torch.cuda.device_count()} GPUs)")
    if not args.timeout > 0:
        raise ValueError(f"timeout: {args.timeout} is not > 0")
    if args.fail_rank >= args.ranks:
        raise ValueError(f"fail_rank: {args.fail_rank} is not a rank (< {args.ranks})")
    if SIZES[args.size].microbatches < args.ranks:
        raise ValueError(f"ranks: {args.ranks} exceeds the microbatches of size {args.size!r}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        check_args(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.device == "cuda" and (note := serialised_streams_note()):
        print(f"note: {note}", file=sys.stderr)
    try:
        report = launch(args)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    text = json.dumps(report, indent=1)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text)
    print(f"{args.mode}: median step {report['median_step_s'] * 1e3:.1f} ms, predicted "
          f"{report['predicted_step_s'] * 1e3:.1f} ms, param_checksum {report['param_checksum']:.9g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
