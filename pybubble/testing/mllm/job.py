"""The test trainer's job: its command line (the options of the former example trainer, which the
tests and benchmarks name its configurations by), each option checked with a ``ValueError`` naming
it, and what follows from them (the size's config, the stages per rank, the backend)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os

import torch
from torch.distributed import pipelining

from ...data.files import read_samples
from ...data.samples import Samples
from ...placement.step_placement import PLACEMENTS
from . import qwen_vision, titan_vision
from .faults import FAULTS
from ...config.processors import PROCESSORS
from .model import ENCODER_KINDS, NATIVE_SIZES, PACKED_KINDS, PROCESSOR_OF, SIZES, VARYING_SIZES, ModelConfig, encoder_tokens


DATA = ("fixed", "mix", "file")
"""--data: one image per sample, the same shape every step (fixed); samples from a seeded open-VLM
mix (mix); a user's samples (--data-file)."""


TORCH_SCHEDULES = {"1f1b": "Schedule1F1B", "gpipe": "ScheduleGPipe", "interleaved_1f1b": "ScheduleInterleaved1F1B",
             "interleaved_zb": "ScheduleInterleavedZeroBubble", "zbv": "ScheduleZBVZeroBubble",
             "dualpipev": "ScheduleDualPipeV"}
"""--schedule: torch.distributed.pipelining's schedule classes (the last two hold two stages per
rank in a V: the first and the last stage on rank 0)."""


PLANNED_SCHEDULES = ("1f1b", "gpipe", "interleaved_1f1b", "zbv")
"""--schedule values that --write-config can describe (the planner's own schedule names)."""


SINGLE_STAGE = ("1f1b", "gpipe")
"""Schedules of one stage per rank."""


V_SHAPED = ("zbv", "dualpipev")
"""Schedules that hold two stages per rank in a V (the first and the last stage on rank 0)."""


SPLIT_BACKWARD = ("interleaved_zb", "zbv", "dualpipev")
"""Schedules that split some backwards into I and W."""


DP_WRAPS = ("fsdp", "ddp")
"""--dp-wrap: how the LLM's stages are data-parallel (FSDP2 or DDP)."""


def build_parser() -> argparse.ArgumentParser:
    """The trainer's options."""
    p = argparse.ArgumentParser(prog="python -m pybubble.testing.mllm",
                                description="pybubble's test trainer: a small multimodal LLM trained with a pipeline "
                                            "over CPU ranks (gloo) or GPUs (NCCL), its encoder run by EncoderRuntime")
    p.add_argument("--ranks", type=int, default=0,
                   help="processes to start (without torchrun; default dp x pp, or 2)")
    p.add_argument("--pp", type=int, default=0, help="pipeline stages, one rank each (default: ranks / dp)")
    p.add_argument("--dp", type=int, default=1, help="data-parallel replicas of the pipeline (default 1)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks of each stage (default 1)")
    p.add_argument("--dp-wrap", default="fsdp", help=f"how the LLM's stages are data-parallel: {', '.join(DP_WRAPS)}")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--mode", default="pybubble",
                   help="megatron, coarse or pybubble; several, comma-separated (megatron,coarse,pybubble): trained "
                        "in turn by the same ranks, each from the seed, the report a dict by mode")
    p.add_argument("--encoder", default="vit", help=f"the vision encoder: {', '.join(ENCODER_KINDS)}")
    p.add_argument("--report", help="write the report (JSON) here")
    p.add_argument("--profile", help="write a torch.profiler Chrome trace of the last step per rank into this folder")
    p.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, one GPU per rank)")
    p.add_argument("--size", default="small", help=f"model size: {', '.join(SIZES)}")
    p.add_argument("--microbatches", type=int, default=0, help="microbatches per step (default: the size's)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a rank waits for a failed peer")
    p.add_argument("--fail-rank", type=int, default=-1, help="inject a fault on this rank (tests)")
    p.add_argument("--fail-step", type=int, default=0, help="... at this step")
    p.add_argument("--fault", default="raise", help=f"... of this kind: {', '.join(FAULTS)}")
    p.add_argument("--reference", action="store_true", help="also train in one process and report its checksum")
    p.add_argument("--schedule", default="1f1b", help=f"the pipeline schedule: {', '.join(TORCH_SCHEDULES)}")
    p.add_argument("--chunks", type=int, default=0,
                   help="stages per rank (default: 1; 2 for zbv and dualpipev, which need 2)")
    p.add_argument("--dp-dim", default="dp",
                   help="the mesh's data-parallel dimension's name (default dp; e.g. torchtitan's dp_shard)")
    p.add_argument("--data", default="fixed",
                   help=f"the step's samples: {', '.join(DATA[:2])} (fixed: one image per sample, the same shape "
                        "every step; mix: text and 0..N images of 1..13 tiles, videos, from a seeded open-VLM mix)")
    p.add_argument("--data-file", metavar="FILE",
                   help='replay your samples: JSON lines, one sample each, {"tiles": [t1, t2, ...], "text": N}')
    p.add_argument("--chunk-tiles", type=int, default=0,
                   help="varying data: tiles the encoder's pieces run on at a time (default: the size's)")
    p.add_argument("--chunk-patches", type=int, default=0,
                   help="native-resolution encoders: patches of a chunk the pieces run on (default: the size's)")
    p.add_argument("--balance", default="on",
                   help="varying data: on (samples balanced over the microbatches, heaviest in the most room) or off")
    p.add_argument("--piece-ms", type=float, metavar="MS",
                   help="pybubble's pieces: the encoder's kernels merged to at least MS ms forward and backward "
                        "(0: one kernel each; default: automatic, see docs/runtime.md; the baselines run it unsplit)")
    p.add_argument("--dump-plan", metavar="DIR", help="write each rank's plan of the last step (JSON) into DIR")
    p.add_argument("--write-config", metavar="FILE",
                   help="write the pybubble planning config of this run's models and ranks (YAML) and exit")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The job of command line ``argv``, with what follows from it (the ranks under torchrun or by
    default, the pipeline's degree, the modes); check it with :func:`check_args`."""
    args = build_parser().parse_args(argv)
    args.torchrun = "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)
    args.given_ranks = args.ranks
    args.modes = args.mode.split(",")
    args.given_data = args.data
    if args.data_file:
        args.data = "file"
    if args.torchrun:
        args.ranks = int(os.environ["WORLD_SIZE"])
    elif not args.ranks:
        args.ranks = args.dp * args.pp * max(args.tp, 1) if args.pp else 2 * args.dp
    if not args.pp and args.dp >= 1 and args.tp >= 1:
        args.pp = args.ranks // (args.dp * args.tp)
    return args


def check_ranks(args: argparse.Namespace) -> None:
    """The ranks and their mesh: ValueError naming the option."""
    if args.torchrun and args.given_ranks and args.given_ranks != args.ranks:
        raise ValueError(f"ranks: {args.given_ranks} but torchrun started {args.ranks} processes")
    if args.ranks < 2:
        raise ValueError(f"ranks: {args.ranks} is not >= 2")
    if args.dp < 1:
        raise ValueError(f"dp: {args.dp} is not >= 1")
    if args.tp < 1:
        raise ValueError(f"tp: {args.tp} is not >= 1")
    if args.dp * args.pp * args.tp != args.ranks:
        raise ValueError(f"pp: dp {args.dp} x pp {args.pp}{f' x tp {args.tp}' if args.tp > 1 else ''} is not the "
                         f"{args.ranks} ranks")
    if args.pp < (1 if args.tp > 1 or args.dp > 1 else 2):
        raise ValueError(f"pp: {args.pp} is not >= {1 if args.tp > 1 or args.dp > 1 else 2}")
    if args.tp > 1 and args.dp > 1:
        raise ValueError(f"tp: {args.tp} beside dp {args.dp}: the trainer runs tensor parallelism without data "
                         "parallelism")


def check_run(args: argparse.Namespace) -> None:
    """The run's options: ValueError naming the option."""
    if args.dp_wrap not in DP_WRAPS:
        raise ValueError(f"dp_wrap: {args.dp_wrap!r} is not one of {', '.join(DP_WRAPS)}")
    if args.steps < 1:
        raise ValueError(f"steps: {args.steps} is not >= 1")
    if args.piece_ms is not None and not args.piece_ms >= 0:  # NaN too
        raise ValueError(f"piece_ms: {args.piece_ms} is not a number of milliseconds >= 0")
    for mode in args.modes:
        if mode not in PLACEMENTS:
            raise ValueError(f"mode: {mode!r} is not one of {', '.join(PLACEMENTS)}")
    if len(set(args.modes)) < len(args.modes):
        raise ValueError(f"mode: {args.mode!r} names a mode twice")
    if args.encoder not in ENCODER_KINDS:
        raise ValueError(f"encoder: {args.encoder!r} is not one of {', '.join(ENCODER_KINDS)}")
    if args.size not in SIZES:
        raise ValueError(f"size: {args.size!r} is not one of {', '.join(SIZES)}")
    if args.device not in ("cpu", "cuda"):
        raise ValueError(f"device: {args.device!r} is not one of cpu, cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' but no CUDA device is available (torch.cuda.is_available() is False)")
    if args.device == "cuda" and torch.cuda.device_count() < args.ranks and not args.torchrun:
        # NCCL refuses two ranks of one communicator on the same GPU.
        raise ValueError(f"device: 'cuda' needs one GPU per rank ({args.ranks} ranks, "
                         f"{torch.cuda.device_count()} GPUs)")
    if not args.timeout > 0:
        raise ValueError(f"timeout: {args.timeout} is not > 0")
    if args.fail_rank >= args.ranks:
        raise ValueError(f"fail_rank: {args.fail_rank} is not a rank (< {args.ranks})")
    if args.fault not in FAULTS:
        raise ValueError(f"fault: {args.fault!r} is not one of {', '.join(FAULTS)}")
    if not args.dp_dim.isidentifier() or args.dp_dim in ("pp", "tp"):
        raise ValueError(f"dp_dim: {args.dp_dim!r} is not a dimension name other than pp and tp")


def check_schedule(args: argparse.Namespace) -> None:
    """The schedule against the ranks and the model: ValueError naming the option."""
    if args.schedule not in TORCH_SCHEDULES:
        raise ValueError(f"schedule: {args.schedule!r} is not one of {', '.join(TORCH_SCHEDULES)}")
    if not hasattr(pipelining, TORCH_SCHEDULES[args.schedule]):
        raise ValueError(f"schedule: {args.schedule!r} needs torch.distributed.pipelining."
                         f"{TORCH_SCHEDULES[args.schedule]}, which torch {torch.__version__} does not have")
    if args.chunks < 0:
        raise ValueError(f"chunks: {args.chunks} is not >= 1")
    chunks = chunks_of(args)
    if args.schedule in SINGLE_STAGE and chunks != 1:
        raise ValueError(f"chunks: {chunks} stages per rank, but {args.schedule} runs one")
    if args.schedule in V_SHAPED and chunks != 2:
        raise ValueError(f"chunks: {chunks} stages per rank, but {args.schedule} runs two (a V)")
    if args.schedule in SPLIT_BACKWARD and args.dp > 1 and args.dp_wrap == "ddp":
        raise ValueError(f"dp_wrap: 'ddp' beside --schedule {args.schedule}, which splits the backward (I, W): torch "
                         "computes W's weight gradients with autograd.grad, which DDP's all-reduce never sees "
                         "(pytorch/pytorch#144530), so the replicas' gradients are not averaged; see "
                         "docs/runtime.md, 'Zero-bubble schedules beside data parallelism'; use --dp-wrap fsdp")
    if args.tp > 1 and args.schedule in SPLIT_BACKWARD:
        raise ValueError(f"tp: {args.tp} beside --schedule {args.schedule}, which splits the backward (I, W): the "
                         "runtime predicts TP gaps in whole forwards and backwards only; use 1f1b, gpipe or "
                         "interleaved_1f1b")
    if args.pp == 1 and args.schedule not in SINGLE_STAGE:
        raise ValueError(f"schedule: {args.schedule!r} with --pp 1 (tensor parallelism alone) is not run by the "
                         "trainer; use 1f1b or gpipe")
    layers = args.pp * SIZES[args.size].llm_layers_per_stage
    if layers % (args.pp * chunks):
        raise ValueError(f"chunks: the {layers} GPT blocks of size {args.size!r} do not split into "
                         f"{args.pp} x {chunks} stages")
    if args.schedule == "dualpipev" and config(args).microbatches < args.pp * chunks:
        raise ValueError(f"microbatches: dualpipev needs at least one per stage ({args.pp * chunks}), "
                         f"size {args.size!r} has {config(args).microbatches}")
    if args.microbatches < 0:
        raise ValueError(f"microbatches: {args.microbatches} is not >= 1")
    cfg = config(args)
    if cfg.microbatches < args.pp:
        raise ValueError(f"pp: {args.pp} exceeds the {cfg.microbatches} microbatches of size {args.size!r}")
    if cfg.llm_heads % args.tp:
        raise ValueError(f"tp: {args.tp} does not divide the {cfg.llm_heads} heads of size {args.size!r}")
    if cfg.microbatch_size % args.dp:
        raise ValueError(f"dp: {args.dp} does not divide the microbatch size {cfg.microbatch_size} of size {args.size!r}")


def check_data(args: argparse.Namespace) -> None:
    """The data options, and the data file read (every sample within the limits of the size):
    ValueError naming the option, or the file's line."""
    if args.given_data not in DATA[:2]:
        raise ValueError(f"data: {args.given_data!r} is not one of {', '.join(DATA[:2])} (or give --data-file)")
    if args.data_file and args.given_data != "fixed":
        raise ValueError(f"data: --data {args.given_data} beside --data-file: give one")
    if args.chunk_tiles < 0 or (args.chunk_tiles and args.data == "fixed"):
        raise ValueError(f"chunk_tiles: {args.chunk_tiles} is not >= 1 with varying data (--data mix or --data-file)")
    if args.balance not in ("on", "off"):
        raise ValueError(f"balance: {args.balance!r} is not one of on, off")
    if args.chunk_patches < 0 or (args.chunk_patches and args.encoder not in PACKED_KINDS):
        raise ValueError(f"chunk_patches: {args.chunk_patches} is not >= 1 with a native-resolution encoder "
                         f"({', '.join(PACKED_KINDS)})")
    if args.chunk_patches % 4:
        raise ValueError(f"chunk_patches: {args.chunk_patches} is not a multiple of the merger's 4")
    if args.encoder == "titan_vit":
        try:
            import torchtitan.models.qwen3_5.vision_encoder  # noqa: F401
        except ImportError as e:
            raise ValueError(f"encoder: 'titan_vit' needs torchtitan's qwen3_5 model ({e}); install torchtitan and "
                             "flash-linear-attention (see .ci/titan)") from None
    if args.encoder in PACKED_KINDS and args.data == "fixed":
        raise ValueError(f"encoder: {args.encoder!r} takes images at native resolution: give --data mix or "
                         "--data-file")
    if args.data != "fixed" and args.encoder == "clip":
        raise ValueError("encoder: 'clip' with varying data: its class token per tile does not pool; use vit or timm")
    if args.data == "file":
        data_samples(args)  # refuses a bad line, naming it


def check_args(args: argparse.Namespace) -> None:
    """Every option: ValueError naming the option and the value."""
    check_ranks(args)
    check_run(args)
    check_schedule(args)
    check_data(args)


def config(args: argparse.Namespace) -> ModelConfig:
    """The size's config, with ``--microbatches`` when given."""
    cfg = (SIZES if args.data == "fixed" else NATIVE_SIZES if args.encoder in PACKED_KINDS
           else VARYING_SIZES)[args.size]
    if args.microbatches:
        cfg = dataclasses.replace(cfg, microbatches=args.microbatches)
    if args.chunk_tiles:
        cfg = dataclasses.replace(cfg, chunk_tiles=args.chunk_tiles)
    if args.chunk_patches:
        cfg = dataclasses.replace(cfg, chunk_patches=args.chunk_patches)
    return cfg


def chunks_of(args: argparse.Namespace) -> int:
    """Stages per rank: ``--chunks``, or the schedule's own count (2 for a V, else 1)."""
    return args.chunks or (2 if args.schedule in V_SHAPED else 1)


def backend(args: argparse.Namespace) -> str:
    """The process groups' backend: NCCL on CUDA, else gloo."""
    return "nccl" if args.device == "cuda" else "gloo"


def mode_args(args: argparse.Namespace, mode: str) -> argparse.Namespace:
    """The options of one mode's training: ``args`` with ``--mode`` that mode (``modes`` stays the
    whole list: with several, each mode's rank files go apart, see :func:`mode_path`)."""
    return argparse.Namespace(**{**vars(args), "mode": mode})


def mode_path(args: argparse.Namespace, path: str) -> str:
    """The folder for this mode's files (``--profile``, ``--dump-plan``): ``path`` itself when one
    mode is trained, ``path/<mode>`` when several are."""
    return path if len(args.modes) == 1 else os.path.join(path, args.mode)


def planning_config(args: argparse.Namespace) -> dict:
    """The pybubble planning config that describes this run's models and ranks (``--write-config``):
    the GPT's blocks as the LLM (image tokens and text in one sequence), the vit encoder, its data- and
    pipeline-parallel degrees and its schedule on the CPU (``cluster.gpu: cpu``)."""
    cfg = config(args)
    if args.encoder != "vit":
        raise ValueError(f"write_config: the config describes the vit encoder, not {args.encoder!r}")
    if args.schedule not in PLANNED_SCHEDULES:
        raise ValueError(f"write_config: the planner has no schedule {args.schedule!r} "
                         f"(one of {', '.join(PLANNED_SCHEDULES)})")
    plan = {"dp": args.dp, "pp": args.pp, "tp": args.tp, "schedule": args.schedule}
    if args.schedule == "interleaved_1f1b":
        plan["vpp"] = chunks_of(args)
    return {"cluster": {"gpus": args.ranks, "gpu": "cpu", "gpus_per_node": args.ranks},
            "llm": {"name": "example-gpt", "layers": args.pp * cfg.llm_layers_per_stage, "hidden": cfg.llm_dim,
                    "heads": cfg.llm_heads, "ffn_hidden": 4 * cfg.llm_dim, "vocab": cfg.vocab},
            "encoders": [{"name": "example-vit", "layers": cfg.enc_layers, "hidden": cfg.enc_dim,
                          "heads": cfg.enc_heads, "ffn_hidden": 4 * cfg.enc_dim, "tokens": cfg.patches,
                          "tokens_per_sample": cfg.patches}],
            "training": {"global_batch": cfg.microbatches * cfg.microbatch_size, "micro_batch": cfg.microbatch_size // args.dp,
                         "seq_len": encoder_tokens(cfg, args.encoder) + cfg.text_len},
            "llm_plan": plan}


def data_samples(args: argparse.Namespace) -> Samples:
    """The samples of ``--data-file``, within the size's limits (read once per file and limits)."""
    cfg = config(args)
    if args.encoder in PACKED_KINDS:  # in pixels: each image's bands within a chunk, each sample within the sequence
        return _read(args.data_file, 1, None, cfg.seq_len, cfg.chunk_patches, PROCESSOR_OF[args.encoder],
                     CUT_ROWS[args.encoder])
    return _read(args.data_file, encoder_tokens(cfg, args.encoder), cfg.max_tiles, cfg.seq_len, None, None)


CUT_ROWS = {"qwen2_5_vl": qwen_vision.QWEN_WINDOW // qwen_vision.QWEN_PATCH, "titan_vit": titan_vision.MERGE}
"""Rows of patches between the places a native-resolution encoder's layout may cut an image larger
than a chunk (Qwen2.5-VL: a row of windows; torchtitan's Qwen3.5: a merged row), from the towers'
own sizes: the data file is read before the encoder is built."""


@functools.lru_cache(maxsize=8)
def _read(path: str, tokens_per_tile: int, max_tiles: int | None, max_tokens: int, max_patches: int | None,
          processor: str | None, cut_rows: int | None = None) -> Samples:
    samples = read_samples(path, tokens_per_tile=tokens_per_tile, max_tiles=max_tiles, max_tokens=max_tokens,
                           max_patches=max_patches, processor=None if processor is None else PROCESSORS[processor],
                           cut_rows=cut_rows)
    if (samples.grids is not None) != (max_patches is not None):
        raise ValueError(f"{path}: samples in {'pixels' if samples.grids is not None else 'tiles'}, but the encoder "
                         f"takes {'tiles (--encoder vit or timm)' if max_patches is None else 'pixels'}")
    return samples
