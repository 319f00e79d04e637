"""Megatron's tokenizer types, built from local files only (nothing is downloaded at run time).

The interface is Megatron's (`megatron/training/tokenizer/tokenizer.py`): `tokenize(text) -> ids`,
`detokenize(ids) -> text`, `vocab_size`, `eod`, `vocab`, `inv_vocab`. Byte-level BPE runs on the
`tokenizers` library, which implements the same GPT-2 pre-tokenisation and merges as Megatron's own
`GPT2Tokenizer`, so `gpt2-vocab.json` + `gpt2-merges.txt` give the same ids under both.
"""
from __future__ import annotations

import os
import re
from collections import OrderedDict
from typing import Callable, Iterator

import numpy as np

# The `tokenizers` library is imported inside the classes that need it, so that NullTokenizer runs
# (mock data, benchmarks) and `mmrun --help` never load it.

GPT2_EOD_TOKEN = "<|endoftext|>"
# End-of-document candidates for a bare tokenizer.json, which (unlike a full Hugging Face tokenizer
# directory) carries no `eos_token` setting of its own. First match wins.
EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>", "[SEP]")
# Padding-token candidates for encode_fixed_length (a bare tokenizer.json names no pad_token); first match wins.
PAD_CANDIDATES = ("<pad>", "[PAD]", "<|endoftext|>")
# A long text is tokenized in pieces of about this many characters, so that memory does not grow with the
# document: one tokenizer call needs about 150 bytes per character (the `tokenizers` library's Encoding).
PIECE_CHARS = 1 << 16
# The most characters one tokenizer call is given: a text that cannot be cut into pieces this long
# (HuggingFaceTokenizer, whose pre-tokenizer is not known; a stretch with no cut point) is refused.
MAX_UNCUT_CHARS = 1 << 22
# Where GPT-2's pre-tokenizer regex always starts a new word, whatever comes before or after: at a
# space between two non-spaces, and at ASCII or CJK sentence punctuation after a letter or digit. BPE
# merges only inside a word, so the ids of the pieces, concatenated, are the ids of the whole text.
# (Python's \s covers every Unicode White_Space character the regex's \s does, so \S is never wrong.)
GPT2_CUT = re.compile(r"(?<=\S)(?= \S)|(?<=[^\W_])(?=[,.;:!?\uFF0C\u3002\u3001\uFF1B\uFF1A\uFF01\uFF1F])")


class TokenizerError(ValueError):
    """A tokenizer could not be built from what the user passed (one line, says what to do)."""


class Tokenizer:
    """What the data pipeline and the training loop use; mirrors Megatron's MegatronTokenizer."""

    name: str = "Tokenizer"
    # Zero-width matches where a text can be cut without changing its ids (None: nowhere is known to be safe).
    cut_points: re.Pattern | None = None

    def tokenize(self, text: str) -> list[int]:
        raise NotImplementedError

    def detokenize(self, ids: list[int]) -> str:
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    @property
    def eod(self) -> int:
        raise NotImplementedError

    @property
    def vocab(self) -> dict[str, int]:
        raise NotImplementedError

    @property
    def inv_vocab(self) -> dict[int, str]:
        return {i: t for t, i in self.vocab.items()}

    @property
    def unique_identifiers(self) -> OrderedDict:
        # megatron-core's dataset configs hash this into their cache keys; keeping the property
        # lets our tokenizers be passed to megatron-core datasets unchanged.
        return OrderedDict({"class": f"{type(self).__module__}.{type(self).__qualname__}"})


def _require_file(path: str | None, flag: str, tokenizer_type: str) -> str:
    if not path:
        raise TokenizerError(f"--tokenizer-type {tokenizer_type} needs {flag}. Received: no {flag}.")
    if not os.path.isfile(path):
        raise TokenizerError(f"{flag} file not found. Received: {path!r}; pass an existing file.")
    return path


class _HFTokenizerFileBacked(Tokenizer):
    """Shared code for tokenizers held by a `tokenizers.Tokenizer` object."""

    def __init__(self, backend, eod_token: str | None) -> None:
        self._tok = backend
        self._vocab = backend.get_vocab(with_added_tokens=True)
        self._eod = self._vocab.get(eod_token) if eod_token is not None else None

    def tokenize(self, text: str) -> list[int]:
        # With the post-processor's special tokens (a BOS, say), as Megatron's HuggingFaceTokenizer
        # (`tokenizer(text).input_ids`); the GPT-2 backend has none to add.
        return self._tok.encode(text).ids

    def detokenize(self, ids: list[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def encode_fixed_length(self, texts: list[str], max_length: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids, attention_mask), int64 (len(texts), max_length): a Hugging Face tokenizer's
        `tokenizer(texts, padding="max_length", max_length=..., truncation=True)` (special tokens kept when
        truncating, padding on the right with the pad token), on a copy so this tokenizer's settings stay."""
        pad_token = next((t for t in PAD_CANDIDATES if t in self._vocab), None)
        if pad_token is None:
            raise TokenizerError(f"{self.name} has no padding token (looked for {', '.join(PAD_CANDIDATES)}); "
                                 "pass a tokenizer.json whose vocabulary has one")
        from tokenizers import Tokenizer as _Backend

        fixed = _Backend.from_str(self._tok.to_str())
        fixed.enable_truncation(max_length)
        fixed.enable_padding(length=max_length, pad_id=self._vocab[pad_token], pad_token=pad_token)
        encodings = fixed.encode_batch(list(texts))
        ids = np.array([e.ids for e in encodings], dtype=np.int64).reshape(len(encodings), max_length)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64).reshape(len(encodings), max_length)
        return ids, mask

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    @property
    def vocab(self) -> dict[str, int]:
        return dict(self._vocab)

    @property
    def eod(self) -> int:
        if self._eod is None:
            raise TokenizerError(
                f"{self.name} has no end-of-document token (looked for {', '.join(EOD_CANDIDATES)}); "
                "add one to the vocabulary or drop --append-eod."
            )
        return self._eod


class GPT2BPETokenizer(_HFTokenizerFileBacked):
    """Megatron's `GPT2BPETokenizer`: byte-level BPE from `vocab.json` + `merges.txt`."""

    name = "GPT2BPETokenizer"
    cut_points = GPT2_CUT

    def __init__(self, vocab_file: str, merge_file: str) -> None:
        from tokenizers import Tokenizer as _Backend, decoders, models, pre_tokenizers

        try:
            model = models.BPE.from_file(vocab_file, merge_file)
        except Exception as exc:  # the library raises bare Exceptions for malformed files
            raise TokenizerError(
                f"cannot read the GPT-2 BPE files. Received: --vocab-file {vocab_file!r} "
                f"--merge-file {merge_file!r} ({exc}); pass a vocab.json and its merges.txt."
            ) from None
        backend = _Backend(model)
        # GPT-2 adds no prefix space and splits with its regex; ByteLevel with these settings is
        # exactly that, so ids match Megatron's pure-Python GPT2Tokenizer.
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        backend.decoder = decoders.ByteLevel()
        super().__init__(backend, GPT2_EOD_TOKEN)
        if self._eod is None:
            raise TokenizerError(
                f"{vocab_file!r} has no {GPT2_EOD_TOKEN!r} token, which GPT2BPETokenizer uses as "
                "end of document; add it to the vocabulary (a GPT-2 vocab.json has it)."
            )


class HuggingFaceTokenizer(_HFTokenizerFileBacked):
    """A local Hugging Face `tokenizer.json` (a file, or a directory holding one)."""

    name = "HuggingFaceTokenizer"

    def __init__(self, tokenizer_model: str) -> None:
        from tokenizers import Tokenizer as _Backend

        path = tokenizer_model
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(path):
            raise TokenizerError(
                "HuggingFaceTokenizer needs a local tokenizer.json (no download). "
                f"Received: --tokenizer-model {tokenizer_model!r}; pass the file or its directory."
            )
        try:
            backend = _Backend.from_file(path)
        except Exception as exc:
            raise TokenizerError(f"cannot read {path!r} as a tokenizer.json ({exc}).") from None
        vocab = backend.get_vocab(with_added_tokens=True)
        super().__init__(backend, next((t for t in EOD_CANDIDATES if t in vocab), None))


class NullTokenizer(Tokenizer):
    """Megatron's `NullTokenizer`: text is space-separated ids; eod is `vocab_size` (one past)."""

    name = "NullTokenizer"
    cut_points = re.compile(r"(?= )")  # ids are space-separated: any space is a boundary

    def __init__(self, vocab_size: int) -> None:
        self._vocab_size_without_eod = int(vocab_size)

    def tokenize(self, text: str) -> list[int]:
        try:
            return [int(x) for x in text.split(" ") if x != ""]
        except ValueError:
            raise TokenizerError(
                f"NullTokenizer reads space-separated integer ids. Received: {text[:60]!r}."
            ) from None

    def detokenize(self, ids: list[int]) -> str:
        return " ".join(str(int(x)) for x in ids)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size_without_eod + 1

    @property
    def eod(self) -> int:
        return self._vocab_size_without_eod

    @property
    def vocab(self) -> dict[str, int]:
        raise NotImplementedError("NullTokenizer has no vocabulary")


def tokenize_in_pieces(tokenizer: Tokenizer, text: str, piece_chars: int | None = None,
                       max_uncut_chars: int | None = None) -> Iterator[list[int]]:
    """`tokenizer.tokenize(text)` in pieces of about `piece_chars` characters (PIECE_CHARS), cut only at the
    tokenizer's `cut_points`: the pieces' ids, concatenated, are the whole text's. A piece over
    `max_uncut_chars` (MAX_UNCUT_CHARS; no cut point in reach) raises TokenizerError instead of taking
    memory in proportion."""
    piece_chars = piece_chars or PIECE_CHARS
    max_uncut_chars = max_uncut_chars or MAX_UNCUT_CHARS
    start = 0
    while start < len(text):
        end = len(text)
        if end - start > piece_chars and tokenizer.cut_points is not None:
            cut = tokenizer.cut_points.search(text, start + piece_chars)
            end = cut.start() if cut else end
        if end - start > max_uncut_chars:
            where = ("no place in it is known to be safe to cut" if tokenizer.cut_points is None else
                     "that stretch has no place to cut (a space between words, or punctuation after a letter)")
            raise TokenizerError(f"a text of {end - start} characters is over the {max_uncut_chars} that "
                                 f"{tokenizer.name} is given at once: {where}, and tokenizing it whole would take "
                                 f"about {(end - start) * 150 >> 20} MB; split the document")
        yield tokenizer.tokenize(text[start:end])
        start = end


def _gpt2(vocab_file, merge_file, vocab_size, tokenizer_model) -> Tokenizer:
    return GPT2BPETokenizer(
        _require_file(vocab_file, "--vocab-file", "GPT2BPETokenizer"),
        _require_file(merge_file, "--merge-file", "GPT2BPETokenizer"),
    )


def _null(vocab_file, merge_file, vocab_size, tokenizer_model) -> Tokenizer:
    if vocab_size is None or int(vocab_size) <= 0:
        raise TokenizerError(
            f"--tokenizer-type NullTokenizer needs --vocab-size N > 0. Received: {vocab_size!r}."
        )
    return NullTokenizer(int(vocab_size))


def _hf(vocab_file, merge_file, vocab_size, tokenizer_model) -> Tokenizer:
    if not tokenizer_model:
        raise TokenizerError(
            "--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model (a local tokenizer.json "
            "or its directory). Received: no --tokenizer-model."
        )
    return HuggingFaceTokenizer(tokenizer_model)


# Megatron's --tokenizer-type names -> builder. Types not listed here (SentencePiece, TikToken,
# BERT word-piece, ...) are refused with the list below rather than guessed at.
TOKENIZER_BUILDERS: dict[str, Callable[..., Tokenizer]] = {
    "GPT2BPETokenizer": _gpt2,
    "NullTokenizer": _null,
    "HuggingFaceTokenizer": _hf,
}


def build_tokenizer(
    tokenizer_type: str,
    vocab_file: str | None = None,
    merge_file: str | None = None,
    vocab_size: int | None = None,
    tokenizer_model: str | None = None,
) -> Tokenizer:
    """Build a tokenizer by its Megatron `--tokenizer-type` name, from local files only."""
    builder = TOKENIZER_BUILDERS.get(tokenizer_type)
    if builder is None:
        raise TokenizerError(
            f"--tokenizer-type {tokenizer_type} is not supported by mmrun. Received: "
            f"{tokenizer_type!r}; use one of {', '.join(TOKENIZER_BUILDERS)}."
        )
    return builder(vocab_file, merge_file, vocab_size, tokenizer_model)


def padded_vocab_size(
    vocab_size: int, make_vocab_size_divisible_by: int = 128, tensor_model_parallel_size: int = 1
) -> int:
    """Megatron's `_vocab_size_with_padding`: the embedding rows for a tokenizer's vocab size."""
    multiple = make_vocab_size_divisible_by * tensor_model_parallel_size
    return -(-int(vocab_size) // multiple) * multiple

