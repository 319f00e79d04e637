"""`mmrun preprocess-data` end to end: outputs megatron-core reads, workers/partitions, bad input."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from mmrun.data.corpus import DEMO_JSONL, DEMO_MERGES, DEMO_VOCAB
from mmrun.data.indexed_dataset import IndexedDataset
from mmrun.data.preprocess import main
from mmrun.data.tokenizers import GPT2BPETokenizer
from mmrun.launchers.cli import main as mmrun_main

GPT2_ARGS = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(DEMO_VOCAB), "--merge-file", str(DEMO_MERGES)]


@pytest.fixture(scope="module")
def demo_head(tmp_path_factory) -> tuple[str, list[str]]:
    """The first 150 documents of the demo corpus as a JSONL file, and their texts."""
    lines = DEMO_JSONL.read_text(encoding="utf-8").splitlines()[:150]
    path = tmp_path_factory.mktemp("in") / "head.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path), [json.loads(line)["text"] for line in lines]


def _bytes(prefix: str) -> tuple[bytes, bytes]:
    return open(prefix + ".bin", "rb").read(), open(prefix + ".idx", "rb").read()


def test_gpt2_output_is_megatron_readable_and_equals_tokenize_plus_eod(demo_head, tmp_path, megatron_datasets, capsys):
    path, texts = demo_head
    rc = mmrun_main(["preprocess-data", "--input", path, "--output-prefix", str(tmp_path / "demo"),
                     *GPT2_ARGS, "--append-eod", "--log-interval", "50"])
    assert rc == 0
    out, err = capsys.readouterr()
    assert "Processed 50 documents (" in err and "docs/s" in err and "MB/s)." in err
    assert err.count("Processed") == 3
    assert f"text: 150 documents, 150 sequences" in out
    prefix = str(tmp_path / "demo_text_document")
    assert sorted(os.listdir(tmp_path)) == ["demo_text_document.bin", "demo_text_document.idx"]
    tok = GPT2BPETokenizer(str(DEMO_VOCAB), str(DEMO_MERGES))
    theirs = megatron_datasets.indexed.IndexedDataset(prefix)
    assert theirs.index.dtype == np.uint16 and len(theirs) == 150
    for i, text in enumerate(texts):
        assert theirs[i].tolist() == tok.tokenize(text) + [tok.eod]
    assert IndexedDataset(prefix).num_documents == 150


def test_two_workers_write_the_same_bytes_as_one(demo_head, tmp_path):
    path, _ = demo_head
    for workers in (1, 2):
        assert main(["--input", path, "--output-prefix", str(tmp_path / f"w{workers}"), *GPT2_ARGS,
                     "--append-eod", "--workers", str(workers), "--log-interval", "0"]) == 0
    assert _bytes(str(tmp_path / "w1_text_document")) == _bytes(str(tmp_path / "w2_text_document"))


def test_partitions_deal_lines_round_robin_like_megatron(demo_head, tmp_path):
    path, texts = demo_head
    assert main(["--input", path, "--output_prefix", str(tmp_path / "p"), *GPT2_ARGS,
                 "--partitions", "2", "--workers", "2", "--log-interval", "0"]) == 0
    assert sorted(os.listdir(tmp_path)) == ["p_text_document.bin", "p_text_document.idx"]
    tok = GPT2BPETokenizer(str(DEMO_VOCAB), str(DEMO_MERGES))
    ds = IndexedDataset(str(tmp_path / "p_text_document"))
    order = list(range(0, 150, 2)) + list(range(1, 150, 2))
    assert [ds[i].tolist() for i in range(len(ds))] == [tok.tokenize(texts[j]) for j in order]
    # --keep-sequential-samples keeps the input order (blocks of a million lines)
    assert main(["--input", path, "--output-prefix", str(tmp_path / "s"), *GPT2_ARGS, "--partitions", "3",
                 "--keep-sequential-samples", "--log-interval", "0"]) == 0
    assert main(["--input", path, "--output-prefix", str(tmp_path / "one"), *GPT2_ARGS, "--log-interval", "0"]) == 0
    assert _bytes(str(tmp_path / "s_text_document")) == _bytes(str(tmp_path / "one_text_document"))


def test_null_tokenizer_lists_keys_and_dtype(tmp_path, write_jsonl):
    path = write_jsonl(tmp_path / "ids.jsonl", [
        {"text": "1 2 3", "title": "7"},
        {"text": ["4 5", "", "6"], "title": "8 9"},  # a list is one document of several sequences
        "   ",                                       # blank lines are skipped
        {"text": "", "title": "10"},                 # empty text: a document with no sequence
    ])
    assert main(["--input", path, "--output-prefix", str(tmp_path / "ids"), "--tokenizer-type", "NullTokenizer",
                 "--vocab-size", "70000", "--json-keys", "text", "title", "--append-eod"]) == 0
    text, title = IndexedDataset(str(tmp_path / "ids_text_document")), IndexedDataset(str(tmp_path / "ids_title_document"))
    assert text.dtype == np.int32  # vocabulary >= 65500
    assert [text[i].tolist() for i in range(len(text))] == [[1, 2, 3, 70000], [4, 5], [6, 70000]]
    assert text.document_indices.tolist() == [0, 1, 3, 3]
    assert [title[i].tolist() for i in range(len(title))] == [[7, 70000], [8, 9, 70000], [10, 70000]]


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(
    "rows, rc, message",
    [
        # 100 good lines come first, so the bad line numbers are 101 and up
        ([{"text": "1 2"}, {"text": "3"}, "{broken json", {"text": "4"}], 1, r"line 103 is not valid JSON"),
        ([{"text": "1 2"}, {"body": "3"}], 1, r"line 102 has no key 'text' \(keys: 'body'\); pass --json-keys"),
        ([{"text": "1"}, "[1, 2]"], 1, r"line 102 is a JSON list, not an object"),
        ([{"text": {"nested": 1}}], 1, r"line 101: 'text' must be a string or a list of strings"),
        ([{"text": "1 two 3"}], 1, r"line 101: NullTokenizer reads space-separated integer ids"),
    ],
)
def test_bad_lines_fail_with_line_number_and_leave_previous_outputs_alone(tmp_path, write_jsonl, capsys, rows, rc, message, workers):
    path = write_jsonl(tmp_path / "in.jsonl", [{"text": "9 9"}] * 100 + rows)
    prefix = tmp_path / "out" / "ds"
    os.makedirs(prefix.parent)
    # a previous run's output must survive a failed run untouched
    (prefix.parent / "ds_text_document.bin").write_bytes(b"old bin")
    (prefix.parent / "ds_text_document.idx").write_bytes(b"old idx")
    code = main(["--input", path, "--output-prefix", str(prefix), "--tokenizer-type", "NullTokenizer",
                 "--vocab-size", "100", "--workers", str(workers), "--log-interval", "0"])
    err = capsys.readouterr().err
    assert code == rc
    assert err.count("\n") == 1 and err.startswith("mmrun preprocess-data: error: ")
    assert "no output written" in err
    assert re.search(message, err), err
    assert sorted(os.listdir(prefix.parent)) == ["ds_text_document.bin", "ds_text_document.idx"]
    assert (prefix.parent / "ds_text_document.bin").read_bytes() == b"old bin"


def test_a_failed_run_removes_the_folders_it_made(tmp_path, write_jsonl, capsys):
    path = write_jsonl(tmp_path / "in.jsonl", [{"text": "1"}, "{oops"])
    assert main(["--input", path, "--output-prefix", str(tmp_path / "a" / "b" / "x"), "--tokenizer-type",
                 "NullTokenizer", "--vocab-size", "10", "--partitions", "2"]) == 1
    assert "line 2 is not valid JSON" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]
    # an output folder that cannot be made (a file is in the way): one line, exit 1
    assert main(["--input", path, "--output-prefix", str(tmp_path / "in.jsonl" / "x"), "--tokenizer-type",
                 "NullTokenizer", "--vocab-size", "10"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "File exists" in err and "no output written" in err
    assert open(path).read().endswith("{oops\n")


def test_usage_errors_exit_2_with_one_line(tmp_path, write_jsonl, capsys):
    good = write_jsonl(tmp_path / "in.jsonl", [{"text": "hello"}])
    cases = [
        (["--input", str(tmp_path / "missing.jsonl"), "--output-prefix", "x", *GPT2_ARGS], "--input file not found. Received: "),
        (["--input", good, "--output-prefix", str(tmp_path / "x"), "--tokenizer-type", "GPT2BPETokenizer",
          "--vocab-file", str(tmp_path / "no.json"), "--merge-file", str(DEMO_MERGES)], "--vocab-file file not found"),
        (["--input", good, "--output-prefix", str(tmp_path / "x"), "--tokenizer-type", "NullTokenizer"], "needs --vocab-size"),
        (["--input", good, "--output-prefix", "x", "--tokenizer-type", "BertWordPieceLowerCase"], "argument --tokenizer-type"),
        (["--input", good, "--output-prefix", "x", *GPT2_ARGS, "--workers", "0"], "--workers must be at least 1"),
        (["--input", good, "--output-prefix", "x", *GPT2_ARGS, "--json-keys", "text", "text"], "lists a key twice"),
        (["--input", good, *GPT2_ARGS], "the following arguments are required: --output-prefix"),
    ]
    for argv, message in cases:
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own usage errors
            code = exc.code
        err = capsys.readouterr().err
        assert code == 2, argv
        assert message in err and err.count("\n") == 1, err
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]


def test_output_prefix_may_not_overwrite_the_input(tmp_path, write_jsonl, capsys):
    path = write_jsonl(tmp_path / "x_text_document.bin", [{"text": "1"}])
    assert main(["--input", path, "--output-prefix", str(tmp_path / "x"), "--tokenizer-type", "NullTokenizer",
                 "--vocab-size", "10"]) == 2
    assert "would overwrite the input file" in capsys.readouterr().err
    assert open(path).read() == '{"text": "1"}\n'


def test_real_entry_points_help_and_run(tmp_path, write_jsonl):
    path = write_jsonl(tmp_path / "in.jsonl", [{"text": "3 4 5"}])
    mmrun = os.path.join(os.path.dirname(sys.executable), "mmrun")
    help_text = subprocess.run([mmrun, "preprocess-data", "--help"], capture_output=True, text=True, check=True).stdout
    assert "--output-prefix" in help_text and "examples:" in help_text
    done = subprocess.run([sys.executable, "-m", "mmrun.data.preprocess", "--input", path, "--output-prefix",
                           str(tmp_path / "o"), "--tokenizer-type", "NullTokenizer", "--vocab-size", "10",
                           "--append-eod", "--workers", "2"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert IndexedDataset(str(tmp_path / "o_text_document"))[0].tolist() == [3, 4, 5, 10]
