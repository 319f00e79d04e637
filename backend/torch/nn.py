"""Layers and initialisers on the torch backend: torch.nn itself, with signatures cut to the portable set.

Same public names and signatures as `mmrun.backend.mindspore.nn`. Each layer subclasses the torch layer
and only narrows its constructor, so forward passes are torch's own code (no abstraction cost) and
parameter names are torch's (`weight`, `bias`).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Iterator

import torch

from mmrun.backend import dropout_hash
from mmrun.backend.torch import ops

Module = torch.nn.Module
ModuleList = torch.nn.ModuleList
Parameter = torch.nn.Parameter


class Linear(torch.nn.Linear):
    """y = x @ weight.T + bias; weight (out_features, in_features), torch's default init."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__(in_features, out_features, bias=bias)


class Embedding(torch.nn.Embedding):
    """A (num_embeddings, embedding_dim) lookup table, initialised N(0, 1) as in torch."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__(num_embeddings, embedding_dim)


class LayerNorm(torch.nn.LayerNorm):
    """LayerNorm over the last dimension, eps 1e-5, `weight` ones and `bias` zeros."""

    def __init__(self, normalized_shape: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__(normalized_shape, eps=eps, bias=bias)


class RMSNorm(torch.nn.Module):
    """Qwen2/Llama RMSNorm over the last dimension through ops.rms_norm (Hugging Face's rounding, not
    torch.nn.RMSNorm's); `weight` ones."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)


class Dropout(torch.nn.Dropout):
    """torch.nn.Dropout through ops.dropout: `impl` "hash" draws MindSpore's masks for the same seed,
    "native" is F.dropout, "auto" picks per device (backend/dropout_hash.py)."""

    def __init__(self, p: float = 0.5, impl: str = "auto") -> None:
        super().__init__(p)
        self.impl = impl
        dropout_hash.resolve_impl(impl, "cpu")  # a bad name fails here, at construction

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.dropout(x, self.p, self.training, self.impl)


class GELU(torch.nn.GELU):
    """Exact (erf) GELU by default; approximate="tanh" for the tanh form."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__(approximate=approximate)


class Conv2d(torch.nn.Conv2d):
    """NCHW convolution, square kernel/stride/padding, torch's default init."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 padding: int = 0, bias: bool = True) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=bias)


class Conv3d(torch.nn.Conv3d):
    """NCTHW convolution; kernel, stride and padding an int or one per dimension (t, h, w); torch's default init.
    `kernel_size`, `stride`, `padding` are 3-tuples on both frameworks."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, int, int],
                 stride: int | tuple[int, int, int] = 1, padding: int | tuple[int, int, int] = 0,
                 bias: bool = True) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.conv3d(x, self.weight, self.bias, self.stride, self.padding)


def _parameters(module_or_params: torch.nn.Module | Iterable[Any]) -> list[torch.Tensor]:
    if isinstance(module_or_params, torch.nn.Module):
        return list(module_or_params.parameters())
    return [p[1] if isinstance(p, tuple) else p for p in module_or_params]


def freeze(module_or_params: torch.nn.Module | Iterable[Any]) -> int:
    """Stop training these parameters (a module's, or parameters / (name, parameter) pairs):
    requires_grad False, so autograd skips them and optim.AdamW leaves them out. Returns how many."""
    params = _parameters(module_or_params)
    for param in params:
        param.requires_grad_(False)
    return len(params)


def unfreeze(module_or_params: torch.nn.Module | Iterable[Any]) -> int:
    """Train these parameters again (requires_grad True). Returns how many."""
    params = _parameters(module_or_params)
    for param in params:
        param.requires_grad_(True)
    return len(params)


def refresh_parameter_names(module: torch.nn.Module) -> int:
    """MindSpore's twin gives parameters their full paths as names (it names a Parameter once, when first
    assigned); torch's parameters carry no name of their own, so there is nothing to do. Returns 0."""
    return 0


# Initialisers: in place on a parameter, from the framework's seeded RNG (seeding.seed_everything).

@torch.no_grad()
def normal_(param: torch.Tensor, mean: float = 0.0, std: float = 1.0) -> torch.Tensor:
    return param.normal_(mean, std)


@torch.no_grad()
def zeros_(param: torch.Tensor) -> torch.Tensor:
    return param.zero_()


@torch.no_grad()
def ones_(param: torch.Tensor) -> torch.Tensor:
    return param.fill_(1.0)


def init_method_normal(std: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """Megatron's init_method_normal: N(0, std)."""
    return lambda param: normal_(param, 0.0, std)


def scaled_init_method_normal(std: float, num_layers: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """Megatron's scaled init for output projections (attention proj, MLP fc2): N(0, std / sqrt(2 * num_layers))."""
    scaled = std / math.sqrt(2.0 * num_layers)
    return lambda param: normal_(param, 0.0, scaled)


def recompute(module: torch.nn.Module, use_reentrant: bool = False) -> None:
    """Recompute `module`'s forward in backward instead of keeping its activations (torch.utils.checkpoint,
    non-reentrant by default). The instance's forward is replaced rather than the module wrapped, so parameter
    names stay the model's own. The recomputed forward draws the same hash-dropout masks as the first one (the
    dropout counter is replayed); torch's own RNG is restored by checkpoint itself. Evaluation (no grad) runs
    the plain forward. The reentrant form (FSDP2 file's use_reentrant) differentiates positional tensors only,
    so tensor keyword arguments are passed positionally and put back."""
    import contextlib

    from torch.utils.checkpoint import checkpoint

    from mmrun.backend.torch.seeding import DROPOUT_GENERATOR

    forward = module.forward

    def context() -> tuple[Any, Any]:
        state = DROPOUT_GENERATOR.get_state()

        @contextlib.contextmanager
        def replay() -> Iterator[None]:
            after = DROPOUT_GENERATOR.get_state()
            DROPOUT_GENERATOR.set_state(state)
            try:
                yield
            finally:
                DROPOUT_GENERATOR.set_state(after)
        return contextlib.nullcontext(), replay()

    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # evaluation: nothing is kept for backward, nothing to recompute
            return forward(*args, **kwargs)
        if use_reentrant:
            keys = [k for k, v in kwargs.items() if torch.is_tensor(v)]
            others = {k: v for k, v in kwargs.items() if not torch.is_tensor(v)}

            def run(*flat: Any) -> Any:
                return forward(*flat[:len(args)], **dict(zip(keys, flat[len(args):])), **others)

            return checkpoint(run, *args, *(kwargs[k] for k in keys), use_reentrant=True)
        return checkpoint(forward, *args, use_reentrant=False, context_fn=context, **kwargs)

    module.forward = checkpointed
