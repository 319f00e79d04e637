"""A GPT written once against the portable API (`mmrun.backend`): runs on PyTorch and on MindSpore.

nanoGPT's layout with Megatron's defaults: learned position embeddings, pre-LayerNorm blocks of causal
self-attention and a GELU MLP, a final LayerNorm, and an output layer tied to the word embeddings.
Attention is `ops.scaled_dot_product_attention` (a fused kernel where the device has one); dropout is
`dropout_impl`'s ("auto", "hash" for the same masks on both frameworks, "native"; backend/dropout_hash.py).
Init as Megatron: N(0, init_method_std) for weights, N(0, std / sqrt(2 * num_layers)) for the two
output projections of each block, zero biases. Parameter names (torch style, identical on both
frameworks): wte.weight, wpe.weight, h.<i>.{ln_1,attn.c_attn,attn.c_proj,ln_2,mlp.c_fc,mlp.c_proj}.{weight,bias},
ln_f.{weight,bias}, and lm_head.weight only when untied.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from mmrun.backend import nn, ops


@dataclass
class GPTConfig:
    num_layers: int = 2
    hidden_size: int = 256
    num_attention_heads: int = 4
    vocab_size: int = 1024
    max_position_embeddings: int = 1024
    seq_length: int = 256
    ffn_hidden_size: int | None = None  # Megatron's default: 4 * hidden_size
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    layernorm_epsilon: float = 1e-5
    init_method_std: float = 0.02
    untie_embeddings_and_output_weights: bool = False
    dropout_impl: str = "auto"

    def __post_init__(self) -> None:
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = 4 * self.hidden_size
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by "
                             f"num_attention_heads {self.num_attention_heads}; change one of them")
        if self.dropout_impl not in ("auto", "hash", "native"):
            raise ValueError(f"dropout_impl must be auto, hash or native. Received: {self.dropout_impl!r}")
        if self.seq_length > self.max_position_embeddings:
            raise ValueError(f"seq_length {self.seq_length} exceeds max_position_embeddings "
                             f"{self.max_position_embeddings}; raise max_position_embeddings")


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.c_attn = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.c_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.attention_dropout = config.attention_dropout
        self.dropout_impl = config.dropout_impl
        self.resid_dropout = nn.Dropout(config.hidden_dropout, config.dropout_impl)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = ops.split(self.c_attn(x), C, dim=2)
        # (B, T, C) -> (B, n_head, T, head_dim)
        q = ops.transpose(ops.reshape(q, (B, T, self.n_head, self.head_dim)), 1, 2)
        k = ops.transpose(ops.reshape(k, (B, T, self.n_head, self.head_dim)), 1, 2)
        v = ops.transpose(ops.reshape(v, (B, T, self.n_head, self.head_dim)), 1, 2)
        y = ops.scaled_dot_product_attention(q, k, v, causal=True, scale=self.scale,
                                             dropout_p=self.attention_dropout if self.training else 0.0,
                                             dropout_impl=self.dropout_impl)
        y = ops.reshape(ops.transpose(y, 1, 2), (B, T, C))
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.hidden_size, config.ffn_hidden_size)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(config.ffn_hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout, config.dropout_impl)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    # the layer loop models/recompute.py marks
    recompute_layers = {"text_decoder": "h"}

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
        self.wpe = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.drop = nn.Dropout(config.hidden_dropout, config.dropout_impl)
        self.h = nn.ModuleList([Block(config) for _ in range(config.num_layers)])
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon)
        # Tied by default (Megatron): the output layer reuses wte.weight, so there is no lm_head parameter.
        self.lm_head = (nn.Linear(config.hidden_size, config.vocab_size, bias=False)
                        if config.untie_embeddings_and_output_weights else None)
        self._init_weights()

    def _init_weights(self) -> None:
        init = nn.init_method_normal(self.config.init_method_std)
        scaled_init = nn.scaled_init_method_normal(self.config.init_method_std, self.config.num_layers)
        for name, param in self.named_parameters():
            if name.startswith("ln_") or ".ln_" in name:
                continue  # LayerNorm keeps weight 1, bias 0
            if name.endswith("bias"):
                nn.zeros_(param)
            elif name.endswith(("attn.c_proj.weight", "mlp.c_proj.weight")):
                scaled_init(param)
            else:
                init(param)

    def forward(self, tokens, position_ids=None, labels=None, loss_mask=None):
        """tokens (B, T) -> logits (B, T, vocab); with labels: per-token loss (B, T), Megatron style;
        with labels and loss_mask: the scalar sum(loss * loss_mask) / sum(loss_mask)."""
        B, T = tokens.shape
        if position_ids is None:
            position_ids = ops.arange(T, like=tokens)
        x = self.drop(self.wte(tokens) + self.wpe(position_ids))
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        weight = self.wte.weight if self.lm_head is None else self.lm_head.weight
        logits = ops.linear(x, weight)
        if labels is None:
            return logits
        loss = ops.cross_entropy(ops.reshape(logits, (B * T, -1)), ops.reshape(labels, (B * T,)), reduction="none")
        loss = ops.reshape(loss, (B, T))
        if loss_mask is None:
            return loss
        return ops.sum(loss * loss_mask) / ops.sum(loss_mask)


def gpt_loss(model: GPT, tokens, labels, loss_mask):
    """The training loss for one micro-batch: TrainStep's `loss_fn` for a (tokens, labels, loss_mask) batch."""
    return model(tokens, labels=labels, loss_mask=loss_mask)
