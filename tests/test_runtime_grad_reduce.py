"""How the runtime reduces the encoder's gradients: over dp as the trainer reduces the LLM's
(``dp_reduce``: the mean, the sum, or read off the stages' FSDP2 / DDP modules, refused where it
cannot tell or where a stated one disagrees), and where they land (``grads_to``)."""

import textwrap

import pytest
import torch
from torch import nn

from pybubble.runtime import RuntimeOptions
from pybubble.runtime.grad_sync import dp_reduction


def sharded(world_of_one, divide: float | None = None) -> nn.Module:
    """A two-layer module under FSDP2 on the one-rank mesh, its divide factor set where given."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    module = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    fully_shard(module[0], mesh=mesh)
    fully_shard(module, mesh=mesh)
    if divide is not None:
        for m in (module[0], module):  # every FSDP2 module, as torchtitan's disable_fsdp_gradient_division
            m.set_gradient_divide_factor(divide)
    return module


def test_options_name_a_bad_reduction_or_destination():
    with pytest.raises(ValueError, match="dp_reduce: 'avg' is not one of auto, mean, sum"):
        RuntimeOptions(dp_reduce="avg")
    with pytest.raises(ValueError, match="grads_to: 'last' is not one of every_rank, first_stage"):
        RuntimeOptions(grads_to="last")
    with pytest.raises(ValueError, match="compute_dtype: torch.int8 is not a floating torch.dtype"):
        RuntimeOptions(compute_dtype=torch.int8)
    assert RuntimeOptions().dp_reduce == "auto" and RuntimeOptions().grads_to == "every_rank"


def test_auto_reads_fsdp2s_division(world_of_one):
    assert dp_reduction("auto", [sharded(world_of_one)], 4) == "mean"  # FSDP2's default
    assert dp_reduction("auto", [sharded(world_of_one, 1.0)], 4) == "sum"  # torchtitan's
    assert dp_reduction("auto", [sharded(world_of_one, 4.0)], 4) == "mean"  # divided by the replicas


def test_a_stated_reduction_against_the_stages_is_refused(world_of_one):
    with pytest.raises(ValueError, match=r"dp_reduce: 'mean', but the stages' modules take the sum .* over dp 2"):
        dp_reduction("mean", [sharded(world_of_one, 1.0)], 2)
    assert dp_reduction("sum", [sharded(world_of_one, 1.0)], 2) == "sum"


def test_auto_without_a_data_parallel_wrapper_is_refused_not_guessed(world_of_one):
    with pytest.raises(ValueError, match="dp_reduce: 'auto' cannot tell .* dp 2 .* pass options.dp_reduce"):
        dp_reduction("auto", [nn.Linear(2, 2)], 2)
    assert dp_reduction("sum", [nn.Linear(2, 2)], 2) == "sum"
    assert dp_reduction("auto", [nn.Linear(2, 2)], 1) == "mean"  # one replica: nothing to reduce


def test_modules_that_reduce_two_ways_are_refused(world_of_one):
    with pytest.raises(ValueError, match="more than one way"):
        dp_reduction("auto", [sharded(world_of_one), sharded(world_of_one, 1.0)], 2)
    with pytest.raises(ValueError, match="a divide factor of 3"):
        dp_reduction("auto", [sharded(world_of_one, 3.0)], 2)


WORKER = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    from torch import nn
    from pybubble.runtime.grad_sync import share_grads, sync_grads
    rank, port = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    m = nn.Linear(2, 1, bias=False)
    def fill(v):
        m.weight.grad = torch.full((1, 2), float(v))
    fill(rank + 1); sync_grads(m, None, dist.group.WORLD, mean=True); print("mean", m.weight.grad.tolist())
    fill(rank + 1); sync_grads(m, None, dist.group.WORLD, mean=False); print("sum", m.weight.grad.tolist())
    fill(rank + 1); sync_grads(m, dist.group.WORLD, None, to=0)
    print("to0", None if m.weight.grad is None else m.weight.grad.tolist())
    if rank == 0:
        m.weight.grad *= 0.5  # what a clipping would do on the rank that holds them
    share_grads(m, dist.group.WORLD, 0); print("shared", m.weight.grad.tolist())
    dist.destroy_process_group()
""")


def test_gradients_summed_or_averaged_and_landing_on_one_rank_then_shared(two_ranks):
    outs = [dict(line.split(" ", 1) for line in out.strip().splitlines()) for out, _ in two_ranks(WORKER, 60)]
    for out in outs:
        assert out["mean"] == "[[1.5, 1.5]]" and out["sum"] == "[[3.0, 3.0]]"
        assert out["shared"] == "[[1.5, 1.5]]"  # the clipped sum, on both ranks
    assert outs[0]["to0"] == "[[3.0, 3.0]]" and outs[1]["to0"] == "None"
