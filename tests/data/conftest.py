"""Shared fixtures for the data pipeline tests: small BPE files trained here, sample corpora."""
from __future__ import annotations

import json
import warnings

import pytest

SAMPLE_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "A bicycle works by turning the pedals, which pull a chain that drives the rear wheel.",
    "In winter, the valley is covered with fresh snow and the owls hunt at dusk.",
    "Dear Anna, I hope this letter finds you well. It's been 12 years since we met!",
    "Numbers like 3.14159 and 2,718 appear in text; so do tabs\tand  double  spaces.",
    "She said: \"we'll see\" -- and they're still waiting, aren't they?",
]


@pytest.fixture(scope="session")
def bpe_files(tmp_path_factory) -> tuple[str, str]:
    """(vocab.json, merges.txt) of a byte-level BPE trained on SAMPLE_TEXT (GPT-2 scheme)."""
    from tokenizers import ByteLevelBPETokenizer

    out = tmp_path_factory.mktemp("bpe")
    tok = ByteLevelBPETokenizer(add_prefix_space=False)
    tok.train_from_iterator(SAMPLE_TEXT * 20, vocab_size=400, min_frequency=2,
                            special_tokens=["<|endoftext|>"], show_progress=False)
    vocab, merges = tok.save_model(str(out), "tiny")
    return vocab, merges


@pytest.fixture(scope="session")
def megatron_datasets():
    """megatron-core's datasets package (imports torch; tests only)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import megatron.core.datasets.gpt_dataset as gpt
        import megatron.core.datasets.indexed_dataset as indexed
        from megatron.core.datasets import helpers
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    return type("MegatronDatasets", (), {
        "gpt": gpt, "indexed": indexed, "helpers": helpers, "Builder": BlendedMegatronDatasetBuilder,
    })


def _write_jsonl(path, rows) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return str(path)


@pytest.fixture
def write_jsonl():
    """write_jsonl(path, rows): rows are dicts (JSON-encoded) or raw strings (written as they are)."""
    return _write_jsonl
