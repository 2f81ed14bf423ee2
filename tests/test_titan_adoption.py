"""The parts of pybubble's torchtitan integration that need torch only (torchtitan itself is
tested in tests/test_titan_integration.py, where it is installed): taking the encoder out of a
whole model, the stage's stand-in, the encoder's model part for the trainer's optimizer, clipping
and checkpoint, and the precision check."""

import sys

import pytest
import torch
from torch import nn

from pybubble.integrations.torchtitan import EncoderPart, EncoderStandIn, TitanEncoder, compute_dtype


class Whole(nn.Module):
    def __init__(self):
        super().__init__()
        self.vision_encoder = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8))
        self.tok_embeddings = nn.Embedding(10, 8)


def test_importing_the_integration_does_not_import_torchtitan(tmp_path):
    import subprocess

    out = subprocess.run([sys.executable, "-c", "import sys, pybubble.integrations.torchtitan; "
                          "print('torchtitan' in sys.modules)"], capture_output=True, text=True, check=True,
                         cwd=tmp_path)  # the installed package, not a checkout's pybubble/ folder
    assert out.stdout.strip() == "False"


def test_take_leaves_a_parameter_free_stand_in():
    model = Whole()
    encoder = model.vision_encoder
    adoption = TitanEncoder.take(model)
    assert adoption.encoder is encoder and isinstance(model.vision_encoder, EncoderStandIn)
    assert not list(model.vision_encoder.parameters())
    assert [n for n, _ in model.named_parameters()] == ["tok_embeddings.weight"]
    with pytest.raises(ValueError, match="model: Whole.vision_encoder is EncoderStandIn, not the vision encoder"):
        TitanEncoder.take(model)
    with pytest.raises(ValueError, match="model: Whole.image_tower is NoneType"):
        TitanEncoder.take(Whole(), name="image_tower")


def test_the_stand_in_refuses_to_run_before_the_runtime_and_answers_meta_inputs():
    stand_in = EncoderStandIn()
    with pytest.raises(RuntimeError, match="called before TitanEncoder.start"):
        stand_in(torch.zeros(2, 4))

    class Shapes:  # what the stand-in reads of the runtime on meta inputs
        output_shape, output_dtype = (2, 3, 8), torch.float32

    stand_in.runtime = Shapes()
    out = stand_in(torch.zeros(2, 4, device="meta"))
    assert out.is_meta and tuple(out.shape) == (2, 3, 8)


def test_the_encoders_part_holds_its_parameters_under_the_whole_models_names():
    encoder = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8))
    part = EncoderPart(encoder, "vision_encoder")
    assert [n for n, _ in part.named_parameters()] == [f"vision_encoder.{n}" for n, _ in encoder.named_parameters()]
    assert all(a is b for a, b in zip(part.parameters(), encoder.parameters()))
    with pytest.raises(RuntimeError, match="the runtime runs the encoder"):
        part(torch.zeros(1, 4))


def test_beside_dtensor_parameters_the_part_is_a_replicated_view_a_norm_counts_once(world_of_one):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))
    encoder = nn.Linear(3, 2)
    part = EncoderPart(encoder, "vision_encoder", mesh)
    views = dict(part.named_parameters())
    assert set(views) == {"vision_encoder.weight", "vision_encoder.bias"}
    assert all(isinstance(v, DTensor) for v in views.values())
    encoder(torch.ones(4, 3)).sum().backward()
    part.expose_grads()
    llm = nn.Parameter(distribute_tensor(torch.zeros(4, 2), mesh, [Shard(0)]))
    llm.grad = distribute_tensor(torch.full((4, 2), 1.0), mesh, [Shard(0)])
    grads = [llm.grad, *(v.grad for v in views.values())]
    total = torch.nn.utils.get_total_norm(grads, 2.0, False, True).full_tensor()
    expected = (8.0 + float(encoder.weight.grad.pow(2).sum() + encoder.bias.grad.pow(2).sum())) ** 0.5
    assert abs(float(total) - expected) < 1e-5
    torch.nn.utils.clip_grads_with_norm_([llm, *views.values()], 1.0, total, True)  # the clipping scales ...
    assert abs(float(encoder.weight.grad.norm()) - float(views["vision_encoder.weight"].grad.to_local().norm())) == 0
    torch.optim.SGD(views.values(), lr=1.0).step()  # ... and the optimizer moves the encoder's own parameters
    assert torch.equal(encoder.weight.detach(), views["vision_encoder.weight"].to_local().detach())


def test_the_encoder_follows_the_stages_mixed_precision(world_of_one):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))

    def stage(dtype):
        return fully_shard(nn.Linear(4, 4), mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=dtype))

    assert compute_dtype([stage(torch.bfloat16)], nn.Linear(2, 2)) == torch.bfloat16
    assert compute_dtype([stage(None)], nn.Linear(2, 2)) is None  # no cast: the parameters' own
    assert compute_dtype([stage(torch.float32)], nn.Linear(2, 2)) is None  # the same as the encoder's
    with pytest.raises(ValueError, match="mixed precision: the LLM's FSDP2 policies compute in"):
        compute_dtype([stage(torch.bfloat16), stage(torch.float16)], nn.Linear(2, 2))


def test_pieces_in_a_compute_dtype_repeat_the_module_cast_to_it():
    """What FSDP2's mixed precision does to the LLM, the pieces do to the encoder: forward in the
    compute dtype, gradients back in the parameters' (bit for bit the module cast to it)."""
    import copy

    from pybubble.runtime.segments import MicrobatchRun, split_into_pieces

    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))
    cast = copy.deepcopy(encoder).to(torch.bfloat16)
    x = torch.randn(3, 8).to(torch.bfloat16)
    pieces = split_into_pieces(encoder, (x,), torch.bfloat16)
    run = MicrobatchRun(pieces, (x,))
    for i in range(len(pieces)):
        run.forward_piece(i)
    want = cast(x)
    assert run.output().dtype == torch.bfloat16 and torch.equal(run.output(), want)
    run.output_grad = torch.ones_like(want)
    for i in reversed(range(len(pieces))):
        run.backward_piece(i)
    want.float().sum().backward()
    for mine, theirs in zip(encoder.parameters(), cast.parameters()):
        assert mine.grad.dtype == torch.float32 and torch.equal(mine.grad, theirs.grad.float())
