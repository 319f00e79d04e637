"""`mmrun preprocess-data` on hostile input and when stopped: one line, bounded memory, no leftovers."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mmrun.data.corpus import DEMO_JSONL, DEMO_MERGES, DEMO_VOCAB
from mmrun.data.indexed_dataset import IndexedDataset
from mmrun.data.preprocess import main
from mmrun.data.tokenizers import MAX_UNCUT_CHARS, GPT2BPETokenizer

GPT2_ARGS = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(DEMO_VOCAB), "--merge-file", str(DEMO_MERGES)]
PREPROCESS = [sys.executable, "-m", "mmrun.data.preprocess"]
# Runs a command and prints its peak RSS (KiB). A small process in between, because a child's ru_maxrss
# starts from its parent's RSS at the fork (here: the whole test session).
PEAK_RSS = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)")


def _old_output(folder: Path) -> None:
    folder.mkdir(exist_ok=True)
    (folder / "ds_text_document.bin").write_bytes(b"old bin")
    (folder / "ds_text_document.idx").write_bytes(b"old idx")


def _untouched(folder: Path) -> bool:
    return (sorted(os.listdir(folder)) == ["ds_text_document.bin", "ds_text_document.idx"]
            and (folder / "ds_text_document.bin").read_bytes() == b"old bin")


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("line, message", [
    ('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}", r"line 2 is nested too deeply to parse \(over about \d+ levels"),
    ('{"text": "ab\\ud800cd"}', r"line 2: 'text' holds a lone surrogate '\\ud800' at character 2, which is not Unicode"),
    ('{"text": "x", "text2": "\\udfff"}', None),  # a key that is not tokenized may hold anything
    ('{"text": ' + "9" * 100_000 + "}", r"line 2: 'text' must be a string or a list of strings. Received: "
                                        r"<an integer of 100000 digits>"),
    ('{"text": "fine", "id": ' + "9" * 100_000 + "}", None),
    ('{"text": "' + "a" * (MAX_UNCUT_CHARS + 1) + '"}', rf"line 2: a text of {MAX_UNCUT_CHARS + 1} characters is over the "
                                                       rf"{MAX_UNCUT_CHARS} that GPT2BPETokenizer is given at once"),
])
def test_hostile_json_is_one_line_exit_1_or_accepted(tmp_path, capsys, workers, line, message):
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "first"}\n' + line + "\n", encoding="utf-8")
    _old_output(tmp_path / "out")
    code = main(["--input", str(path), "--output-prefix", str(tmp_path / "out" / "ds"), *GPT2_ARGS,
                 "--workers", str(workers), "--log-interval", "0"])
    out, err = capsys.readouterr()
    if message is None:
        assert code == 0 and "text: 2 documents" in out, err
        return
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("mmrun preprocess-data: error: ") and "no output written" in err
    assert __import__("re").search(message, err), err
    assert len(err) < 600 and _untouched(tmp_path / "out")


def _slow_input(folder: Path) -> Path:
    """About 8 MB of demo prose in 8 lines: seconds of tokenizing, long enough to be stopped in the middle."""
    text = " ".join(json.loads(line)["text"] for line in DEMO_JSONL.read_text(encoding="utf-8").splitlines())
    path = folder / "slow.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(8):
            f.write(json.dumps({"text": text * 3}) + "\n")
    return path


def _start(tmp_path: Path, workers: int, partitions: int) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "out"
    proc = subprocess.Popen([*PREPROCESS, "--input", str(_slow_input(tmp_path)), "--output-prefix", str(out / "ds"),
                             *GPT2_ARGS, "--workers", str(workers), "--partitions", str(partitions), "--log-interval", "1"],
                            stderr=subprocess.PIPE, text=True)
    # Stop it once it is writing: its first progress line comes after the first document is written.
    assert proc.stderr.readline().startswith("Processed 1 documents"), "no progress line"
    return proc, out


@pytest.mark.parametrize("workers, partitions", [(1, 1), (2, 2)])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_leave_no_temporaries_and_the_old_output(tmp_path, workers, partitions, sig):
    _old_output(tmp_path / "out")
    proc, out = _start(tmp_path, workers, partitions)
    assert [p for p in os.listdir(out) if ".mmrun-tmp-" in p], "nothing being written when stopped"
    proc.send_signal(sig)
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 128 + sig
    assert err.strip().splitlines()[-1] == (f"mmrun preprocess-data: error: interrupted by {signal.Signals(sig).name}; "
                                            "no output written, temporary files removed.")
    assert "Traceback" not in err
    assert _untouched(out)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_after_sigkill_no_worker_is_left_and_the_next_run_removes_the_leftovers(tmp_path):
    proc, out = _start(tmp_path, 2, 2)
    workers = [int(pid) for pid in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
    assert len(workers) == 2
    proc.kill()
    proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_running(pid) for pid in workers), "pool workers outlived the killed run"
    leftovers = [p for p in os.listdir(out) if ".mmrun-tmp-" in p]
    assert leftovers, "a killed run leaves temporaries (a shard folder, a .bin being written)"
    line = json.dumps({"text": "small"}) + "\n"
    (tmp_path / "small.jsonl").write_text(line)
    assert main(["--input", str(tmp_path / "small.jsonl"), "--output-prefix", str(out / "ds"), *GPT2_ARGS,
                 "--log-interval", "0"]) == 0
    assert sorted(os.listdir(out)) == ["ds_text_document.bin", "ds_text_document.idx"]
    tok = GPT2BPETokenizer(str(DEMO_VOCAB), str(DEMO_MERGES))
    assert IndexedDataset(str(out / "ds_text_document"))[0].tolist() == tok.tokenize("small")


def test_one_long_document_is_tokenized_in_bounded_memory(tmp_path):
    """8 MB in one line: tokenized whole it takes about 1.2 GB of peak RSS (150 bytes per character); in pieces
    the process stays near its baseline plus about 3 bytes per character (benchmarks/preprocess_memory.py)."""
    text = " ".join(json.loads(line)["text"] for line in DEMO_JSONL.read_text(encoding="utf-8").splitlines())
    text = (text * (8_000_000 // len(text) + 1))[:8_000_000]
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"text": text}) + "\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-c", PEAK_RSS, *PREPROCESS, "--input", str(path), "--output-prefix",
                           str(tmp_path / "long"), *GPT2_ARGS], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    peak_mb = int(proc.stdout.split()[-1]) / 1024
    print(f"peak RSS for one 8 MB document: {peak_mb:.0f} MB")
    assert peak_mb < 400
    tok = GPT2BPETokenizer(str(DEMO_VOCAB), str(DEMO_MERGES))
    head = IndexedDataset(str(tmp_path / "long_text_document"))[0][:2000].tolist()
    assert head == tok.tokenize(text[:20000])[:2000]


def test_the_reader_stays_a_bounded_window_ahead_of_a_slow_writer(tmp_path):
    """multiprocessing.Pool.imap alone reads its whole input ahead (a corpus in memory); the window stops it."""
    import multiprocessing

    from mmrun.data.preprocess import CHUNK_SIZE, _batches, _Window

    line = json.dumps({"text": "x" * 1000}) + "\n"
    path = tmp_path / "in.jsonl"
    path.write_text(line * 3000)
    limit = 64 * 1024
    window = _Window(limit)
    ahead = []
    take = window.take
    window.take = lambda nbytes: (take(nbytes), ahead.append(window.used))
    with multiprocessing.Pool(2) as pool:
        lines = 0
        for count in pool.imap(len, _batches(str(path), window)):  # len: lines per batch
            time.sleep(0.002)
            window.give(count * len(line))
            lines += count
    assert lines == 3000 and len(ahead) == 3000 // CHUNK_SIZE + 1
    assert max(ahead) <= limit + CHUNK_SIZE * len(line)
