"""Layers and initialisers on the mindspore backend, with torch's names, defaults and parameter names.

Same public names and signatures as `mmrun.backend.torch.nn`. A `Module` is a `mindspore.nn.Cell`
whose `construct` calls `forward`, so model code is written once, torch-style. Layers are written here
over ops that have CPU kernels (see `ops`) rather than wrapping MindSpore's layers, because those name
their parameters differently (`embedding_table`, `gamma`/`beta`) and default LayerNorm eps to 1e-7.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterator

import mindspore as ms
from mindspore.common.initializer import Normal, One, Uniform, Zero, initializer

from mmrun.backend import dropout_hash
from mmrun.backend.mindspore import ops, seeding

_NOT_SUPPORTED = "{name} is not supported with the mindspore backend. Received: {received}"
_FLOAT_DTYPES = (ms.float32, ms.float16, ms.bfloat16)


class Module(ms.nn.Cell):
    """torch.nn.Module's surface over a Cell: define `forward`; call the module to run it."""

    def __init__(self) -> None:
        super().__init__()

    # jit requires construct's first parameter to be named `self`.
    def construct(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def train(self, mode: bool = True) -> "Module":
        self.set_train(mode)
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def parameters(self, recurse: bool = True) -> Iterator[ms.Parameter]:
        return iter(self.get_parameters(expand=recurse))

    def named_parameters(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, ms.Parameter]]:
        # parameters_and_names yields the attribute path (`h.0.attn.c_attn.weight`), torch's naming.
        return self.parameters_and_names(name_prefix=prefix, expand=recurse)

    def to(self, dtype: Any) -> "Module":
        """Cast every floating-point parameter to `dtype` in place, as torch's `module.to(dtype)`.

        Only dtypes: MindSpore places tensors on its one global device (`backend.device`), not per module.
        """
        if not isinstance(dtype, ms.Type) or dtype not in _FLOAT_DTYPES:
            raise NotImplementedError(_NOT_SUPPORTED.format(
                name="Module.to", received=f"{dtype!r}; pass a floating dtype (backend.tensors.dtype('fp16'))"))
        for param in self.get_parameters():
            if param.dtype in _FLOAT_DTYPES and param.dtype != dtype:
                param.set_dtype(dtype)
        return self

    def register_buffer(self, name: str, tensor: Any, persistent: bool = True) -> None:
        raise NotImplementedError(_NOT_SUPPORTED.format(
            name="Module.register_buffer", received=f"name={name!r}; keep constants as plain attributes"))

    # state_dict() / load_state_dict(state, strict=True) are Cell's own, a port of torch's: same keys,
    # same strict checks and the same "Error(s) in loading state_dict ... Missing key(s) ... size
    # mismatch" message.


class ModuleList(ms.nn.CellList):
    """A list of modules whose parameters are named `<attr>.<index>.<name>`, as in torch."""


def Parameter(data: ms.Tensor, requires_grad: bool = True) -> ms.Parameter:  # noqa: N802 - torch's name
    """A trainable tensor; its name is set from the attribute path when assigned to a Module."""
    return ms.Parameter(data, requires_grad=requires_grad)


def _init(shape: tuple[int, ...], init: Any, dtype=ms.float32) -> ms.Tensor:
    return initializer(init, shape, dtype).init_data()


class Linear(Module):
    """y = x @ weight.T + bias; weight (out_features, in_features), torch's default init U(+-1/sqrt(in))."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        bound = 1.0 / math.sqrt(in_features) if in_features > 0 else 0.0
        self.weight = Parameter(_init((out_features, in_features), Uniform(bound)))
        self.bias = Parameter(_init((out_features,), Uniform(bound))) if bias else None

    def forward(self, x):
        return ops.linear(x, self.weight, self.bias)


class Embedding(Module):
    """A (num_embeddings, embedding_dim) lookup table, initialised N(0, 1) as in torch."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = Parameter(_init((num_embeddings, embedding_dim), Normal(1.0)))

    def forward(self, ids):
        return ops.embedding(ids, self.weight)


class LayerNorm(Module):
    """LayerNorm over the last dimension, eps 1e-5 (torch's default, not MindSpore's 1e-7)."""

    def __init__(self, normalized_shape: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        self.normalized_shape = (normalized_shape,)
        self.eps = eps
        self.weight = Parameter(_init(self.normalized_shape, One()))
        self.bias = Parameter(_init(self.normalized_shape, Zero())) if bias else None

    def forward(self, x):
        return ops.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(Module):
    """Qwen2/Llama RMSNorm over the last dimension through ops.rms_norm (Hugging Face's rounding); `weight`
    ones. Not MindSpore's ops.rms_norm: no CPU kernel in 2.10, and it rounds differently."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = Parameter(_init((hidden_size,), One()))

    def forward(self, x):
        return ops.rms_norm(x, self.weight, self.eps)


class Dropout(Module):
    """Dropout through ops.dropout: `impl` "hash" draws torch's hash masks for the same seed, "native" is
    MindSpore's own dropout, "auto" picks per device (backend/dropout_hash.py)."""

    def __init__(self, p: float = 0.5, impl: str = "auto") -> None:
        super().__init__()
        self.p = p
        self.impl = impl
        dropout_hash.resolve_impl(impl, "cpu")  # a bad name fails here, not inside a compiled graph

    def forward(self, x):
        return ops.dropout(x, self.p, self.training, self.impl)


class GELU(Module):
    """Exact (erf) GELU by default; approximate="tanh" for the tanh form."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return ops.gelu(x, self.approximate)


class Conv2d(Module):
    """NCHW convolution, square kernel/stride/padding, torch's default init U(+-1/sqrt(fan_in))."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 padding: int = 0, bias: bool = True) -> None:
        super().__init__()
        self.stride, self.padding = stride, padding
        bound = 1.0 / math.sqrt(in_channels * kernel_size * kernel_size)
        self.weight = Parameter(_init((out_channels, in_channels, kernel_size, kernel_size), Uniform(bound)))
        self.bias = Parameter(_init((out_channels,), Uniform(bound))) if bias else None

    def forward(self, x):
        return ops.conv2d(x, self.weight, self.bias, self.stride, self.padding)


class Conv3d(Module):
    """NCTHW convolution; kernel, stride and padding an int or one per dimension (t, h, w); torch's default init
    U(+-1/sqrt(fan_in)). `kernel_size`, `stride`, `padding` are 3-tuples, as torch's attributes."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 bias: bool = True) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.padding = (
            (v,) * 3 if isinstance(v, int) else tuple(v) for v in (kernel_size, stride, padding))
        bound = 1.0 / math.sqrt(in_channels * math.prod(self.kernel_size))
        self.weight = Parameter(_init((out_channels, in_channels) + self.kernel_size, Uniform(bound)))
        self.bias = Parameter(_init((out_channels,), Uniform(bound))) if bias else None

    def forward(self, x):
        return ops.conv3d(x, self.weight, self.bias, self.stride, self.padding)


def _parameters(module_or_params: Any) -> list[ms.Parameter]:
    if isinstance(module_or_params, ms.nn.Cell):
        return list(module_or_params.get_parameters())
    return [p[1] if isinstance(p, tuple) else p for p in module_or_params]


def freeze(module_or_params: Any) -> int:
    """Stop training these parameters (a module's, or parameters / (name, parameter) pairs):
    requires_grad False (MindSpore's attribute; torch calls requires_grad_), so optim.AdamW leaves them
    out and the train step takes no gradient for them. Returns how many."""
    params = _parameters(module_or_params)
    for param in params:
        param.requires_grad = False
    return len(params)


def unfreeze(module_or_params: Any) -> int:
    """Train these parameters again (requires_grad True). Returns how many."""
    params = _parameters(module_or_params)
    for param in params:
        param.requires_grad = True
    return len(params)


def refresh_parameter_names(module: Any) -> int:
    """Give every parameter its full attribute path as its MindSpore name. A Parameter is named once, when its
    Cell is first assigned into a model; a layer put into a built model later (a LoRA adapter) keeps short names
    (`to_q.lora_A.weight`) that collide across blocks in the optimizer. torch names nothing: its twin is a no-op.
    Returns how many names changed."""
    changed = 0
    for name, param in module.parameters_and_names():
        if param.name != name:
            param.name = name
            changed += 1
    return changed


# Initialisers: in place on a parameter, from MindSpore's seeded RNG (seeding.seed_everything).

def normal_(param: ms.Parameter, mean: float = 0.0, std: float = 1.0) -> ms.Parameter:
    param.set_data(_init(param.shape, Normal(sigma=std, mean=mean), param.dtype))
    return param


def zeros_(param: ms.Parameter) -> ms.Parameter:
    param.set_data(_init(param.shape, Zero(), param.dtype))
    return param


def ones_(param: ms.Parameter) -> ms.Parameter:
    param.set_data(_init(param.shape, One(), param.dtype))
    return param


def init_method_normal(std: float) -> Callable[[ms.Parameter], ms.Parameter]:
    """Megatron's init_method_normal: N(0, std)."""
    return lambda param: normal_(param, 0.0, std)


def scaled_init_method_normal(std: float, num_layers: int) -> Callable[[ms.Parameter], ms.Parameter]:
    """Megatron's scaled init for output projections (attention proj, MLP fc2): N(0, std / sqrt(2 * num_layers))."""
    scaled = std / math.sqrt(2.0 * num_layers)
    return lambda param: normal_(param, 0.0, scaled)


def recompute(module: Module, use_reentrant: bool = False) -> None:
    """Recompute `module`'s forward in backward instead of keeping its activations: MindSpore's Cell.recompute(),
    which marks the cell's primitives for recomputation when a graph is compiled (mindspore.jit, the compiled
    step) and runs its PyNative recompute otherwise (non-reentrant by default: saved-tensor hooks, which take
    keyword and non-tensor arguments). Configure a cell once, and never a child of a configured cell (MindSpore's
    rule). The recomputed forward draws the first forward's dropout masks, as the torch backend's recompute does:
    PyNative (non-reentrant) replays seeding.DROPOUT_GENERATOR, which MindSpore's own replay of its default
    generator does not cover; a compiled step keeps that generator's step out of recomputation (seeding.py)."""
    if use_reentrant:  # MindSpore takes context_fn only without reentrance
        module.recompute(use_reentrant=True)
        return
    module.recompute(use_reentrant=False, context_fn=_replay_dropout)


def _replay_dropout() -> tuple[Any, Any]:
    """recompute's context_fn: called at each forward; its second context runs the recomputation from the dropout
    generator's state at that forward and then puts back the state it found."""
    generator = seeding.DROPOUT_GENERATOR
    state = generator.get_state()

    @contextlib.contextmanager
    def replay() -> Iterator[None]:
        after = generator.get_state()
        generator.set_state(state)
        try:
            yield
        finally:
            generator.set_state(after)
    return contextlib.nullcontext(), replay()
