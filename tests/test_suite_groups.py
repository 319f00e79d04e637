"""The README runs the suite on two pytest-xdist workers (`-n 2 --dist loadgroup`); tests/conftest.py keeps the
tests that share an expensive fixture, or a file, on one worker. If pytest or xdist stopped honouring the
groups, each worker would train the shared runs again and the suite would run over CI's time: checked here on
a small suite of its own, really run by pytest-xdist."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent

SHARED = '''
import os, pytest

@pytest.fixture(scope="session")
def vlm():
    return os.environ["PYTEST_XDIST_WORKER"]

def record(name, worker):
    with open(os.path.join(os.environ["GROUPS_OUT"], name), "w") as f:
        f.write(worker)
'''


def test_shared_fixture_users_and_each_file_stay_on_one_worker(tmp_path):
    suite = tmp_path / "tests"
    suite.mkdir()
    shutil.copy(ROOT / "conftest.py", suite / "conftest.py")
    (suite / "helpers.py").write_text(SHARED)
    with (suite / "conftest.py").open("a") as conftest:
        conftest.write("\nfrom helpers import vlm  # noqa: E402,F401\n")
    for name in ("a", "b"):  # two files using the shared fixture
        (suite / f"test_{name}.py").write_text("from helpers import record\n" + "".join(
            f"def test_{name}{i}(vlm):\n    record('{name}{i}', vlm)\n" for i in range(3)))
    for name in ("c", "d"):  # two files without it: one worker per file
        (suite / f"test_{name}.py").write_text("import os\nfrom helpers import record\n" + "".join(
            f"def test_{name}{i}():\n    record('{name}{i}', os.environ['PYTEST_XDIST_WORKER'])\n" for i in range(3)))
    out = tmp_path / "out"
    out.mkdir()
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup",
                             "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(suite)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={**__import__("os").environ, "GROUPS_OUT": str(out), "PYTHONPATH": str(suite)})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    workers = {p.name: p.read_text() for p in out.iterdir()}
    assert len(workers) == 12, workers
    for group in (["a0", "a1", "a2", "b0", "b1", "b2"], ["c0", "c1", "c2"], ["d0", "d1", "d2"]):
        assert len({workers[t] for t in group}) == 1, (group, workers)
