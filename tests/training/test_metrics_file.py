"""--metrics-file: a path that cannot be written is one line (exit 2); a disk that fills up later costs the
metrics, never the run, and never leaves half a line."""
from __future__ import annotations

import json
import resource
import subprocess
import sys
import textwrap

import pytest

from mmrun.backend.errors import UsageError
from mmrun.training.training_log import MetricsFile


def test_appends_one_json_line_per_record(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"kind": "old"}\n')
    metrics = MetricsFile(str(path), enabled=True)
    metrics.write({"kind": "train", "lm_loss": 1 / 3})
    metrics.close()
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"kind": "old"},
                                                                          {"kind": "train", "lm_loss": 1 / 3}]
    MetricsFile(str(tmp_path / "no" / "m.jsonl"), enabled=False).write({"x": 1})  # other ranks write nothing


@pytest.mark.parametrize("where, message", [
    ("missing/m.jsonl", r"the directory .*missing does not exist\. Received: --metrics-file .*; create the directory"),
    ("", r"cannot be opened for appending \(Is a directory\); pass a writable file"),
])
def test_a_path_that_cannot_be_written_is_a_usage_error(tmp_path, where, message):
    with pytest.raises(UsageError, match=message) as err:
        MetricsFile(str(tmp_path / where), enabled=True)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)


WRITER = textwrap.dedent("""
    import sys
    from mmrun.training.training_log import MetricsFile
    metrics = MetricsFile(sys.argv[1], enabled=True)
    for i in range(1000):
        metrics.write({"kind": "train", "iteration": i, "text": "x" * 100})
    print("training goes on")
""")


def test_a_full_disk_cuts_the_file_back_to_its_last_complete_line(tmp_path):
    path = tmp_path / "m.jsonl"
    limit = 10_000  # RLIMIT_FSIZE: a write past it fails with EFBIG, as on a full disk
    proc = subprocess.run([sys.executable, "-c", WRITER, str(path)], capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    assert proc.returncode == 0 and proc.stdout == "training goes on\n"
    (warning,) = proc.stderr.splitlines()
    assert warning == (f"WARNING: --metrics-file {path}: File too large; it ends at its last complete line and gets "
                       "no more metrics in this run; training goes on")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert path.read_text().endswith("\n") and [r["iteration"] for r in records] == list(range(len(records)))
    assert 0 < path.stat().st_size <= limit
