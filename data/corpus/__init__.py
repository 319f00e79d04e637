"""The demo corpus shipped with mmrun (English prose from a seeded grammar, no third-party text).

Regenerate with `python scripts/make_demo_corpus.py`; the same seed gives byte-identical files.
"""
from __future__ import annotations

from pathlib import Path

CORPUS_DIR = Path(__file__).resolve().parent
DEMO_JSONL = CORPUS_DIR / "demo_corpus.jsonl"
# Byte-level BPE (GPT-2 scheme, 1536 tokens incl. <|endoftext|>) trained on DEMO_JSONL.
DEMO_VOCAB = CORPUS_DIR / "gpt2-vocab.json"
DEMO_MERGES = CORPUS_DIR / "gpt2-merges.txt"
