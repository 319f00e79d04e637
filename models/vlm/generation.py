"""Text generation for Qwen2-VL / Qwen2.5-VL and Qwen3-VL on the portable API: PyTorch and MindSpore alike.

One prompt at a time (MindSpeed-MM's Qwen2VlPipeline does the same). The prompt runs once through the model
and fills a KV cache; each new token then runs the decoder on that one token (O(1) layers of work, not a
re-run of the prompt). Its M-RoPE position continues past the prompt as transformers does: the prompt's
get_rope_index gives `rope_delta` = (largest prompt position + 1) - prompt length, and the token at sequence
index i gets position i + rope_delta in all three rows (text after the images counts on from their grid).
What the loop asks of a model (its text decoder, the prompt's embeddings and positions) is a Decoding, one
class per family, its `decoding` part in the family table (models/families.py): Qwen2-VL's
(models/qwen2_vl/generation.py); Qwen3-VL's adds DeepStack's features to the prompt's visual tokens; new tokens
are text and take none.

Choosing a token follows transformers' `generate` (greedy, or sampling with its logits processors in its
order: repetition penalty, then temperature, top-k, top-p), computed in numpy on the host from the fp32
logits of the last position; sampling draws from a numpy generator seeded by `seed`, so the two frameworks
draw the same tokens from the same logits (transformers itself draws from torch's generator: sampled tokens
are not comparable with it, greedy ones are).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from mmrun.backend import autograd, ops, tensors
from mmrun.backend.errors import UsageError


class GenerationConfigError(UsageError):
    """A generation_config value of the wrong type or outside its range."""


# transformers' GenerationConfig keys this loop reads: name -> (accepted types, what to pass).
READ_KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "max_new_tokens": ((int,), "a positive integer"),
    "max_length": ((int,), "a positive integer (prompt + new tokens; max_new_tokens wins when both are set)"),
    "do_sample": ((bool,), "true or false"),
    "temperature": ((int, float), "a number >= 0 (0: greedy)"),
    "top_k": ((int,), "an integer >= 0 (0: off)"),
    "top_p": ((int, float), "a number in (0, 1]"),
    "repetition_penalty": ((int, float), "a number > 0 (1: off)"),
    "eos_token_id": ((int, list), "a token id or a list of them"),
    "pad_token_id": ((int,), "a token id"),
    "num_beams": ((int,), "1 (beam search is not built)"),
    "use_cache": ((bool,), "true or false"),
    "kv_cache": ((bool,), "true or false"),
    "seed": ((int,), "an integer"),
}


@dataclass
class GenerationConfig:
    """What the loop reads from transformers' generation_config (its defaults where it has one)."""

    max_new_tokens: int | None = None
    max_length: int = 20
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    eos_token_id: tuple[int, ...] = ()
    pad_token_id: int | None = None
    use_cache: bool = True
    seed: int = 0
    ignored: tuple[str, ...] = field(default=(), compare=False)  # keys given that this loop does not read

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "generation_config") -> "GenerationConfig":
        """From a transformers-style mapping (MindSpeed-MM's inference json `generation_config`): the keys of
        READ_KEYS are type-checked (a wrong type is a GenerationConfigError naming it); other keys (null or
        otherwise) are recorded in `ignored`."""
        if not isinstance(raw, Mapping):
            raise GenerationConfigError(f"{where}: expected an object of transformers' generation keys; received "
                                        f"{type(raw).__name__}")
        values: dict[str, Any] = {}
        ignored = []
        for key, value in raw.items():
            if key not in READ_KEYS:
                ignored.append(key)
                continue
            if value is None:
                continue
            types, wanted = READ_KEYS[key]
            if isinstance(value, bool) and bool not in types or not isinstance(value, types):
                raise GenerationConfigError(f"{where}.{key}: received {value!r} ({type(value).__name__}); "
                                            f"pass {wanted}")
            values[key] = value
        eos = values.pop("eos_token_id", ())
        eos = [eos] if isinstance(eos, int) else eos
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in eos):
            raise GenerationConfigError(f"{where}.eos_token_id: received {eos!r}; pass a token id or a list of them")
        if values.pop("num_beams", 1) != 1:
            raise GenerationConfigError(f"{where}.num_beams: received {raw['num_beams']!r}; only 1 (no beam search) "
                                        "is built")
        cache = values.pop("kv_cache", None)
        if cache is not None:
            values.setdefault("use_cache", cache)  # MindSpeed-MM's own name for use_cache
        config = cls(**values, eos_token_id=tuple(eos), ignored=tuple(ignored))
        config.check(where)
        return config

    def check(self, where: str = "generation_config") -> None:
        rules = ((self.max_new_tokens is None or self.max_new_tokens > 0, "max_new_tokens", self.max_new_tokens),
                 (self.max_length > 0, "max_length", self.max_length),
                 (self.temperature >= 0, "temperature", self.temperature),
                 (self.top_k >= 0, "top_k", self.top_k),
                 (0 < self.top_p <= 1, "top_p", self.top_p),
                 (self.repetition_penalty > 0, "repetition_penalty", self.repetition_penalty))
        for ok, key, value in rules:
            if not ok:
                raise GenerationConfigError(f"{where}.{key}: received {value!r}; pass {READ_KEYS[key][1]}")

    def new_tokens(self, prompt_length: int) -> int:
        """How many tokens at most: max_new_tokens, else max_length - prompt length (transformers' rule)."""
        return self.max_new_tokens if self.max_new_tokens is not None else max(self.max_length - prompt_length, 0)

    @property
    def sampling(self) -> bool:
        return self.do_sample and self.temperature > 0

    def replace(self, **changes: Any) -> "GenerationConfig":
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return GenerationConfig(**values)


# ------------------------------------------------------------------------------------------ cache

class LayerCache:
    """One decoder layer's keys and values so far, (batch, kv_heads, length, head_dim) on the device."""

    def __init__(self) -> None:
        self.keys = self.values = None

    def update(self, k: Any, v: Any) -> tuple[Any, Any]:
        if self.keys is None:
            self.keys, self.values = k, v
        else:
            self.keys, self.values = ops.cat([self.keys, k], dim=2), ops.cat([self.values, v], dim=2)
        return self.keys, self.values

    @property
    def length(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[2])


class KVCache:
    """The text decoder's cache: one LayerCache per layer (what GQASelfAttention's `cache` argument takes)."""

    def __init__(self, num_layers: int) -> None:
        self.layers = [LayerCache() for _ in range(num_layers)]

    def layer(self, index: int) -> LayerCache:
        return self.layers[index]

    @property
    def length(self) -> int:
        return self.layers[0].length if self.layers else 0


# ------------------------------------------------------------------------------------------ choosing a token

def process_logits(scores: np.ndarray, sequence: Sequence[int], config: GenerationConfig) -> np.ndarray:
    """transformers' logits processors for one row (fp32 numpy, vocab): repetition penalty over every token of
    `sequence` (prompt + generated), then, when sampling, temperature, top-k and top-p (removed tokens -inf)."""
    scores = np.array(scores, dtype=np.float32)
    if config.repetition_penalty != 1.0 and len(sequence):
        seen = np.unique(np.asarray(sequence, dtype=np.int64))
        picked = scores[seen]
        scores[seen] = np.where(picked < 0, picked * np.float32(config.repetition_penalty),
                                picked / np.float32(config.repetition_penalty))
    if not config.sampling:
        return scores
    if config.temperature != 1.0:
        scores = scores / np.float32(config.temperature)
    if config.top_k:
        k = min(config.top_k, scores.size)
        kth = np.partition(scores, -k)[-k]
        scores = np.where(scores < kth, -np.inf, scores).astype(np.float32)
    if config.top_p < 1.0:
        order = np.argsort(scores, kind="stable")  # ascending, as transformers' TopPLogitsWarper
        probs = _softmax(scores[order])
        remove = np.cumsum(probs) <= 1 - config.top_p
        remove[-1] = False  # always keep the most likely token
        scores = scores.copy()
        scores[order[remove]] = -np.inf
    return scores


def _softmax(scores: np.ndarray) -> np.ndarray:
    shifted = np.exp(scores.astype(np.float64) - np.max(scores))
    return shifted / shifted.sum()


def choose_token(scores: np.ndarray, config: GenerationConfig, rng: np.random.Generator) -> int:
    """argmax (greedy), or one draw from softmax(scores) by inverse CDF with one uniform number of `rng`."""
    if not config.sampling:
        return int(np.argmax(scores))
    cdf = np.cumsum(_softmax(scores))
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), scores.size - 1))


# ------------------------------------------------------------------------------------------ the loop

@dataclass
class Prompt:
    """One prompt as the processor gives it: input_ids (1, S) and the vision inputs (numpy)."""

    input_ids: np.ndarray
    pixel_values: np.ndarray | None = None
    image_grid_thw: np.ndarray | None = None
    pixel_values_videos: np.ndarray | None = None
    video_grid_thw: np.ndarray | None = None
    second_per_grid_ts: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.input_ids = np.asarray(self.input_ids, dtype=np.int64).reshape(1, -1)


class PromptTooLongError(UsageError):
    """The prompt plus the tokens asked for do not fit the model's positions."""


def device_array(value: np.ndarray | None) -> Any:
    return None if value is None else tensors.from_numpy(np.asarray(value))


class Decoding:
    """What the loop needs of a model: `text` (the decoder: embed_tokens, layers, forward(embeds, position_ids,
    cache=)), `output_weight`, `max_positions`, and `prompt_hidden` (each family's Decoding subclasses this)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.text = model.model

    @property
    def output_weight(self) -> Any:
        return self.text.embed_tokens.weight if self.model.lm_head is None else self.model.lm_head.weight

    @property
    def max_positions(self) -> int:
        return self.model.config.text.max_position_embeddings

    def prompt_hidden(self, prompt: "Prompt", cache: "KVCache | None") -> tuple[Any, int]:
        """The prompt through the decoder once (filling `cache`): (hidden (1, S, H), rope_delta)."""
        raise NotImplementedError


def decoding_for(model: Any) -> Any:
    """The Decoding of the model's family (models/families.py's `decoding` part): what the loop needs of it."""
    from mmrun.models import families

    return families.part(model.config, "decoding")(model)


def _logits(decoding: Any, hidden: Any) -> np.ndarray:
    """fp32 logits (vocab,) of the last position of hidden (1, S, H): the output layer on that row only."""
    seq = hidden.shape[1]
    last = ops.split(hidden, [seq - 1, 1], dim=1)[1] if seq > 1 else hidden
    return tensors.to_numpy(tensors.cast(ops.linear(last, decoding.output_weight), "float32")).reshape(-1)


class Generator:
    """generate(prompt) -> new token ids, with a KV cache (use_cache) or by re-running the whole sequence."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.decoding = decoding_for(model)

    def check_length(self, prompt: Prompt, config: GenerationConfig) -> None:
        limit = self.decoding.max_positions
        length = prompt.input_ids.shape[1]
        if length + config.new_tokens(length) > limit:
            raise PromptTooLongError(
                f"the prompt has {length} tokens and {config.new_tokens(length)} new ones are asked for, more than "
                f"the model's {limit} positions (max_position_embeddings); shorten the prompt, lower max_pixels or "
                "max_new_tokens")

    def prefill(self, prompt: Prompt, cache: KVCache | None) -> tuple[np.ndarray, int]:
        """The prompt through the model once: (last logits, rope_delta)."""
        hidden, delta = self.decoding.prompt_hidden(prompt, cache)
        return _logits(self.decoding, hidden), delta

    def step(self, token: int, index: int, rope_delta: int, cache: KVCache) -> np.ndarray:
        """One new token at sequence index `index` through the decoder with the cache: its logits."""
        ids = tensors.from_numpy(np.array([[token]], dtype=np.int64))
        position = np.full((3, 1, 1), index + rope_delta, dtype=np.int64)
        text = self.decoding.text
        hidden = text(text.embed_tokens(ids), tensors.from_numpy(position), cache=cache)
        return _logits(self.decoding, hidden)

    def rerun(self, prompt: Prompt, generated: Sequence[int]) -> np.ndarray:
        """No cache: the whole prompt + generated tokens through the model again; the last logits."""
        ids = np.concatenate([prompt.input_ids, np.asarray([generated], dtype=np.int64).reshape(1, -1)], axis=1)
        return self.prefill(dataclasses.replace(prompt, input_ids=ids), None)[0]  # the prompt's other inputs kept

    def generate(self, prompt: Prompt, config: GenerationConfig,
                 streamer: Callable[[int], None] | None = None,
                 on_logits: Callable[[np.ndarray], None] | None = None) -> list[int]:
        """New token ids (an EOS token, when one ends it, included, as transformers' generate). `streamer` is
        called with each token as it is chosen; `on_logits` with each step's raw fp32 logits (tests)."""
        self.check_length(prompt, config)
        rng = np.random.default_rng(config.seed)
        sequence = [int(t) for t in prompt.input_ids[0]]
        length = len(sequence)
        generated: list[int] = []
        eos = set(config.eos_token_id)
        with autograd.no_grad():
            cache = KVCache(len(self.decoding.text.layers)) if config.use_cache else None
            logits, delta = self.prefill(prompt, cache)
            for step in range(config.new_tokens(length)):
                if step:
                    logits = (self.step(generated[-1], length + step - 1, delta, cache) if cache is not None
                              else self.rerun(prompt, generated))
                if on_logits is not None:
                    on_logits(logits)
                token = choose_token(process_logits(logits, sequence, config), config, rng)
                generated.append(token)
                sequence.append(token)
                if streamer is not None:
                    streamer(token)
                if token in eos:
                    break
        return generated
