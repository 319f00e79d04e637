"""A long text is tokenized in pieces, cut only where the ids cannot change: the same ids as in one call."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from mmrun.data.corpus import DEMO_JSONL, DEMO_MERGES, DEMO_VOCAB
from mmrun.data.tokenizers import (MAX_UNCUT_CHARS, GPT2BPETokenizer, HuggingFaceTokenizer, NullTokenizer,
                                   TokenizerError, tokenize_in_pieces)

# What GPT-2's pre-tokenizer regex treats specially: spaces before words, whitespace runs (the last
# space joins the next word), contractions, digits, CJK, punctuation runs, Unicode spaces and separators
# (U+3000, U+00A0, U+2028, U+0085), characters Python calls whitespace and the regex does not (U+001C).
ALPHABET = [*"ab c'sdtmlrev1 2,.;:!?\uff0c\u3002\u3001\uff1b\uff1a\uff01\uff1f\u4e2d\u6587\n\t\u3000\u00a0\u2028\"-_()",
            "'s", "'ll", " '", "\r\n", "\x1c", "\x85", "\u0663", "\u216b", "  ", "\U0001f642"]


@pytest.fixture(scope="module")
def demo_tokenizer() -> GPT2BPETokenizer:
    return GPT2BPETokenizer(str(DEMO_VOCAB), str(DEMO_MERGES))


def _pieces(tok, text: str, piece_chars: int) -> list[int]:
    return [i for piece in tokenize_in_pieces(tok, text, piece_chars=piece_chars) for i in piece]


def _words(tok: GPT2BPETokenizer, text: str) -> list[str]:
    """The pre-tokenizer's words: BPE merges only inside one, so equal words mean equal ids with any vocabulary."""
    return [word for word, _ in tok._tok.pre_tokenizer.pre_tokenize_str(text)]


@settings(max_examples=600, deadline=None)
@given(parts=st.lists(st.sampled_from(ALPHABET), max_size=60), piece_chars=st.integers(1, 12))
def test_gpt2_pieces_give_the_words_and_ids_of_the_whole_text(demo_tokenizer, parts, piece_chars):
    text = "".join(parts)
    cut = [0] + [m.start() for m in demo_tokenizer.cut_points.finditer(text)] + [len(text)]
    assert [w for a, b in zip(cut, cut[1:]) for w in _words(demo_tokenizer, text[a:b])] == _words(demo_tokenizer, text)
    assert _pieces(demo_tokenizer, text, piece_chars) == demo_tokenizer.tokenize(text)


def test_gpt2_pieces_on_the_demo_corpus_and_a_bpe_trained_here(demo_tokenizer, bpe_files):
    text = "\n\n".join(line for line in DEMO_JSONL.read_text(encoding="utf-8").splitlines())
    tiny = GPT2BPETokenizer(*bpe_files)
    for tok in (demo_tokenizer, tiny):
        whole = tok.tokenize(text)
        for piece_chars in (1, 37, 4096):
            assert _pieces(tok, text, piece_chars) == whole
    assert len(list(tokenize_in_pieces(demo_tokenizer, text, piece_chars=4096))) > 50  # really cut


def test_null_tokenizer_pieces():
    tok = NullTokenizer(100)
    text = " ".join(str(i % 97) for i in range(1000)) + "  5 "
    assert _pieces(tok, text, 7) == tok.tokenize(text)


def test_a_stretch_that_cannot_be_cut_is_refused_before_tokenizing(demo_tokenizer, tmp_path):
    with pytest.raises(TokenizerError) as err:
        list(tokenize_in_pieces(demo_tokenizer, "a" * (MAX_UNCUT_CHARS + 1)))
    message = str(err.value)
    assert f"a text of {MAX_UNCUT_CHARS + 1} characters is over the {MAX_UNCUT_CHARS} that GPT2BPETokenizer" in message
    assert "that stretch has no place to cut" in message and "split the document" in message
    # a tokenizer whose pre-tokenizer is unknown is never cut: its limit is the whole text
    path = tmp_path / "tokenizer.json"
    demo_tokenizer._tok.save(str(path))
    hf = HuggingFaceTokenizer(str(path))
    assert _pieces(hf, "hello world " * 100, 7) == hf.tokenize("hello world " * 100)
    with pytest.raises(TokenizerError, match="no place in it is known to be safe to cut"):
        list(tokenize_in_pieces(hf, "hello world " * (MAX_UNCUT_CHARS // 12 + 1)))
