"""Device detection and single-process behaviour on this CPU machine, for both frameworks.

Each case runs in a fresh interpreter: the framework and the device are fixed once per process.
"""
from __future__ import annotations

TORCH_SINGLE = """
import json, warnings
warnings.simplefilter("always")
import torch
import mmrun.backend as backend
info = backend.current()
d = backend.distributed
x = torch.tensor([1, 2, 3])
out = {
    "info": info.__dict__, "torch_version": torch.__version__,
    "default_device": str(backend.device.default_device()),
    "sum": d.all_reduce(x).tolist(), "mean": d.all_reduce(x, op="mean").tolist(),
    "mean_dtype": str(d.all_reduce(x, op="mean").dtype), "broadcast": d.broadcast(x, src=0).tolist(),
    "gathered": d.all_gather_object({"a": 1}), "input_after": x.tolist(),
}
d.barrier()
same_tensor_back = d.all_reduce(x) is x
backend.init_distributed("nccl", single_process_group=True)
out["group"] = [torch.distributed.is_initialized(), torch.distributed.get_backend(), d.get_world_size()]
out["group_sum"] = d.all_reduce(torch.tensor([2.0])).tolist()
out["group_gathered"] = d.all_gather_object(["x", 1])
out["same_tensor_back"] = same_tensor_back
out["lazy"] = [backend.device.__name__, backend.seeding.__name__]
try:
    backend.no_such_module
except AttributeError as exc:
    out["unknown_attribute"] = str(exc)
d.destroy_distributed()
print(json.dumps(out))
"""


def test_torch_on_cpu(run_python, clean_env, last_json):
    proc = run_python(TORCH_SINGLE, env=clean_env(MMRUN_TRANSFER_TO_NPU="1"))
    out = last_json(proc)
    assert out["info"] == {"framework": "pytorch", "version": out["torch_version"], "device_kind": "cpu",
                           "device_index": 0, "dist_backend": "gloo", "rank": 0, "local_rank": 0, "world_size": 1}
    assert out["default_device"] == "cpu"
    assert out["lazy"] == ["mmrun.backend.torch.device", "mmrun.backend.torch.seeding"]
    assert out["unknown_attribute"] == "module 'mmrun.backend' has no attribute 'no_such_module'"
    # One process: collectives are the identity, return new tensors, leave the input alone.
    assert out["sum"] == [1, 2, 3] and out["broadcast"] == [1, 2, 3] and out["input_after"] == [1, 2, 3]
    assert out["mean"] == [1.0, 2.0, 3.0] and out["mean_dtype"] == "torch.float32"
    assert out["gathered"] == [{"a": 1}] and out["same_tensor_back"] is False
    # A one-rank group on request (megatron-core needs one), with nccl replaced by gloo on CPU.
    assert out["group"] == [True, "gloo", 1] and out["group_sum"] == [2.0] and out["group_gathered"] == [["x", 1]]
    assert "MMRUN_TRANSFER_TO_NPU=1 is ignored: this process runs on cpu, not on an NPU" in proc.stderr
    assert "--distributed-backend nccl does not work with pytorch on cpu; using gloo instead" in proc.stderr


def test_torch_collective_before_init_in_a_multi_process_job(run_python, clean_env):
    code = """
import torch, mmrun.backend as backend
print(backend.current().rank, backend.current().world_size)
backend.distributed.all_reduce(torch.ones(1))
"""
    proc = run_python(code, env=clean_env(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1"))
    assert proc.returncode != 0 and proc.stdout.split() == ["1", "2"]
    assert ("DistributedNotInitializedError: a collective was called on rank 1 of 2 before the process group "
            "exists; call mmrun.backend.init_distributed() first") in proc.stderr


MINDSPORE_SINGLE = """
import json
import mindspore, numpy as np
import mmrun.backend as backend
info = backend.current()
d = backend.distributed
x = mindspore.Tensor(np.array([1, 2, 3], dtype=np.int32))
backend.init_distributed()  # one process: must not call communication.init() (it raises without msrun)
d.barrier()
print(json.dumps({
    "info": info.__dict__, "ms_version": mindspore.__version__,
    "pynative": mindspore.get_context("mode") == mindspore.PYNATIVE_MODE,
    "target": mindspore.get_context("device_target"), "default_device": backend.device.default_device(),
    "sum": d.all_reduce(x).asnumpy().tolist(), "mean": d.all_reduce(x, op="mean").asnumpy().tolist(),
    "mean_float": d.all_reduce(x, op="mean").dtype == mindspore.float32,
    "broadcast": d.broadcast(x).asnumpy().tolist(), "gathered": d.all_gather_object({"a": [1]}),
    "input_after": x.asnumpy().tolist(), "initialized": d.is_initialized(),
}))
"""


def test_mindspore_on_cpu(run_python, clean_env, last_json):
    proc = run_python(MINDSPORE_SINGLE, env=clean_env(MMRUN_AI_FRAMEWORK="mindspore"))
    out = last_json(proc)
    assert out["info"] == {"framework": "mindspore", "version": out["ms_version"], "device_kind": "cpu",
                           "device_index": 0, "dist_backend": "mccl", "rank": 0, "local_rank": 0, "world_size": 1}
    assert out["pynative"] and out["target"] == "CPU" and out["default_device"] == "CPU"
    assert out["sum"] == [1, 2, 3] and out["broadcast"] == [1, 2, 3] and out["input_after"] == [1, 2, 3]
    assert out["mean"] == [1.0, 2.0, 3.0] and out["mean_float"]
    assert out["gathered"] == [{"a": [1]}] and out["initialized"] is False
    # Detection looks for CANN and a GPU driver before asking MindSpore, whose probe warns on CPU machines.
    assert "is not available" not in proc.stderr


FORCED_DEVICE = """
import json, os
import mmrun.backend as backend
from mmrun.backend.errors import UsageError
out = {}
for value in ("tpu", "Ascend", "cpu"):
    os.environ["MMRUN_MS_DEVICE"] = value
    try:
        out[value] = backend.current().device_kind
    except UsageError as exc:
        out[value] = str(exc)
print(json.dumps(out))
"""


def test_mindspore_device_forced_by_environment(run_python, clean_env, last_json):
    # One interpreter for three values: a failed package import is retried on the next load().
    out = last_json(run_python(FORCED_DEVICE, env=clean_env(MMRUN_AI_FRAMEWORK="mindspore")))
    assert out["tpu"] == "MMRUN_MS_DEVICE must be one of Ascend, GPU, CPU. Received: MMRUN_MS_DEVICE='tpu'"
    assert out["Ascend"].startswith("MMRUN_MS_DEVICE=Ascend but this MindSpore cannot use Ascend here")
    assert out["cpu"] == "cpu"
