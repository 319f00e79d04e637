"""`mmrun preprocess-data`: tokenize JSONL into Megatron's indexed `.bin`/`.idx` format.

Same flags and output names as Megatron-LM's `tools/preprocess_data.py`, so a seed script's
preprocessing line runs with `python tools/preprocess_data.py` swapped for `mmrun preprocess-data`.
Output files appear only when the whole input has been tokenized (temporary names until then).

Memory is bounded, whatever the input: lines go to the workers in batches, with at most
IN_FLIGHT_BYTES of input read ahead of the writer, and a long document is tokenized in pieces
(tokenizers.tokenize_in_pieces), its ids kept in the output dtype. SIGTERM and SIGINT remove the
temporary files; after a SIGKILL the next run for the same output prefix removes them.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from typing import Iterator

import numpy as np

from mmrun.common.atomic_write import remove_stale_temporaries, temporary_name
from mmrun.data.indexed_dataset import (IndexedDatasetError, IndexedDatasetWriter, bin_path, cast_tokens, idx_path,
                                        optimal_dtype)
from mmrun.data.tokenizers import TOKENIZER_BUILDERS, TokenizerError, build_tokenizer, tokenize_in_pieces
from mmrun.common.processes import set_parent_death_signal

PROG = "mmrun preprocess-data"
# Lines handed to a worker at a time (Megatron uses the same chunk size), or fewer when they hold BATCH_BYTES.
CHUNK_SIZE = 32
BATCH_BYTES = 1 << 20
# Input read ahead of the writer, at most (plus one batch): what bounds memory on a large corpus.
IN_FLIGHT_BYTES = 64 << 20
_SURROGATE = re.compile("[\ud800-\udfff]")
# Megatron's --keep-sequential-samples moves to the next partition every this many lines.
SEQUENTIAL_BLOCK_LINES = 1_000_000

EPILOG = """examples:
  # the demo corpus shipped with mmrun, GPT-2 byte-level BPE, 2 worker processes
  mmrun preprocess-data --input data/corpus/demo_corpus.jsonl \\
      --output-prefix ./gpt_pretrain_data/demo \\
      --tokenizer-type GPT2BPETokenizer \\
      --vocab-file data/corpus/gpt2-vocab.json --merge-file data/corpus/gpt2-merges.txt \\
      --append-eod --workers 2 --log-interval 200
  # -> ./gpt_pretrain_data/demo_text_document.bin and .idx (pass that prefix to --data-path)

  # pre-tokenized ids ("12 7 431 ..."), Megatron's NullTokenizer
  mmrun preprocess-data --input ids.jsonl --output-prefix out/ids \\
      --tokenizer-type NullTokenizer --vocab-size 32000 --append-eod

exit status: 0 done, 1 bad input data (line number in the message), 2 usage error,
130/143 interrupted by SIGINT/SIGTERM (no output written, temporary files removed).
"""


class _OneLineErrorParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse prints the whole usage block otherwise
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineErrorParser(
        prog=PROG,
        description="Tokenize a JSONL corpus into Megatron's indexed dataset format (.bin/.idx).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("input data")
    g.add_argument("--input", required=True, help="JSONL file: one JSON object per line")
    g.add_argument(
        "--json-keys", "--json_keys", dest="json_keys", nargs="+", default=["text"],
        help="keys to extract from each JSON object; one output dataset per key (default: text)",
    )
    g = p.add_argument_group("tokenizer")
    g.add_argument(
        "--tokenizer-type", "--tokenizer_type", dest="tokenizer_type", required=True,
        choices=list(TOKENIZER_BUILDERS), help="Megatron tokenizer name",
    )
    g.add_argument("--vocab-file", "--vocab_file", dest="vocab_file", help="GPT-2 vocab.json")
    g.add_argument("--merge-file", "--merge_file", dest="merge_file", help="GPT-2 merges.txt")
    g.add_argument("--vocab-size", "--vocab_size", dest="vocab_size", type=int, help="NullTokenizer vocabulary size")
    g.add_argument(
        "--tokenizer-model", "--tokenizer_model", dest="tokenizer_model",
        help="HuggingFaceTokenizer: a local tokenizer.json or its directory",
    )
    g.add_argument("--append-eod", "--append_eod", dest="append_eod", action="store_true",
                   help="append the end-of-document token to every document")
    g = p.add_argument_group("output data")
    g.add_argument("--output-prefix", "--output_prefix", dest="output_prefix", required=True,
                   help="writes <prefix>_<key>_document.bin/.idx")
    g = p.add_argument_group("runtime")
    g.add_argument("--workers", type=int, default=1, help="tokenizer processes (default 1)")
    g.add_argument("--partitions", type=int, default=1,
                   help="shard the input like Megatron (lines dealt round robin) and merge the shards")
    g.add_argument("--keep-sequential-samples", "--keep_sequential_samples", dest="keep_sequential_samples",
                   action="store_true", help="with --partitions: deal blocks of 1,000,000 lines, not single lines")
    g.add_argument("--log-interval", "--log_interval", dest="log_interval", type=int, default=1000,
                   help="print a progress line every N documents (default 1000)")
    return p


class InputDataError(ValueError):
    """A line of the input cannot be used (the message names the line)."""


# Per-process state of the tokenizer workers (set by _init_worker, read by _encode_line).
_WORKER: dict = {}


def _init_worker(tokenizer_kwargs: dict, json_keys: list[str], append_eod: bool, dtype: str,
                 in_pool: bool = False) -> None:
    if in_pool:
        # Ctrl-C reaches the whole process group: the main process stops the pool; workers stay quiet.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not main()'s handler, inherited through fork
        set_parent_death_signal(signal.SIGTERM)  # SIGKILLed, the main process cannot stop a worker deep in a long document
    _WORKER["tokenizer"] = build_tokenizer(**tokenizer_kwargs)
    _WORKER["json_keys"] = json_keys
    _WORKER["append_eod"] = append_eod
    _WORKER["dtype"] = np.dtype(dtype)


def _encode_line(item: tuple[int, bytes]):
    """Tokenize one JSONL line -> (line number, {key: (ids, sequence lengths)}, bytes) or an error."""
    lineno, raw = item
    try:
        return lineno, _encode(raw, lineno), len(raw)
    except InputDataError as exc:
        return lineno, str(exc), len(raw)
    except (TokenizerError, IndexedDatasetError) as exc:
        return lineno, f"line {lineno}: {exc}", len(raw)


def _encode_batch(batch: list[tuple[int, bytes]]) -> list[tuple]:
    return [_encode_line(item) for item in batch]


class _LongInteger:
    """Stands for an integer with more digits than Python converts (sys.get_int_max_str_digits): a key
    that is not tokenized may hold one; a tokenized key holding one is refused like any non-string."""

    def __init__(self, digits: str) -> None:
        self.digits = len(digits)

    def __repr__(self) -> str:
        return f"<an integer of {self.digits} digits>"


def _parse_int(digits: str) -> int | _LongInteger:
    limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()
    return _LongInteger(digits) if limit and len(digits) > limit else int(digits)


def _parse(raw: bytes, lineno: int) -> dict:
    try:
        obj = json.loads(raw, parse_int=_parse_int)
    except RecursionError:
        raise InputDataError(f"line {lineno} is nested too deeply to parse (over about {sys.getrecursionlimit()} "
                             f"levels of [ and {{). Received: {raw[:80]!r}") from None
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        raise InputDataError(f"line {lineno} is not valid JSON ({exc}). Received: {raw[:80]!r}") from None
    if not isinstance(obj, dict):
        raise InputDataError(f"line {lineno} is a JSON {type(obj).__name__}, not an object. Received: {raw[:80]!r}")
    return obj


def _encode(raw: bytes, lineno: int) -> dict[str, tuple[np.ndarray, list[int]]]:
    tok, dtype = _WORKER["tokenizer"], _WORKER["dtype"]
    obj = _parse(raw, lineno)
    out = {}
    for key in _WORKER["json_keys"]:
        if key not in obj:
            raise InputDataError(
                f"line {lineno} has no key {key!r} (keys: {', '.join(map(repr, obj)) or 'none'}); "
                "pass --json-keys with the key that holds the text"
            )
        text = obj[key]
        # Megatron: a list of strings is a document of several sentences, one sequence each.
        sentences = text if isinstance(text, list) else [text]
        if not all(isinstance(s, str) for s in sentences):
            raise InputDataError(f"line {lineno}: {key!r} must be a string or a list of strings. Received: {text!r:.80}")
        pieces: list[np.ndarray] = []
        lengths: list[int] = []
        for sentence in sentences:
            bad = _SURROGATE.search(sentence)
            if bad:
                raise InputDataError(f"line {lineno}: {key!r} holds a lone surrogate {bad.group()!r} at character "
                                     f"{bad.start()}, which is not Unicode text (its writer split a surrogate pair); "
                                     "fix or drop that line")
            # In pieces, each kept in the output dtype: memory follows the piece, not the document.
            ids = [cast_tokens(part, dtype) for part in tokenize_in_pieces(tok, sentence)]
            count = sum(part.size for part in ids)
            if count:
                pieces.extend(ids)
                lengths.append(count)
        if pieces and _WORKER["append_eod"]:
            pieces.append(cast_tokens([tok.eod], dtype))
            lengths[-1] += 1
        out[key] = (np.concatenate(pieces) if pieces else np.zeros(0, dtype), lengths)
    return out


def _read_lines(path: str) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line) for every non-blank line."""
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            if line.strip():
                yield lineno, line


class _Window:
    """Bounds the input read ahead of the writer: the reader takes a batch's bytes before handing it
    on, the writer gives them back when the batch is written (one batch is always allowed)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used, self.open = limit, 0, True
        self._cond = threading.Condition()

    def take(self, nbytes: int) -> None:
        with self._cond:
            while self.open and self.used and self.used + nbytes > self.limit:
                self._cond.wait()
            self.used += nbytes

    def give(self, nbytes: int) -> None:
        with self._cond:
            self.used -= nbytes
            self._cond.notify_all()

    def close(self) -> None:
        """Let a blocked reader go (the run is ending)."""
        with self._cond:
            self.open = False
            self._cond.notify_all()


def _batches(path: str, window: _Window | None) -> Iterator[list[tuple[int, bytes]]]:
    """Lines in batches of CHUNK_SIZE lines or BATCH_BYTES bytes, whichever comes first."""
    batch: list[tuple[int, bytes]] = []
    size = 0
    for item in _read_lines(path):
        batch.append(item)
        size += len(item[1])
        if len(batch) == CHUNK_SIZE or size >= BATCH_BYTES:
            if window is not None:
                window.take(size)
            yield batch
            batch, size = [], 0
    if batch:
        if window is not None:
            window.take(size)
        yield batch


class _Progress:
    def __init__(self, interval: int) -> None:
        self.interval = interval
        self.start = time.time()
        self.docs = 0
        self.bytes = 0

    def update(self, nbytes: int) -> None:
        self.docs += 1
        self.bytes += nbytes
        if self.interval > 0 and self.docs % self.interval == 0:
            elapsed = max(time.time() - self.start, 1e-9)
            print(
                f"Processed {self.docs} documents ({self.docs / elapsed:.1f} docs/s, "
                f"{self.bytes / elapsed / 1024 / 1024:.2f} MB/s).",
                file=sys.stderr, flush=True,
            )


def _output_prefix(prefix: str, key: str) -> str:
    return f"{prefix}_{key}_document"


def _partition_of(line_number: int, partitions: int, sequential: bool) -> int:
    if sequential:
        return (line_number // SEQUENTIAL_BLOCK_LINES) % partitions
    return line_number % partitions


def _missing_dirs(path: str) -> list[str]:
    """The folders, outermost first, that must be made for `path` to exist."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    return missing[::-1]


def _usage_problem(args: argparse.Namespace) -> str | None:
    if not os.path.isfile(args.input):
        return f"--input file not found. Received: {args.input!r}; pass a JSONL file (one JSON object per line)."
    if args.workers < 1:
        return f"--workers must be at least 1. Received: {args.workers}."
    if args.partitions < 1:
        return f"--partitions must be at least 1. Received: {args.partitions}."
    if len(set(args.json_keys)) != len(args.json_keys):
        return f"--json-keys lists a key twice. Received: {' '.join(args.json_keys)}."
    real_input = os.path.realpath(args.input)
    for key in args.json_keys:
        for suffix in (".bin", ".idx"):
            if os.path.realpath(_output_prefix(args.output_prefix, key) + suffix) == real_input:
                return f"--output-prefix would overwrite the input file {args.input!r}; choose another prefix."
    return None


def run(args: argparse.Namespace) -> dict[str, dict]:
    """Tokenize `args.input`; returns {key: {"prefix", "documents", "sequences", "tokens"}}."""
    tokenizer_kwargs = dict(
        tokenizer_type=args.tokenizer_type, vocab_file=args.vocab_file, merge_file=args.merge_file,
        vocab_size=args.vocab_size, tokenizer_model=args.tokenizer_model,
    )
    tokenizer = build_tokenizer(**tokenizer_kwargs)  # also validates the files before any work
    if args.append_eod:
        tokenizer.eod  # noqa: B018 - raises now, not in a worker, if there is no EOD token
    dtype = optimal_dtype(tokenizer.vocab_size)
    out_dir = os.path.dirname(os.path.abspath(args.output_prefix))
    new_dirs = _missing_dirs(out_dir)
    for d in new_dirs:
        os.mkdir(d)

    final = {k: _output_prefix(args.output_prefix, k) for k in args.json_keys}
    for prefix in final.values():  # what a killed run for these outputs left behind (its pid is gone)
        remove_stale_temporaries(bin_path(prefix))
        remove_stale_temporaries(idx_path(prefix))
    # One writer per key and partition; partitions are merged in order at the end (Megatron's layout).
    # A single partition writes straight to the final (temporary-named) files; shards live in a
    # temporary folder named after the final .bin, so that a killed run's shards are found as leftovers.
    shard_dirs: list[str] = []
    if args.partitions == 1:
        shard_prefixes = {k: [final[k]] for k in args.json_keys}
    else:
        shard_prefixes = {}
        for k in args.json_keys:
            shard_dirs.append(tempfile.mkdtemp(prefix=temporary_name(bin_path(final[k])), dir=out_dir))
            shard_prefixes[k] = [os.path.join(shard_dirs[-1], f"part{i}") for i in range(args.partitions)]
    writers: list[IndexedDatasetWriter] = []
    stats = {k: {"prefix": final[k], "documents": 0, "sequences": 0, "tokens": 0} for k in args.json_keys}
    pool = None
    window = _Window(IN_FLIGHT_BYTES) if args.workers > 1 else None
    finished = False
    try:
        shards = {k: [IndexedDatasetWriter(p, dtype) for p in prefixes] for k, prefixes in shard_prefixes.items()}
        writers = [w for ws in shards.values() for w in ws]
        init_args = (tokenizer_kwargs, list(args.json_keys), args.append_eod, np.dtype(dtype).str)
        if args.workers == 1:
            _init_worker(*init_args)
            results = map(_encode_batch, _batches(args.input, None))
        else:
            pool = multiprocessing.Pool(args.workers, initializer=_init_worker, initargs=(*init_args, True))
            results = pool.imap(_encode_batch, _batches(args.input, window))
        progress = _Progress(args.log_interval)
        doc_number = 0
        for batch in results:
            for lineno, encoded, nbytes in batch:
                if isinstance(encoded, str):
                    raise InputDataError(encoded)
                part = _partition_of(doc_number, args.partitions, args.keep_sequential_samples)
                for key, (ids, lengths) in encoded.items():
                    shards[key][part].add_document(ids, lengths)
                    stats[key]["documents"] += 1
                    stats[key]["sequences"] += len(lengths)
                    stats[key]["tokens"] += int(ids.size)
                progress.update(nbytes)
                doc_number += 1
            if window is not None:
                window.give(sum(item[2] for item in batch))
        if pool is not None:
            pool.close()
            pool.join()
            pool = None
        for key, ws in shards.items():
            for w in ws:
                w.finalize()
            if args.partitions > 1:
                with IndexedDatasetWriter(final[key], dtype) as merged:
                    for prefix in shard_prefixes[key]:
                        merged.add_index(prefix)
        finished = True
        return stats
    finally:
        if window is not None:
            window.close()
        if pool is not None:
            pool.terminate()
            pool.join()
        for w in writers:
            w.abort()  # a no-op for writers that finished
        for d in shard_dirs:
            shutil.rmtree(d, ignore_errors=True)
        if not finished:  # folders this run made for its output go too, when left empty
            for d in reversed(new_dirs):
                if not os.listdir(d):
                    os.rmdir(d)


class _Interrupted(Exception):
    """SIGTERM arrived: unwind like Ctrl-C, so that every temporary file is removed on the way out."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum: int, frame) -> None:
    raise _Interrupted(signum)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    problem = _usage_problem(args)
    if problem:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
        return 2
    start = time.time()
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_interrupted) if on_main_thread else None
    try:
        stats = run(args)
    except (KeyboardInterrupt, _Interrupted) as exc:
        signum = getattr(exc, "signum", signal.SIGINT)
        print(f"{PROG}: error: interrupted by {signal.Signals(signum).name}; no output written, temporary files "
              "removed.", file=sys.stderr)
        return 128 + signum
    except TokenizerError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except (InputDataError, IndexedDatasetError) as exc:
        print(f"{PROG}: error: {args.input}: {exc}; no output written.", file=sys.stderr)
        return 1
    except OSError as exc:  # unreadable input, unwritable output folder, full disk
        print(f"{PROG}: error: {exc}; no output written.", file=sys.stderr)
        return 1
    finally:
        if on_main_thread:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    elapsed = time.time() - start
    for key, s in stats.items():
        print(
            f"{key}: {s['documents']} documents, {s['sequences']} sequences, {s['tokens']} tokens "
            f"-> {s['prefix']}.bin/.idx ({elapsed:.2f} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
