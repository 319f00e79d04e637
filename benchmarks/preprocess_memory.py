"""Peak memory of `mmrun preprocess-data` against input size, beside the bare tokenizer in the same run.

    python benchmarks/preprocess_memory.py [--sizes-mb 1 4 16] [--bare-up-to-mb 16] [--corpus-mb 64] [--markdown]

For each size, one JSONL line holding one document of that many bytes of the demo corpus's prose, and:

- floor: Python reading the line and parsing its JSON, nothing else (what any tool pays);
- bare: the `tokenizers` library encoding the document in one call, Megatron's way
  (`tokenizer.tokenize(text)` in tools/preprocess_data.py), GPT-2 BPE;
- mmrun: `mmrun preprocess-data --workers 1` writing the .bin/.idx (the peak of its one process).

Then a corpus of ordinary documents (--corpus-mb, the demo corpus repeated) with `--workers 2`: memory
that does not grow with the corpus (the peak of the largest process; the pool workers are separate).
Peak RSS is each command's ru_maxrss, measured from a small process in between: a child's ru_maxrss
starts from its parent's RSS at the fork.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mmrun.data.corpus import DEMO_JSONL, DEMO_MERGES, DEMO_VOCAB

PEAK_RSS = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)")
FLOOR = "import json, sys; text = json.loads(open(sys.argv[1], 'rb').readline())['text']"
BARE = ("import json, sys; from mmrun.data.tokenizers import GPT2BPETokenizer; "
        "tok = GPT2BPETokenizer(sys.argv[2], sys.argv[3]); "
        "ids = tok.tokenize(json.loads(open(sys.argv[1], 'rb').readline())['text'])")


def _peak_mb(command: list[str]) -> tuple[float, float]:
    """(peak RSS in MB, seconds) of one command."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", PEAK_RSS, *command], capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"benchmark command failed ({proc.returncode}): {' '.join(command)}\n{proc.stderr[-2000:]}")
    return int(proc.stdout.split()[-1]) / 1024, elapsed


def _prose() -> str:
    return " ".join(json.loads(line)["text"] for line in DEMO_JSONL.read_text(encoding="utf-8").splitlines())


def _preprocess(path: Path, out: Path, workers: int) -> list[str]:
    return [sys.executable, "-m", "mmrun.data.preprocess", "--input", str(path), "--output-prefix", str(out),
            "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(DEMO_VOCAB), "--merge-file", str(DEMO_MERGES),
            "--append-eod", "--workers", str(workers), "--log-interval", "0"]


def measure(sizes_mb: list[float], bare_up_to_mb: float, corpus_mb: float) -> list[dict]:
    prose = _prose()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        for size in sizes_mb:
            n = int(size * 1_000_000)
            path = work / f"doc{size}.jsonl"
            path.write_text(json.dumps({"text": (prose * (n // len(prose) + 1))[:n]}) + "\n", encoding="utf-8")
            floor, _ = _peak_mb([sys.executable, "-c", FLOOR, str(path)])
            bare = _peak_mb([sys.executable, "-c", BARE, str(path), str(DEMO_VOCAB), str(DEMO_MERGES)])[0] \
                if size <= bare_up_to_mb else None
            mmrun, seconds = _peak_mb(_preprocess(path, work / "out", 1))
            rows.append({"input": f"one {size:g} MB document", "floor": floor, "bare": bare, "mmrun": mmrun,
                         "seconds": seconds})
            path.unlink()
        if corpus_mb:
            lines = DEMO_JSONL.read_bytes()
            path = work / "corpus.jsonl"
            with open(path, "wb") as f:
                for _ in range(max(1, int(corpus_mb * 1_000_000 // len(lines)))):
                    f.write(lines)
            mmrun, seconds = _peak_mb(_preprocess(path, work / "out", 2))
            rows.append({"input": f"{path.stat().st_size / 1e6:.0f} MB corpus, 2 workers", "floor": None, "bare": None,
                         "mmrun": mmrun, "seconds": seconds})
    return rows


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", "--sizes_mb", dest="sizes_mb", type=float, nargs="+", default=[1, 4, 16])
    parser.add_argument("--bare-up-to-mb", "--bare_up_to_mb", dest="bare_up_to_mb", type=float, default=16,
                        help="skip the bare tokenizer above this size (it needs ~170 bytes per character)")
    parser.add_argument("--corpus-mb", "--corpus_mb", dest="corpus_mb", type=float, default=64)
    parser.add_argument("--markdown", action="store_true", help="print a table for docs/data.md")
    args = parser.parse_args()
    rows = measure(args.sizes_mb, args.bare_up_to_mb, args.corpus_mb)
    if args.markdown:
        print("| input | floor: read + parse (MB) | bare `tokenizers` encode (MB) | mmrun preprocess-data (MB) | "
              "mmrun / bare | mmrun time (s) |")
        print("|---|---|---|---|---|---|")
    for row in rows:
        ratio = f"{row['mmrun'] / row['bare']:.2f}" if row["bare"] else "-"
        if args.markdown:
            print(f"| {row['input']} | {_cell(row['floor'])} | {_cell(row['bare'])} | {_cell(row['mmrun'])} | {ratio} | "
                  f"{row['seconds']:.1f} |")
        else:
            print(f"{row['input']}: floor {_cell(row['floor'])} MB, bare {_cell(row['bare'])} MB, mmrun "
                  f"{_cell(row['mmrun'])} MB (x{ratio} of bare), {row['seconds']:.1f} s")


if __name__ == "__main__":
    main()
