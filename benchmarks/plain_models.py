"""The benchmark's baselines: models/gpt.py's GPT and its training step written directly in plain torch
and directly in plain MindSpore, without the portable API (what a user of each framework would write).

Same math as the portable model (manual causal attention, exact GELU, pre-LN blocks, tied output layer,
masked-mean loss, AdamW without decay on biases and 1-D parameters, clipping at 1.0) so that step
times compare the API's cost, not different work. Frameworks are imported inside the builders: this
file is a benchmark, imported only by benchmarks/api_overhead.py.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

OPTIMIZER = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def _no_decay(name: str, shape: tuple[int, ...]) -> bool:
    return name.endswith("bias") or name.endswith("beta") or len(shape) == 1


# --------------------------------------------------------------------------------------------- torch

def torch_model(cfg: Any, state: dict[str, np.ndarray]) -> Any:
    """The GPT as a plain torch nn.Module, loaded with `state`; forward(tokens, labels, loss_mask) -> loss."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_attn = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
            self.c_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)
            self.n_head, self.head_dim = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.c_attn(x).split(C, dim=2)
            q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
            k = k.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
            v = v.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / self.head_dim ** 0.5)
            att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu_(1), float("-inf"))
            y = F.softmax(att, dim=-1) @ v
            return self.c_proj(y.transpose(1, 2).reshape(B, T, C))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1 = nn.LayerNorm(cfg.hidden_size)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(cfg.hidden_size)
            self.mlp = nn.Sequential()
            self.mlp.c_fc = nn.Linear(cfg.hidden_size, cfg.ffn_hidden_size)
            self.mlp.gelu = nn.GELU()
            self.mlp.c_proj = nn.Linear(cfg.ffn_hidden_size, cfg.hidden_size)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
            self.wpe = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
            self.h = nn.ModuleList([Block() for _ in range(cfg.num_layers)])
            self.ln_f = nn.LayerNorm(cfg.hidden_size)

        def forward(self, tokens, labels, loss_mask):
            B, T = tokens.shape
            x = self.wte(tokens) + self.wpe(torch.arange(T))
            for block in self.h:
                x = block(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)
            loss = F.cross_entropy(logits.view(B * T, -1), labels.view(B * T), reduction="none").view(B, T)
            return (loss * loss_mask).sum() / loss_mask.sum()

    model = GPT()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    return model


def torch_step(cfg: Any, state: dict[str, np.ndarray]) -> Callable[[tuple], tuple[float, float]]:
    """A plain-torch GPT train step: zero_grad, forward, backward, clip_grad_norm_, AdamW.step."""
    import torch

    model = torch_model(cfg, state)
    named = list(model.named_parameters())
    groups = [{"params": [p for n, p in named if not _no_decay(n, tuple(p.shape))]},
              {"params": [p for n, p in named if _no_decay(n, tuple(p.shape))], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, **OPTIMIZER)

    def step(batch: tuple) -> tuple[float, float]:
        optimizer.zero_grad(set_to_none=True)
        loss = model(*batch)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss.item(), norm.item()

    return step


# ----------------------------------------------------------------------------------------- mindspore

# Plain MindSpore names its layers' parameters differently; the map loads the same initial weights.
_MS_NAMES = {"wte.weight": "wte.embedding_table", "wpe.weight": "wpe.embedding_table"}


def _ms_name(torch_name: str) -> str:
    if torch_name in _MS_NAMES:
        return _MS_NAMES[torch_name]
    if ".ln_" in torch_name or torch_name.startswith("ln_f"):
        return torch_name.replace(".weight", ".gamma").replace(".bias", ".beta")
    return torch_name


def mindspore_model(cfg: Any, state: dict[str, np.ndarray], lazy_inline: bool = False) -> Any:
    """The GPT as a plain MindSpore Cell, loaded with `state`; construct(tokens, labels, loss_mask) -> loss.
    lazy_inline: the blocks as mindspore.lazy_inline cells (one compiled block graph reused by every layer)."""
    import mindspore as ms
    from mindspore import Tensor, mint, nn, ops

    class Attention(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.c_attn = nn.Dense(cfg.hidden_size, 3 * cfg.hidden_size)
            self.c_proj = nn.Dense(cfg.hidden_size, cfg.hidden_size)
            self.n_head, self.head_dim = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
            self.scale = 1.0 / self.head_dim ** 0.5

        def construct(self, x):
            B, T, C = x.shape
            q, k, v = ops.split(self.c_attn(x), C, 2)  # mint.split: wrong grads after transpose in PyNative
            q = mint.transpose(mint.reshape(q, (B, T, self.n_head, self.head_dim)), 1, 2)
            k = mint.transpose(mint.reshape(k, (B, T, self.n_head, self.head_dim)), 1, 2)
            v = mint.transpose(mint.reshape(v, (B, T, self.n_head, self.head_dim)), 1, 2)
            att = mint.matmul(q, mint.transpose(k, -2, -1)) * self.scale
            att = ops.masked_fill(att, mint.triu(mint.ones((T, T), dtype=ms.bool_), 1), float("-inf"))
            y = mint.matmul(mint.softmax(att, dim=-1), v)
            return self.c_proj(mint.reshape(mint.transpose(y, 1, 2), (B, T, C)))

    class MLP(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.c_fc = nn.Dense(cfg.hidden_size, cfg.ffn_hidden_size)
            self.c_proj = nn.Dense(cfg.ffn_hidden_size, cfg.hidden_size)

        def construct(self, x):
            return self.c_proj(ops.gelu(self.c_fc(x), approximate="none"))

    class Block(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1 = nn.LayerNorm((cfg.hidden_size,), epsilon=1e-5)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm((cfg.hidden_size,), epsilon=1e-5)
            self.mlp = MLP()

        def construct(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    if lazy_inline:
        Block.__init__ = ms.lazy_inline(Block.__init__)

    class GPT(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
            self.wpe = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
            self.h = nn.CellList([Block() for _ in range(cfg.num_layers)])
            self.ln_f = nn.LayerNorm((cfg.hidden_size,), epsilon=1e-5)

        def construct(self, tokens, labels, loss_mask):
            B, T = tokens.shape
            x = self.wte(tokens) + self.wpe(ops.arange(0, T, dtype=ms.int64))
            for block in self.h:
                x = block(x)
            logits = mint.matmul(self.ln_f(x), mint.transpose(self.wte.embedding_table, 0, 1))
            loss = ops.cross_entropy(mint.reshape(logits, (B * T, -1)), mint.reshape(labels, (B * T,)),
                                     reduction="none")
            return mint.sum(mint.reshape(loss, (B, T)) * loss_mask) / mint.sum(loss_mask)

    model = GPT()
    params = {name: p for name, p in model.parameters_and_names()}
    for torch_name, value in state.items():
        params[_ms_name(torch_name)].set_data(Tensor(value))
    return model


def mindspore_step(cfg: Any, state: dict[str, np.ndarray], jit: bool,
                   optimizer_kind: str = "experimental", lazy_inline: bool = False) -> Callable[[tuple], tuple[float, float]]:
    """A plain-MindSpore GPT train step: value_and_grad, clip by global norm, AdamW; optionally under jit.

    optimizer_kind "experimental" is mindspore.experimental.optim.AdamW (torch's AdamW semantics);
    "AdamWeightDecay" is nn.AdamWeightDecay (MindSpore's fastest, but not torch's update rule).
    """
    import mindspore as ms
    from mindspore import mint, nn, ops

    model = mindspore_model(cfg, state, lazy_inline=lazy_inline)
    trainable = model.trainable_params()
    decay = [p for p in trainable if not _no_decay(p.name, tuple(p.shape))]
    no_decay = [p for p in trainable if _no_decay(p.name, tuple(p.shape))]
    opt = OPTIMIZER
    if optimizer_kind == "experimental":
        from mindspore.experimental.optim import AdamW
        optimizer = AdamW([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], lr=opt["lr"],
                          betas=opt["betas"], eps=opt["eps"], weight_decay=opt["weight_decay"])
        weights = optimizer.parameters
    else:
        optimizer = nn.AdamWeightDecay([{"params": decay, "weight_decay": opt["weight_decay"]},
                                        {"params": no_decay, "weight_decay": 0.0}], learning_rate=opt["lr"],
                                       beta1=opt["betas"][0], beta2=opt["betas"][1], eps=opt["eps"])
        weights = optimizer.parameters
    grad_fn = ms.value_and_grad(model, None, weights)

    def train_step(tokens, labels, loss_mask):
        loss, grads = grad_fn(tokens, labels, loss_mask)
        norm = mint.sqrt(ops.addn([mint.sum(g * g) for g in grads]))
        coef = mint.clamp(1.0 / (norm + 1e-6), max=1.0)
        grads = tuple([g * coef for g in grads])
        optimizer(grads)
        return loss, norm

    fn = ms.jit(train_step) if jit else train_step

    def step(batch: tuple) -> tuple[float, float]:
        loss, norm = fn(*batch)
        return float(loss), float(norm)

    return step
