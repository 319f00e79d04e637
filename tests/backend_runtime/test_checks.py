"""Framework-free helpers shared by both backends: argument checks, the all_gather_object codec,
CANN detection."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from mmrun.backend import cann, checks, errors, object_codec, vocabulary
from mmrun.backend.errors import BackendWarning, UsageError


@pytest.fixture(autouse=True)
def forget_warnings():
    # warn_once remembers messages for the whole process; each test starts afresh.
    errors._warned.clear()
    yield
    errors._warned.clear()


@pytest.mark.parametrize("framework, device, requested, used, notice", [
    ("pytorch", "cpu", None, "gloo", False),
    ("pytorch", "cpu", "nccl", "gloo", True),
    ("pytorch", "npu", "nccl", "hccl", True),
    ("pytorch", "cuda", "gloo", "gloo", False),
    ("pytorch", "cuda", None, "nccl", False),
    ("mindspore", "CPU", "nccl", "mccl", True),
    ("mindspore", "CPU", "gloo", "mccl", True),
    ("mindspore", "Ascend", None, "hccl", False),
    ("mindspore", "GPU", "NCCL", "nccl", False),
])
def test_distributed_backend_is_the_one_that_works_on_the_device(framework, device, requested, used, notice, recwarn):
    assert checks.dist_backend(framework, device, requested) == used
    notices = [w for w in recwarn if issubclass(w.category, BackendWarning)]
    assert len(notices) == int(notice)
    if notice:
        assert f"--distributed-backend {requested.lower()} does not work with {framework} on {vocabulary.device_kind(device)}; using {used}" \
            in str(notices[0].message)


def test_the_notice_is_given_once(recwarn):
    for _ in range(3):
        checks.dist_backend("pytorch", "cpu", "nccl")
    assert len([w for w in recwarn if issubclass(w.category, BackendWarning)]) == 1


def test_unknown_distributed_backend():
    with pytest.raises(UsageError, match="Received: 'tcp'; choose one of hccl, nccl, gloo"):
        checks.dist_backend("pytorch", "cpu", "tcp")


@pytest.mark.parametrize("bad", [-1, 2**32, 1.5, True, "7"])
def test_bad_seeds(bad):
    with pytest.raises(UsageError, match="seed must be a whole number from 0 to 4294967295"):
        checks.seed(bad)


def test_good_seeds_and_reduce_ops():
    assert checks.seed(0) == 0 and checks.seed(2**32 - 1) == 2**32 - 1
    assert checks.reduce_op("mean") == "mean"
    with pytest.raises(UsageError, match="must be one of sum, mean. Received: 'max'"):
        checks.reduce_op("max")


def test_object_codec_round_trip():
    obj = {"rank": 3, "loss": 2.5, "tags": ["a", "é"], "ok": True, "none": None, "pair": (1, 2)}
    data = object_codec.encode(obj)
    assert data.dtype == np.uint8
    assert object_codec.decode(data) == {**obj, "pair": [1, 2]}  # JSON: a tuple comes back as a list


def test_object_codec_refuses_what_json_cannot_carry():
    with pytest.raises(UsageError, match="JSON values only .* Received: set"):
        object_codec.encode({1, 2})


def test_cann_found_from_its_environment_variable(tmp_path):
    assert cann.cann_location({"ASCEND_HOME_PATH": str(tmp_path)}, use_ld_cache=False) == str(tmp_path)
    assert cann.cann_location({"ASCEND_TOOLKIT_HOME": str(tmp_path / "absent")}, use_ld_cache=False) is None


def test_cann_found_from_libhccl_on_the_library_path(tmp_path):
    (tmp_path / "libhccl.so").write_bytes(b"")
    env = {"LD_LIBRARY_PATH": f"/nonexistent:{tmp_path}"}
    assert cann.cann_location(env, use_ld_cache=False) == str(tmp_path / "libhccl.so")
    assert cann.cann_location({"LD_LIBRARY_PATH": "/nonexistent"}, use_ld_cache=False) is None


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="torch_npu is installed here")
def test_autoload_guard_leaves_machines_without_torch_npu_alone():
    # The case with torch_npu installed is test_torch_npu_without_cann.py, against the real package.
    env: dict[str, str] = {}
    assert cann.guard_torch_npu_autoload(env) is None and env == {}


def test_docs_table_of_distributed_backends_matches_the_code():
    doc = (Path(__file__).parents[2] / "docs" / "backend.md").read_text()
    table = doc.split("<!-- dist-backends:start -->")[1].split("<!-- dist-backends:end -->")[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.strip().splitlines()[2:]]
    documented = {(framework, device): tuple(b.strip() for b in backends.split(","))
                  for framework, device, backends in rows}
    in_code = {(framework, device): working for framework, devices in checks.WORKING_DIST_BACKENDS.items()
               for device, working in devices.items()}
    assert documented == in_code
