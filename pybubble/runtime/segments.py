"""The encoder cut into kernel-level pieces, found from the module itself.

:func:`split_into_pieces` traces one forward of the encoder with ``torch.fx``'s ``make_fx`` (real
tensors, so Python control flow is resolved on the example input, and the graph holds the aten
kernels with the glue between them: reshapes, attention, residual adds) and cuts the graph before
each kernel: a matmul-like op (``addmm``, ``mm``, ``bmm``, a convolution, an attention kernel) or a
norm, once the piece already holds a kernel. A ViT block gives five pieces: norm + qkv projection,
attention, output projection + residual, norm + first MLP half, second MLP half + residual. Forward
hooks on the submodules label the traced nodes with the module they come from (piece names, and the
errors that name a module that cannot be split). Why ``make_fx`` and not forward hooks alone or
``torch.fx.symbolic_trace``: hooks see submodule calls but cannot cut a forward between them (the
glue runs inside the block's ``forward``); symbolic tracing stops at control flow on shapes and
config (Hugging Face attention, ``nn.TransformerEncoderLayer``'s fast-path checks), and treats
``nn.MultiheadAttention`` as one leaf. ``make_fx`` records what runs, so timm ``VisionTransformer``,
Hugging Face ``CLIPVisionModel``/``SiglipVisionModel``, torchvision ``vit_b_16`` and
``nn.TransformerEncoderLayer`` split the same way. The pieces are specialised to the example
input's shapes.

Each piece maps a tuple of tensors (the values live between two kernels) to the next tuple. A
forward task runs one piece of one encoder microbatch on detached copies of the previous piece's
outputs; the backward task of that piece later runs ``torch.autograd.backward`` from its outputs
with the gradients the next piece left on its inputs. Chained, the pieces give the gradients of the
unsplit module: the parameters are the module's own, passed to each piece at each call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.fx.traceback as fx_traceback
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx
from torch.func import functional_call

from . import spans, torch_seams

State = tuple[torch.Tensor, ...]

KERNELS = torch_seams.aten_op_names(
    "addmm", "mm", "bmm", "baddbmm", "convolution",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
) | {str(spans.SEGMENT_ATTENTION)}
"""Ops that start a piece (once the piece holds one already)."""
NORMS = torch_seams.aten_op_names("native_layer_norm", "native_group_norm", "_fused_rms_norm")
"""Norms start a piece too (a norm belongs with the kernel after it)."""
RANDOM = ("native_dropout", "bernoulli", "rand", "randn", "randint", "normal", "uniform", "multinomial")


@dataclass(frozen=True, slots=True)
class Piece:
    """One kernel-level task of the encoder: ``fn(*state) -> state``."""

    name: str
    """The module its kernel comes from and the kernel, e.g. ``"blocks.1.attn.qkv:addmm"``."""
    fn: Callable[..., State]
    """The piece's forward; its parameters are those of the module it was cut from."""
    attentions: int = 0
    """Its :func:`~pybubble.runtime.spans.segment_attention` calls (run as
    :func:`~pybubble.runtime.spans.attend`): a span's chunks run such a piece together."""
    parts: tuple[Piece, ...] = ()
    """A merged piece's pieces, in order (empty: a piece of one kernel): a span runs them in turn."""


_traces = 0  # encoder forwards traced in this process


def traces_made() -> int:
    """Encoder forwards traced (cut into pieces) in this process so far: a runtime traces once, when
    it is built, and each step's record counts those made during the step (none expected)."""
    return _traces


def _first_tensor(out) -> torch.Tensor:
    """The encoder's output: a tensor, or the first tensor of a tuple or a Hugging Face ModelOutput
    (``last_hidden_state``)."""
    if isinstance(out, torch.Tensor):
        return out
    values = out.to_tuple() if hasattr(out, "to_tuple") else out
    if isinstance(values, (tuple, list)) and values and isinstance(values[0], torch.Tensor):
        return values[0]
    raise ValueError(f"encoder: its forward returns {type(out).__name__}, not a tensor (or a tuple or "
                     f"ModelOutput whose first item is one)")


@contextlib.contextmanager
def _module_labels(encoder: nn.Module, current: list[str]) -> Iterator[None]:
    """While active, nodes traced inside submodule ``name`` carry ``meta["custom"]["module"] ==
    name`` and ``current[-1]`` is the innermost module running."""
    def pre(name):
        def hook(_m, _args):
            current.append(name)
            fx_traceback.current_meta["custom"] = {"module": name}
        return hook

    def post(_m, _args, _out):
        current.pop()
        fx_traceback.current_meta["custom"] = {"module": current[-1]}

    handles = []
    try:
        for name, m in encoder.named_modules():
            if name:
                handles.append(m.register_forward_pre_hook(pre(name)))
                handles.append(m.register_forward_hook(post))
        with fx_traceback.preserve_node_meta():
            fx_traceback.current_meta["custom"] = {"module": ""}
            yield
    finally:
        for h in handles:
            h.remove()


def _module_of(node: torch.fx.Node) -> str:
    return node.meta.get("custom", {}).get("module", "")


def _module_label(encoder: nn.Module, name: str) -> str:
    if not name:
        return f"encoder ({type(encoder).__name__})"
    return f"encoder.{name} ({type(encoder.get_submodule(name)).__name__})"


def trace_encoder(encoder: nn.Module, example: Sequence[torch.Tensor], dtype: torch.dtype | None = None
                  ) -> tuple[torch.fx.GraphModule, int]:
    """The aten graph of one forward of ``encoder`` on ``example``; its first placeholders are the
    parameters and buffers (in ``named_parameters()``, ``named_buffers()`` order). Returns the
    graph and the count of those placeholders. Raises ``ValueError`` naming the module that cannot
    be split (a trace error, e.g. control flow on a tensor's value; a random op; an in-place write to a
    parameter, buffer or input). ``dtype``: the floating parameters traced cast to it (mixed precision)."""
    params = {n: in_dtype(p, dtype) for n, p in encoder.named_parameters()}
    buffers = dict(encoder.named_buffers())
    current: list[str] = [""]

    def forward(p, b, *inputs):
        return _first_tensor(functional_call(encoder, {**p, **b}, inputs))

    global _traces
    _traces += 1
    try:
        with _module_labels(encoder, current):
            gm = make_fx(forward, tracing_mode="real")(params, buffers, *example)
    except ValueError:
        raise
    except Exception as e:  # what the module did that a trace cannot follow
        raise ValueError(f"{_module_label(encoder, current[-1])} cannot be split: tracing its forward failed: "
                         f"{type(e).__name__}: {e}") from e
    gm.graph.eliminate_dead_code()  # autograd's detach() of saved outputs, unused
    fixed = len(params) + len(buffers)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        name = getattr(node.target, "__name__", str(node.target))
        where = _module_label(encoder, _module_of(node))
        if any(name.startswith(r) for r in RANDOM):
            raise ValueError(f"{where} cannot be split: it draws random numbers ({name}); its pieces would "
                             f"not repeat the unsplit forward (set dropout to 0 or call eval())")
        schema = torch_seams.op_schema(node.target)
        if schema is not None and schema.is_mutable:
            written = [a for a, arg in zip(node.args, schema.arguments)
                       if arg.alias_info is not None and arg.alias_info.is_write]
            if any(isinstance(a, torch.fx.Node) and a in placeholders for a in written):
                raise ValueError(f"{where} cannot be split: its forward writes a parameter, buffer or input "
                                 f"in place ({name}), e.g. batch-norm statistics in training mode")
    return gm, fixed


def _cut(body: list[torch.fx.Node]) -> tuple[dict[torch.fx.Node, int], int]:
    """Each node's piece: a kernel or norm starts a new piece once the current one holds a kernel;
    a trailing norm (post-norm layers) joins the last kernel's piece. Returns the parts and their
    count."""
    part: dict[torch.fx.Node, int] = {}
    index, has_kernel = 0, False
    for node in body:
        target = str(node.target)
        if node.op == "call_function" and (target in KERNELS or target in NORMS) and has_kernel:
            index, has_kernel = index + 1, False
        part[node] = index
        has_kernel = has_kernel or target in KERNELS
    if index > 0 and not has_kernel:
        for node, k in part.items():
            if k == index:
                part[node] = index - 1
        index -= 1
    return part, index + 1


def _live_in(body, inputs, part, count, result, fixed_nodes) -> list[list[torch.fx.Node]]:
    """The values each piece takes: those defined before it and read by it or later (a piece's
    outputs are the values later pieces, or the encoder's output, read)."""
    last_use: dict[torch.fx.Node, int] = {}
    for node in body:
        for arg in node.all_input_nodes:
            last_use[arg] = max(last_use.get(arg, -1), part[node])
    last_use[result] = count  # read after the last piece
    defined: dict[torch.fx.Node, int] = {n: -1 for n in inputs}
    defined.update(part)
    live_in: list[list[torch.fx.Node]] = [list(inputs)]
    for k in range(1, count):
        live_in.append([n for n in [*inputs, *body] if defined.get(n, count) < k <= last_use.get(n, -1)
                        and n not in fixed_nodes and not (n.op == "get_attr")])
    return live_in


def _piece(encoder, gm, k, body, part, placeholders, fixed_nodes, live_in, outs, weights, dtype=None) -> Piece:
    """Piece ``k``: its graph (its weights, then the values it takes, to the values it gives) and
    its name (the module its kernel comes from and the kernel)."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    used_fixed = sorted({fixed_nodes[a] for n in body if part[n] == k for a in n.all_input_nodes if a in fixed_nodes})
    for i in used_fixed:
        env[placeholders[i]] = graph.placeholder(f"w{i}")
    for n in live_in:
        env[n] = graph.placeholder(n.name)

    def arg(a: torch.fx.Node) -> torch.fx.Node:
        if a not in env and a.op == "get_attr":  # a constant of the trace, used by several pieces
            env[a] = graph.node_copy(a)
        return env[a]

    for node in body:
        if part[node] == k and node not in env:
            env[node] = graph.node_copy(node, arg)
    for n in outs:
        if n not in env:
            raise ValueError(f"{_module_label(encoder, _module_of(n))} cannot be split: value {n.name} "
                             f"crosses a cut without passing through the piece before it")
    graph.output(tuple(env[n] for n in outs))
    kernel = next((n for n in body if part[n] == k and str(n.target) in KERNELS), None)
    label = kernel or next((n for n in body if part[n] == k), None)
    module = _module_of(label) if label is not None else ""
    op = getattr(label.target, "__name__", "op").split(".")[0] if label is not None else "identity"
    for n in [*live_in, *outs]:
        if "val" in n.meta and not isinstance(n.meta["val"], torch.Tensor):
            raise ValueError(f"{_module_label(encoder, _module_of(n))} cannot be split: a "
                             f"{type(n.meta['val']).__name__} crosses the cut after piece {k}")
    attentions = [n for n in graph.nodes if n.op == "call_function" and n.target is spans.SEGMENT_ATTENTION]
    for n in attentions:  # the runtime's attention: over a span's chunks where one runs
        n.target = spans.attend
    return Piece(f"{module or 'encoder'}:{op}", _piece_fn(torch.fx.GraphModule(gm, graph),
                                                          [weights[i] for i in used_fixed], dtype), len(attentions))


def in_dtype(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """``t`` cast to ``dtype`` where it is floating and a dtype is given (an autograd cast: the
    gradient comes back in ``t``'s dtype), else ``t``."""
    return t.to(dtype) if dtype is not None and t.is_floating_point() and t.dtype != dtype else t


def split_into_pieces(encoder: nn.Module, example: torch.Tensor | Sequence[torch.Tensor],
                      dtype: torch.dtype | None = None) -> list[Piece]:
    """Cuts ``encoder`` (any ``nn.Module`` whose forward returns a tensor, or a tuple or
    ModelOutput whose first item is one) into kernel-level pieces by tracing one forward on
    ``example`` (one microbatch's inputs; the pieces only take inputs of these shapes). The
    pieces run the module's own parameters: split after moving the encoder to its device. With
    ``dtype``, they compute in it: the floating parameters cast to it at each call, as FSDP2's mixed
    precision casts the LLM's (the parameters and their gradients stay in their own dtype)."""
    if not isinstance(encoder, nn.Module):
        raise ValueError(f"encoder: {type(encoder).__name__} is not an nn.Module")
    example = (example,) if isinstance(example, torch.Tensor) else tuple(example)
    if not example or not all(isinstance(t, torch.Tensor) for t in example):
        raise ValueError(f"example: {[type(t).__name__ for t in example]} is not a tensor or tuple of tensors")
    gm, fixed = trace_encoder(encoder, example, dtype)
    weights = [*encoder.parameters(), *encoder.buffers()]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    fixed_nodes = {n: i for i, n in enumerate(placeholders[:fixed])}
    inputs = placeholders[fixed:]
    output_node = next(n for n in gm.graph.nodes if n.op == "output")
    body = [n for n in gm.graph.nodes if n.op in ("call_function", "get_attr")]
    part, count = _cut(body)
    result = output_node.args[0]
    while isinstance(result, (list, tuple)):  # make_fx's output is a pytree of the one tensor
        result = result[0]
    live_in = _live_in(body, inputs, part, count, result, fixed_nodes)
    return [_piece(encoder, gm, k, body, part, placeholders, fixed_nodes, live_in[k],
                   [result] if k == count - 1 else live_in[k + 1], weights, dtype) for k in range(count)]


def merge_pieces(pieces: Sequence[Piece], groups: Sequence[int]) -> list[Piece]:
    """Consecutive ``pieces`` run as one: ``groups[g]`` of them in group g, in order (the counts sum
    to ``len(pieces)``). A merged piece runs its pieces' forwards in turn with no detach in
    between (one autograd graph), so its backward is one ``torch.autograd.backward``: what each
    task costs of its own (its Python and autograd calls, about 0.1 ms on a CPU) is paid once per
    group. Named ``first..last``; a group of one is the piece itself."""
    if not pieces or sum(groups) != len(pieces) or any(isinstance(g, bool) or int(g) != g or g < 1 for g in groups):
        raise ValueError(f"groups: {list(groups)} do not split {len(pieces)} pieces into groups of 1 or more")
    out, start = [], 0
    for g in (int(g) for g in groups):
        part, start = pieces[start:start + g], start + g
        out.append(part[0] if g == 1 else Piece(f"{part[0].name}..{part[-1].name}", _chained([p.fn for p in part]),
                                                sum(p.attentions for p in part), tuple(part)))
    return out


def _chained(fns: Sequence[Callable[..., State]]) -> Callable[..., State]:
    def fn(*state: torch.Tensor) -> State:
        for f in fns:
            state = tuple(f(*state))
        return state
    return fn


def _piece_fn(gm: torch.fx.GraphModule, weights: list[torch.Tensor], dtype: torch.dtype | None = None
              ) -> Callable[..., State]:
    if dtype is None:
        def fn(*state: torch.Tensor) -> State:
            return gm(*weights, *state)
    else:
        def fn(*state: torch.Tensor) -> State:
            return gm(*(in_dtype(w, dtype) for w in weights), *state)
    return fn


class MicrobatchRun:
    """The state of one encoder microbatch going through the pieces: forward one piece at a time,
    then backward one piece at a time in reverse."""

    __slots__ = ("pieces", "_inputs", "_outputs", "_next_fwd", "_next_bwd", "output_grad")

    def __init__(self, pieces: Sequence[Piece], inputs: State):
        self.pieces = pieces
        self._inputs: list[State | None] = [None] * len(pieces)
        self._outputs: list[State | None] = [None] * len(pieces)
        self._inputs[0] = tuple(inputs)
        self._next_fwd = 0
        self._next_bwd = len(pieces) - 1
        self.output_grad: torch.Tensor | None = None

    @property
    def next_forward(self) -> int:
        """The piece whose forward runs next."""
        return self._next_fwd

    @property
    def next_backward(self) -> int:
        """The piece whose backward runs next (-1: none left)."""
        return self._next_bwd

    @property
    def forward_done(self) -> bool:
        """Whether every piece's forward has run."""
        return self._next_fwd == len(self.pieces)

    @property
    def backward_done(self) -> bool:
        """Whether every piece's backward has run."""
        return self._next_bwd < 0

    def output(self) -> torch.Tensor:
        """The encoder's output (detached), once every forward piece ran."""
        if not self.forward_done:
            raise RuntimeError(f"forward pieces {self._next_fwd}.. have not run")
        return self._outputs[-1][0].detach()

    def inputs(self, i: int) -> State:
        """Piece ``i``'s inputs (once the pieces before it ran)."""
        return self._inputs[i]

    def forward_piece(self, i: int) -> None:
        """Runs piece ``i``'s forward; pieces run in order."""
        if i != self._next_fwd:
            raise RuntimeError(f"forward piece {i} out of order (next is {self._next_fwd})")
        with torch.enable_grad():
            self.take_forward(i, tuple(self.pieces[i].fn(*self._inputs[i])))

    def take_forward(self, i: int, outputs: State) -> None:
        """Piece ``i``'s forward ran and gave ``outputs`` (from :meth:`inputs`, with autograd): kept
        for its backward, detached as the next piece's inputs."""
        if i != self._next_fwd:
            raise RuntimeError(f"forward piece {i} out of order (next is {self._next_fwd})")
        self._outputs[i] = tuple(outputs)
        if i + 1 < len(self.pieces):
            self._inputs[i + 1] = tuple(
                t.detach().requires_grad_(t.requires_grad) for t in self._outputs[i])
        self._next_fwd += 1

    def backward_piece(self, i: int) -> None:
        """Runs piece ``i``'s backward; the last piece needs ``output_grad``, pieces run in reverse."""
        pairs = self.backward_pairs(i)
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        self.backward_done_with(i)

    def backward_pairs(self, i: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Piece ``i``'s outputs that take a gradient, with it (its backward's start)."""
        if i != self._next_bwd or not self.forward_done:
            raise RuntimeError(f"backward piece {i} out of order (next is {self._next_bwd})")
        outputs = self._outputs[i]
        if i == len(self.pieces) - 1:
            if self.output_grad is None:
                raise RuntimeError("backward of the last piece before its output gradient arrived")
            grads: Sequence[torch.Tensor | None] = (self.output_grad,)
        else:
            grads = [t.grad for t in self._inputs[i + 1]]
        return [(o, g) for o, g in zip(outputs, grads) if g is not None and o.requires_grad]

    def backward_done_with(self, i: int) -> None:
        """Piece ``i``'s backward ran: what it held is freed (its inputs' ``.grad`` stays for piece
        ``i - 1``)."""
        self._outputs[i] = None
        if i + 1 < len(self.pieces):
            self._inputs[i + 1] = None
        self._next_bwd -= 1
