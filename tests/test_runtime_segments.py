"""The encoder cut into kernel-level pieces (traced with make_fx) gives the unsplit module's outputs
and gradients, in float64, for the encoders users have: the trainer's ViT blocks,
nn.TransformerEncoderLayer, timm VisionTransformer, Hugging Face CLIPVisionModel and
SiglipVisionModel, torchvision's VisionTransformer (the class of vit_b_16)."""

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from pybubble.runtime import MicrobatchRun, split_into_pieces  # noqa: E402
from pybubble.runtime.segments import merge_pieces  # noqa: E402

def split_run(encoder, x, grad, groups=None):
    pieces = split_into_pieces(encoder, x)
    pieces = pieces if groups is None else merge_pieces(pieces, groups(len(pieces)))
    run = MicrobatchRun(pieces, (x,))
    for i in range(len(pieces)):
        run.forward_piece(i)
    out = run.output()
    run.output_grad = grad
    for i in range(len(pieces) - 1, -1, -1):
        run.backward_piece(i)
    assert run.backward_done
    return pieces, out, [None if p.grad is None else p.grad.clone() for p in encoder.parameters()]


def first(out):
    return out if isinstance(out, torch.Tensor) else out[0]


def build(mllm, name):
    """The encoder `name` (the test trainer's ViT blocks among them: `mllm`) and its input's shape."""
    if name == "vit_blocks":
        return nn.Sequential(nn.Linear(12, 16), mllm.ViTBlock(16, 4), mllm.ViTBlock(16, 2), nn.LayerNorm(16)), (3, 7, 12)
    if name == "encoder_layer_pre_norm":
        return nn.Sequential(
            nn.Linear(12, 16),
            nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=True),
            nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=True,
                                       activation="gelu")), (3, 7, 12)
    if name == "encoder_layer_post_norm":
        return nn.TransformerEncoderLayer(12, 3, 24, dropout=0.0, batch_first=True), (3, 7, 12)
    mllm.import_vision_libraries()
    if name == "timm_vit":
        from timm.models.vision_transformer import VisionTransformer

        return VisionTransformer(img_size=16, patch_size=8, embed_dim=16, depth=2, num_heads=2, num_classes=0,
                                 global_pool=""), (2, 3, 16, 16)
    if name == "hf_clip":
        from transformers import CLIPVisionConfig, CLIPVisionModel

        return CLIPVisionModel(CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                                num_attention_heads=2, image_size=16, patch_size=8)), (2, 3, 16, 16)
    if name == "hf_siglip":
        from transformers import SiglipVisionConfig, SiglipVisionModel

        return SiglipVisionModel(SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                                    num_attention_heads=2, image_size=16, patch_size=8)), (2, 3, 16, 16)
    if name == "torchvision_vit":
        from torchvision.models.vision_transformer import VisionTransformer

        return VisionTransformer(image_size=16, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16,
                                 mlp_dim=32), (2, 3, 16, 16)
    raise KeyError(name)


ENCODER_KINDS = ["vit_blocks", "encoder_layer_pre_norm", "encoder_layer_post_norm", "timm_vit", "hf_clip", "hf_siglip",
            "torchvision_vit"]


def run_against_unsplit(mllm, name, groups=None):
    """Encoder `name` in float64 as pieces (merged by `groups(n)` when given) against the unsplit
    module: the same output and parameter gradients. Returns the pieces."""
    torch.manual_seed(0)
    encoder, shape = build(mllm, name)
    encoder = encoder.double().train()
    x = torch.randn(*shape, dtype=torch.float64)
    out_ref = first(encoder(x))
    grad = torch.randn_like(out_ref)
    out_ref.backward(grad)
    grads_ref = [None if p.grad is None else p.grad.clone() for p in encoder.parameters()]
    encoder.zero_grad(set_to_none=True)
    pieces, out, grads = split_run(encoder, x, grad, groups)
    torch.testing.assert_close(out, out_ref.detach(), rtol=1e-12, atol=1e-12)
    for g, r in zip(grads, grads_ref, strict=True):
        assert (g is None) == (r is None)
        if r is not None:
            torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)
    return pieces


@pytest.mark.parametrize("name", ENCODER_KINDS)
def test_pieces_give_the_unsplit_outputs_and_gradients(trainer_module, name):
    pieces = run_against_unsplit(trainer_module, name)
    # Kernel-level: about five pieces per transformer layer (norm + qkv, attention, projection,
    # norm + first MLP half, second MLP half; HF projects q, k and v apart), a few for the embedding
    # and the head.
    layers = 1 if name == "encoder_layer_post_norm" else 2
    assert 5 * layers <= len(pieces) <= 7 * layers + 3, [p.name for p in pieces]  # HF: q, k, v apart


@pytest.mark.parametrize("name, kernels", [("vit_blocks", 11), ("hf_clip", 15)])
@pytest.mark.parametrize("groups", [lambda n: [n], lambda n: [2] * (n // 2) + [1] * (n % 2), lambda n: [1, n - 2, 1]])
def test_merged_pieces_give_the_unsplit_outputs_and_gradients(trainer_module, name, kernels, groups):
    assert len(run_against_unsplit(trainer_module, name, groups)) == len(groups(kernels))


def test_merged_pieces_are_named_by_their_first_and_last_kernel_and_bad_groups_are_refused(trainer_module):
    encoder, shape = build(trainer_module, "vit_blocks")
    kernels = split_into_pieces(encoder, torch.randn(*shape))
    merged = merge_pieces(kernels, [1, 5, 5])
    assert [p.name for p in merged] == ["0:addmm", "1.qkv:addmm..1.fc2:addmm", "2.qkv:addmm..2.fc2:addmm"]
    assert merged[0] is kernels[0]
    for groups in ([1, 5, 4], [1, 5, 6], [0, 6, 5], [11.5], [True] * 11, []):
        with pytest.raises(ValueError, match="groups: .* do not split 11 pieces"):
            merge_pieces(kernels, groups)


def test_pieces_are_named_after_their_modules_and_kernels(trainer_module):
    encoder, shape = build(trainer_module, "vit_blocks")
    names = [p.name for p in split_into_pieces(encoder, torch.randn(*shape))]
    assert names == ["0:addmm", "1.qkv:addmm", "1:_scaled_dot_product_flash_attention_for_cpu", "1.proj:addmm",
                     "1.fc1:addmm", "1.fc2:addmm", "2.qkv:addmm", "2:_scaled_dot_product_flash_attention_for_cpu",
                     "2.proj:addmm", "2.fc1:addmm", "2.fc2:addmm"]


def test_torchvision_vit_b_16_splits_into_five_pieces_per_layer(trainer_module):
    trainer_module.import_vision_libraries()
    from torchvision.models import vit_b_16

    torch.manual_seed(0)
    encoder = vit_b_16(weights=None)
    pieces = split_into_pieces(encoder, torch.randn(1, 3, 224, 224))
    assert len(pieces) == 1 + 12 * 5 + 1  # patch embedding, 12 layers, the head
    assert pieces[1].name == "encoder.layers.encoder_layer_0.self_attention:addmm"  # batch 1: qkv in one addmm


def test_pieces_run_in_order(trainer_module):
    encoder, shape = build(trainer_module, "vit_blocks")
    x = torch.randn(1, *shape[1:])
    run = MicrobatchRun(split_into_pieces(encoder, x), (x,))
    with pytest.raises(RuntimeError, match="out of order"):
        run.forward_piece(1)
    for i in range(len(run.pieces)):
        run.forward_piece(i)
    with pytest.raises(RuntimeError, match="output gradient"):
        run.backward_piece(len(run.pieces) - 1)


class ItemLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * float(x.abs().max().item())


class NotATensor(nn.Module):
    def forward(self, x):
        return {"x": x}


@pytest.mark.parametrize("module, x, message", [
    (lambda: nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1)), (2, 4),
     r"encoder.1 \(Dropout\) cannot be split: it draws random numbers"),
    (lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)), (2, 3, 8, 8),
     r"encoder.1 \(BatchNorm2d\) cannot be split: its forward writes a parameter, buffer or input in place"),
    (lambda: nn.Sequential(nn.Identity(), ItemLoop()), (2, 4),
     r"encoder.1 \(ItemLoop\) cannot be split: tracing its forward failed: RuntimeError: .*data-dependent"),
    (lambda: NotATensor(), (2, 4), r"encoder: its forward returns dict, not a tensor"),
])
def test_a_module_that_cannot_be_split_is_named(module, x, message):
    with pytest.raises(ValueError, match=message):
        split_into_pieces(module(), torch.randn(*x))


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="encoder: function is not an nn.Module"):
        split_into_pieces(lambda x: x, torch.randn(2))
    with pytest.raises(ValueError, match=r"example: \['int'\] is not a tensor"):
        split_into_pieces(nn.Linear(2, 2), (3,))
