"""The encoder cut into kernel-level pieces gives the unsplit module's outputs and gradients."""

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from pybubble.runtime import MicrobatchRun, ViTBlock, split_into_pieces  # noqa: E402


def split_run(encoder, x, grad):
    pieces = split_into_pieces(encoder)
    run = MicrobatchRun(pieces, (x,))
    for i in range(len(pieces)):
        run.forward_piece(i)
    out = run.output()
    run.output_grad = grad
    for i in range(len(pieces) - 1, -1, -1):
        run.backward_piece(i)
    assert run.backward_done
    return out, [p.grad.clone() for p in encoder.parameters()]


def unsplit_run(encoder, x, grad):
    out = encoder(x)
    out.backward(grad)
    return out.detach(), [p.grad.clone() for p in encoder.parameters()]


ENCODERS = {
    "vit_block": lambda: nn.Sequential(nn.Linear(12, 16), ViTBlock(16, 4), ViTBlock(16, 2), nn.LayerNorm(16)),
    "encoder_layer_pre_norm": lambda: nn.Sequential(
        nn.Linear(12, 16),
        nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=True),
        nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=True, activation="gelu")),
    "encoder_layer_post_norm": lambda: nn.Sequential(
        nn.TransformerEncoderLayer(12, 3, 24, dropout=0.0, batch_first=True, norm_first=False)),
}


@pytest.mark.parametrize("name", ENCODERS)
def test_pieces_give_the_unsplit_gradients(name):
    torch.manual_seed(0)
    encoder = ENCODERS[name]().double()
    x = torch.randn(3, 7, 12, dtype=torch.float64)
    width = 12 if name == "encoder_layer_post_norm" else 16
    grad = torch.randn(3, 7, width, dtype=torch.float64)
    out_ref, grads_ref = unsplit_run(encoder, x, grad)
    encoder.zero_grad(set_to_none=True)
    out, grads = split_run(encoder, x, grad)
    torch.testing.assert_close(out, out_ref, rtol=1e-12, atol=1e-12)
    assert len(grads) == len(grads_ref)
    for g, r in zip(grads, grads_ref):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)


def test_blocks_are_cut_into_kernel_pieces():
    names = [p.name for p in split_into_pieces(ENCODERS["vit_block"]())]
    assert names == ["0", "1.qkv", "1.attn", "1.proj", "1.fc1", "1.fc2",
                     "2.qkv", "2.attn", "2.proj", "2.fc1", "2.fc2", "3"]


def test_pieces_run_in_order():
    run = MicrobatchRun(split_into_pieces(ENCODERS["vit_block"]()), (torch.randn(1, 2, 12),))
    with pytest.raises(RuntimeError, match="out of order"):
        run.forward_piece(1)
    for i in range(len(run.pieces)):
        run.forward_piece(i)
    with pytest.raises(RuntimeError, match="output gradient"):
        run.backward_piece(len(run.pieces) - 1)


def test_bad_encoders_are_refused():
    with pytest.raises(ValueError, match="encoder: ViTBlock is not an nn.Sequential"):
        split_into_pieces(ViTBlock(8, 2))
    with pytest.raises(ValueError, match=r"0.dropout: 0.1 is not 0"):
        split_into_pieces(nn.Sequential(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1, batch_first=True)))
    with pytest.raises(ValueError, match="batch_first=False"):
        split_into_pieces(nn.Sequential(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0)))
