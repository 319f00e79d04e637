"""Wan's text encoder: transformers' `UMT5EncoderModel` on mmrun's portable API (PyTorch and MindSpore).

    encoder = UMT5EncoderModel.from_pretrained("Wan2.1-T2V-1.3B-Diffusers/text_encoder")
    tokenizer = HuggingFaceTokenizer("Wan2.1-T2V-1.3B-Diffusers/tokenizer")     # mmrun.data.tokenizers
    embeddings, mask = encode_prompts(encoder, tokenizer, ["a red ball rolls left"], max_length=512)

Parameter names are transformers' keys (`shared.weight`, `encoder.block.N.layer.0.SelfAttention.{q,k,v,o}.weight`,
`encoder.block.N.layer.0.SelfAttention.relative_attention_bias.weight`, `encoder.block.N.layer.0.layer_norm.weight`,
`encoder.block.N.layer.1.DenseReluDense.{wi_0,wi_1,wo}.weight`, `encoder.block.N.layer.1.layer_norm.weight`,
`encoder.final_layer_norm.weight`); the embedding is `shared` (transformers ties `encoder.embed_tokens` to it,
and a checkpoint that still holds that copy loads). Equal to transformers 5.24 within 1e-5 in fp32
(tests/models/test_wan_text_encoder.py), on both frameworks.

UMT5 as transformers computes it: every layer has its own relative position bias (T5 buckets, bidirectional),
attention scores are not scaled by 1/sqrt(d), RMS layer norms without mean or bias, a gated-GELU (tanh) FFN,
padding keys masked with the dtype's minimum. Dropout is off (the encoder is for inference here).
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Mapping, Sequence

import numpy as np

from mmrun.backend import autograd, nn, ops, tensors
from mmrun.backend.errors import UsageError
from mmrun.checkpoint.formats import hf_directory

WHAT = "the UMT5 text encoder"
TIED_COPY = "encoder.embed_tokens.weight"  # transformers ties it to shared.weight


@dataclasses.dataclass(frozen=True)
class UMT5Config:
    """The encoder's part of transformers' UMT5Config (config.json keys), with its defaults."""

    vocab_size: int = 250112
    d_model: int = 512
    d_kv: int = 64
    d_ff: int = 1024
    num_layers: int = 8
    num_heads: int = 6
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    feed_forward_proj: str = "gated-gelu"

    def __post_init__(self) -> None:
        if self.feed_forward_proj != "gated-gelu":
            raise UsageError(f"{WHAT}: config feed_forward_proj={self.feed_forward_proj!r} is not supported; mmrun's "
                             "UMT5 runs Wan's gated-gelu feed-forward")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "config") -> "UMT5Config":
        if raw.get("model_type") != "umt5":
            raise UsageError(f"{WHAT}: {where} has model_type {raw.get('model_type')!r}, not 'umt5'; pass the Wan "
                             "Diffusers directory's text_encoder/ folder")
        # The other keys of transformers' config.json (dropout, ids, decoder sizes, bookkeeping) do not change
        # the encoder's inference.
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in fields})


def relative_position_buckets(query_length: int, key_length: int, num_buckets: int, max_distance: int) -> np.ndarray:
    """T5's bidirectional relative position buckets (query_length, key_length), int64, computed on the host in
    float32 op for op as transformers' _relative_position_bucket (equal for every distance below 600, which covers
    Wan's 512 tokens, tests/models/test_wan_text_encoder.py), so both frameworks use the same buckets."""
    relative = np.arange(key_length, dtype=np.int64)[None, :] - np.arange(query_length, dtype=np.int64)[:, None]
    num_buckets //= 2
    buckets = (relative > 0).astype(np.int64) * num_buckets
    distance = np.abs(relative)
    max_exact = num_buckets // 2
    with np.errstate(divide="ignore", invalid="ignore"):  # distance 0: log(0); masked by the `where` below
        log_ratio = (np.log(distance.astype(np.float32) / np.float32(max_exact))
                     / np.float32(math.log(max_distance / max_exact)) * np.float32(num_buckets - max_exact))
        large = np.minimum(max_exact + np.nan_to_num(log_ratio, neginf=0.0).astype(np.int64), num_buckets - 1)
    return buckets + np.where(distance < max_exact, distance, large)


class UMT5Attention(nn.Module):
    """Self-attention with this layer's own relative position bias; scores unscaled (T5)."""

    def __init__(self, config: UMT5Config) -> None:
        super().__init__()
        self.n_heads, self.d_kv = config.num_heads, config.d_kv
        inner = config.num_heads * config.d_kv
        self.q = nn.Linear(config.d_model, inner, bias=False)
        self.k = nn.Linear(config.d_model, inner, bias=False)
        self.v = nn.Linear(config.d_model, inner, bias=False)
        self.o = nn.Linear(inner, config.d_model, bias=False)
        self.relative_attention_bias = nn.Embedding(config.relative_attention_num_buckets, config.num_heads)

    def _heads(self, x):
        b, s, _ = x.shape
        return ops.transpose(ops.reshape(x, (b, s, self.n_heads, self.d_kv)), 1, 2)

    def forward(self, x, buckets, mask_bias):
        b, s, _ = x.shape
        q, k, v = self._heads(self.q(x)), self._heads(self.k(x)), self._heads(self.v(x))
        # (s, s, heads) -> (1, heads, s, s)
        bias = ops.reshape(ops.permute(ops.embedding(buckets, self.relative_attention_bias.weight), (2, 0, 1)),
                           (1, self.n_heads, s, s))
        scores = ops.matmul(q, ops.transpose(k, -2, -1)) + bias
        if mask_bias is not None:
            scores = scores + mask_bias
        out = ops.matmul(ops.softmax(scores, dim=-1), v)
        return self.o(ops.reshape(ops.transpose(out, 1, 2), (b, s, self.n_heads * self.d_kv)))


class UMT5LayerSelfAttention(nn.Module):
    def __init__(self, config: UMT5Config) -> None:
        super().__init__()
        self.SelfAttention = UMT5Attention(config)
        self.layer_norm = nn.RMSNorm(config.d_model, eps=config.layer_norm_epsilon)

    def forward(self, x, buckets, mask_bias):
        return x + self.SelfAttention(self.layer_norm(x), buckets, mask_bias)


class UMT5DenseGatedActDense(nn.Module):
    def __init__(self, config: UMT5Config) -> None:
        super().__init__()
        self.wi_0 = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.wi_1 = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.wo = nn.Linear(config.d_ff, config.d_model, bias=False)

    def forward(self, x):
        return self.wo(ops.gelu(self.wi_0(x), approximate="tanh") * self.wi_1(x))  # transformers' gelu_new


class UMT5LayerFF(nn.Module):
    def __init__(self, config: UMT5Config) -> None:
        super().__init__()
        self.DenseReluDense = UMT5DenseGatedActDense(config)
        self.layer_norm = nn.RMSNorm(config.d_model, eps=config.layer_norm_epsilon)

    def forward(self, x):
        return x + self.DenseReluDense(self.layer_norm(x))


class UMT5Block(nn.Module):
    def __init__(self, config: UMT5Config) -> None:
        super().__init__()
        self.layer = nn.ModuleList([UMT5LayerSelfAttention(config), UMT5LayerFF(config)])

    def forward(self, x, buckets, mask_bias):
        return self.layer[1](self.layer[0](x, buckets, mask_bias))


class UMT5Stack(nn.Module):
    def __init__(self, config: UMT5Config) -> None:
        super().__init__()
        self.block = nn.ModuleList([UMT5Block(config) for _ in range(config.num_layers)])
        self.final_layer_norm = nn.RMSNorm(config.d_model, eps=config.layer_norm_epsilon)

    def forward(self, x, buckets, mask_bias):
        for block in self.block:
            x = block(x, buckets, mask_bias)
        return self.final_layer_norm(x)


class UMT5EncoderModel(nn.Module):
    """transformers' UMT5EncoderModel: `shared` (the token embedding) and `encoder`."""

    def __init__(self, config: UMT5Config | None = None, **kwargs: Any) -> None:
        super().__init__()
        config = UMT5Config(**kwargs) if config is None else config
        self.config = config
        self.shared = nn.Embedding(config.vocab_size, config.d_model)
        self.encoder = UMT5Stack(config)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, dtype: str | None = None) -> "UMT5EncoderModel":
        """A transformers UMT5 directory (config.json + model.safetensors or shards), e.g. a Wan Diffusers
        directory's text_encoder/; weights in float32, or `dtype` ("fp16", "bf16", ...) when given."""
        config = UMT5Config.from_dict(hf_directory.read_config(path, WHAT), f"{path}/config.json")
        arrays = hf_directory.read_weights(path, WHAT)
        if TIED_COPY in arrays:  # the tied copy of shared.weight that some writers keep
            copy = arrays.pop(TIED_COPY)
            arrays.setdefault("shared.weight", copy)
        return hf_directory.load_into(cls(config), arrays, WHAT, path, dtype)

    def forward(self, input_ids, attention_mask=None):
        """last_hidden_state (b, s, d_model) of token ids (b, s); attention_mask (b, s) 1 for tokens, 0 for padding
        (padding keys get no attention; the outputs at padded positions are computed all the same)."""
        s = input_ids.shape[1]
        x = ops.embedding(input_ids, self.shared.weight)
        c = self.config
        buckets = tensors.from_numpy(relative_position_buckets(s, s, c.relative_attention_num_buckets,
                                                               c.relative_attention_max_distance))
        mask_bias = None
        if attention_mask is not None:
            # transformers' bidirectional mask: 0 where a key is a token, the dtype's minimum where it is padding.
            keep = tensors.cast(ops.reshape(attention_mask, (attention_mask.shape[0], 1, 1, s)), x.dtype)
            mask_bias = (1.0 - keep) * _lowest(x.dtype)
        return self.encoder(x, buckets, mask_bias)


def _lowest(dtype: Any) -> float:
    """torch.finfo(dtype).min, which transformers puts on masked keys."""
    for name, lowest in (("float16", float(np.finfo(np.float16).min)), ("bfloat16", -3.3895313892515355e38)):
        if dtype == tensors.dtype(name):
            return lowest
    return float(np.finfo(np.float32).min)


def tokenize_prompts(tokenizer: Any, texts: Sequence[str], max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, attention_mask), each int64 (len(texts), max_length): what a Hugging Face tokenizer gives with
    padding="max_length", truncation=True (special tokens kept, e.g. UMT5's closing </s>). `tokenizer` is one of
    mmrun.data.tokenizers' Hugging Face tokenizers (a tokenizer.json, no transformers needed)."""
    return tokenizer.encode_fixed_length(list(texts), max_length)


def encode_prompts(encoder: UMT5EncoderModel, tokenizer: Any, texts: Sequence[str],
                   max_length: int = 512) -> tuple[Any, np.ndarray]:
    """(embeddings (n, max_length, d_model), mask (n, max_length) int64) of prompts as MindSpeed-MM and diffusers'
    WanPipeline give them to the DiT: tokenized to max_length (`model_max_length`, 512 for Wan), encoded with
    the mask, and the embeddings past each prompt's length set to zero."""
    ids, mask = tokenize_prompts(tokenizer, texts, max_length)
    with autograd.no_grad():
        hidden = encoder(tensors.from_numpy(ids), tensors.from_numpy(mask))
        keep = tensors.cast(tensors.from_numpy(mask[:, :, None].astype(np.float32)), hidden.dtype)
        return hidden * keep, mask
