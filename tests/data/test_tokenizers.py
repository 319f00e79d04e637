"""Tokenizers: GPT-2 byte-level BPE from vocab/merges files, NullTokenizer, local tokenizer.json."""
from __future__ import annotations

import json
import re
import warnings

import pytest

from mmrun.data.corpus import DEMO_JSONL, DEMO_MERGES, DEMO_VOCAB
from mmrun.data.tokenizers import (
    GPT2BPETokenizer,
    HuggingFaceTokenizer,
    NullTokenizer,
    TokenizerError,
    build_tokenizer,
    padded_vocab_size,
)

ROUND_TRIP = [
    "Hello world!",
    "  leading spaces, trailing spaces  ",
    "tabs\tand\nnewlines\n\nkept",
    "unicode: café, naïve, 日本語, emoji 🙂",
    "",
    "<|endoftext|> is plain text inside a document",
]


# GPT-2's reference BPE (openai/gpt-2 encoder.py, the algorithm of Megatron's GPT2Tokenizer),
# written out here so the ids of the `tokenizers`-backed class are checked against an independent
# implementation. Python's `re` lacks \p{L}/\p{N}; [^\W\d_] and \d are equal on ASCII prose.
GPT2_PATTERN = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+""")


def _bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


class ReferenceGPT2:
    def __init__(self, vocab_file: str, merges_file: str) -> None:
        self.encoder = json.load(open(vocab_file, encoding="utf-8"))
        lines = open(merges_file, encoding="utf-8").read().split("\n")[1:]
        self.ranks = {tuple(line.split()): i for i, line in enumerate(l for l in lines if l)}
        self.byte_encoder = _bytes_to_unicode()

    def _bpe(self, token: str) -> list[str]:
        word = list(token)
        while len(word) > 1:
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and (word[i], word[i + 1]) == best:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        return word

    def encode(self, text: str) -> list[int]:
        ids = []
        for piece in GPT2_PATTERN.findall(text):
            token = "".join(self.byte_encoder[b] for b in piece.encode("utf-8"))
            ids.extend(self.encoder[t] for t in self._bpe(token))
        return ids


def test_gpt2_bpe_round_trip_and_specials(bpe_files):
    vocab_file, merges_file = bpe_files
    tok = build_tokenizer("GPT2BPETokenizer", vocab_file=vocab_file, merge_file=merges_file)
    assert isinstance(tok, GPT2BPETokenizer)
    vocab = json.load(open(vocab_file, encoding="utf-8"))
    assert tok.vocab_size == len(vocab) == 400
    assert tok.eod == vocab["<|endoftext|>"]
    assert tok.vocab == vocab and tok.inv_vocab[tok.eod] == "<|endoftext|>"
    for text in ROUND_TRIP:
        ids = tok.tokenize(text)
        assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids)
        assert tok.detokenize(ids) == text
    # Megatron's GPT-2 tokenizer treats <|endoftext|> in text as ordinary bytes, not as EOD.
    assert tok.eod not in tok.tokenize("<|endoftext|>")


def test_gpt2_bpe_ids_equal_reference_bpe_on_demo_corpus():
    tok = GPT2BPETokenizer(str(DEMO_VOCAB), str(DEMO_MERGES))
    ref = ReferenceGPT2(str(DEMO_VOCAB), str(DEMO_MERGES))
    lines = DEMO_JSONL.read_text(encoding="utf-8").splitlines()[:60]
    texts = [json.loads(line)["text"] for line in lines] + ["It's 12 o'clock; they'll see -- 3.5 km!  "]
    for text in texts:
        assert tok.tokenize(text) == ref.encode(text)
    # the demo vocabulary compresses its own corpus (words, not bytes)
    assert sum(len(tok.tokenize(t)) for t in texts) < 0.35 * sum(len(t) for t in texts)


def test_null_tokenizer_matches_megatron_core():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer as MNull
    ours, theirs = build_tokenizer("NullTokenizer", vocab_size=1000), MNull(1000)
    assert isinstance(ours, NullTokenizer)
    assert (ours.vocab_size, ours.eod) == (theirs.vocab_size, theirs.eod) == (1001, 1000)
    assert ours.tokenize("5 17 999 0") == theirs.text_to_ids("5 17 999 0") == [5, 17, 999, 0]
    assert ours.detokenize([5, 17]) == theirs.ids_to_text([5, 17]) == "5 17"
    with pytest.raises(TokenizerError, match="space-separated integer ids"):
        ours.tokenize("not numbers")


def test_huggingface_tokenizer_from_local_json(bpe_files, tmp_path):
    from tokenizers import ByteLevelBPETokenizer

    ByteLevelBPETokenizer(*bpe_files).save(str(tmp_path / "tokenizer.json"))
    for model in (str(tmp_path / "tokenizer.json"), str(tmp_path)):
        tok = build_tokenizer("HuggingFaceTokenizer", tokenizer_model=model)
        assert isinstance(tok, HuggingFaceTokenizer)
        gpt2 = GPT2BPETokenizer(*bpe_files)
        assert tok.eod == gpt2.eod and tok.vocab_size == gpt2.vocab_size
        for text in ROUND_TRIP:
            assert tok.tokenize(text) == gpt2.tokenize(text)
            assert tok.detokenize(tok.tokenize(text)) == text


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(tokenizer_type="SentencePieceTokenizer"), r"SentencePieceTokenizer is not supported by mmrun\. Received: .*use one of GPT2BPETokenizer"),
        (dict(tokenizer_type="GPT2BPETokenizer"), r"needs --vocab-file"),
        (dict(tokenizer_type="GPT2BPETokenizer", vocab_file="/nonexistent/vocab.json", merge_file="x"), r"--vocab-file file not found\. Received: '/nonexistent/vocab.json'"),
        (dict(tokenizer_type="NullTokenizer"), r"needs --vocab-size N > 0\. Received: None"),
        (dict(tokenizer_type="HuggingFaceTokenizer"), r"needs --tokenizer-model"),
        (dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="/nonexistent"), r"local tokenizer.json \(no download\)"),
    ],
)
def test_build_tokenizer_errors_are_one_line(kwargs, message):
    with pytest.raises(TokenizerError, match=message) as info:
        build_tokenizer(**kwargs)
    assert "\n" not in str(info.value)


def test_gpt2_files_without_eod_or_malformed(tmp_path, bpe_files):
    vocab = json.load(open(bpe_files[0], encoding="utf-8"))
    del vocab["<|endoftext|>"]
    (tmp_path / "v.json").write_text(json.dumps(vocab))
    with pytest.raises(TokenizerError, match="has no '<\\|endoftext\\|>' token"):
        GPT2BPETokenizer(str(tmp_path / "v.json"), bpe_files[1])
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="cannot read the GPT-2 BPE files"):
        GPT2BPETokenizer(str(tmp_path / "bad.json"), bpe_files[1])


def test_padded_vocab_size_is_megatrons_rule():
    assert padded_vocab_size(1536) == 1536
    assert padded_vocab_size(1537) == 1664
    assert padded_vocab_size(50257, 128, 2) == 50432
    assert padded_vocab_size(1001, 64) == 1024
