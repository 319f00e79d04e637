"""MindSpeed-MM's Qwen3-VL-30B-A3B job (examples/mindspore/qwen3vl/model_30B.json and finetune_qwen3vl_30B.sh's MoE
flags: tests/training/qwen3_vl_moe_job.py) through models/pretrain_vlm.py, unsplit in one process: the real json
read key by key (the 30B's experts, top-k and gating), the bad expert settings refused in one line, and the tiny
MoE (every key of the json kept) trained on PyTorch and on MindSpore with the same losses."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

from mmrun.backend.errors import UsageError
from mmrun.data.multimodal.demo import make_demo
from mmrun.models.qwen3_vl import model_json
from mmrun.models.qwen3_vl.configuration import Qwen3VLConfig

from .qwen3_vl_moe_job import MODEL_30B, MOE_ARGS, tiny_model_json

ENTRY = Path(__file__).resolve().parents[2] / "models" / "pretrain_vlm.py"
ARGS = ["--micro-batch-size", "1", "--global-batch-size", "2", "--seq-length", "128", "--lr", "2e-3",
        "--lr-decay-style", "constant", "--weight-decay", "0", "--clip-grad", "1.0", "--seed", "42",
        "--log-interval", "1", "--eval-iters", "0", "--train-iters", "2", "--expert-model-parallel-size", "1",
        *MOE_ARGS]


def test_mindspeed_mm_30b_model_json_is_qwen3_vl_30b_a3b():
    spec = model_json.parse_model_json(MODEL_30B, "model_30B.json")
    assert spec.warnings == []  # every key of MindSpeed-MM's file is known
    config = Qwen3VLConfig.from_hf_config(spec.hf_config)
    moe = config.text.moe
    assert config.model_type == "qwen3_vl_moe" and spec.hf_config["architectures"] == ["Qwen3VLMoeForConditionalGeneration"]
    assert (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size) == (128, 8, 768)
    assert moe.norm_topk_prob and moe.router_gating_in_fp32 and not moe.output_router_logits
    assert all(moe.is_sparse(i) for i in range(48)) and config.text.num_hidden_layers == 48
    assert (config.text.hidden_size, config.text.num_key_value_heads, config.text.head_dim) == (2048, 4, 128)
    with pytest.raises(UsageError, match=r"Qwen3-VL MoE \(num_moe_experts\) is built unsplit only"):
        model_json.check_split(spec, "mindspore", split=True)
    assert model_json.check_experts(spec, "1", ["--moe-grouped-gemm", "--moe_permutation_async_comm"]) == [
        "--moe-grouped-gemm, --moe-permutation-async-comm: speed flags of Megatron's MoE layer; mmrun's Qwen3-VL MoE "
        "runs each expert on its gathered tokens instead (the same numbers)"]
    with pytest.raises(UsageError, match=r"^--expert-model-parallel-size 3 does not divide model_30B.json's "
                                         r"num_moe_experts 128; pass a divisor"):
        model_json.check_experts(spec, "3", [])
    with pytest.raises(UsageError, match=r"^--expert-model-parallel-size 2: expert parallelism of Qwen3-VL MoE is not"):
        model_json.check_experts(spec, "2", [])
    raw = copy.deepcopy(MODEL_30B)
    raw["text_decoder"]["moe_router_topk"] = 129
    with pytest.raises(UsageError, match=r"^model_30B.json: num_experts_per_tok \(moe_router_topk\) 129 must be "
                                         r"between 1 and num_experts \(num_moe_experts\) 128"):
        model_json.parse_model_json(raw, "model_30B.json")


@pytest.mark.slow
def test_the_tiny_30b_job_trains_unsplit_with_the_same_losses_on_both_frameworks(tk, tmp_path):
    demo = make_demo(str(tmp_path / "demo"), num_samples=8, seed=7, model="qwen3_vl")
    common = [*ARGS, "--mm-data", demo["data_json"], "--mm-model", str(tiny_model_json(tmp_path / "model_30B.json"))]
    runs = {framework: tk.run_training(tmp_path / framework, common, framework=framework, nproc=None, entry=ENTRY)
            for framework in ("pytorch", "mindspore")}
    for run in runs.values():
        assert run.returncode == 0, run.output[-3000:]
        assert "building qwen3_vl_moe model" in run.output
        assert "notice: --moe-grouped-gemm, --moe-permutation-async-comm: speed flags" in run.output
    torch_losses, ms_losses = runs["pytorch"].losses(), runs["mindspore"].losses()
    assert sorted(torch_losses) == [1, 2] and torch_losses[2] < torch_losses[1]
    assert max(abs(torch_losses[i] - ms_losses[i]) for i in torch_losses) <= 1e-5, (torch_losses, ms_losses)
    bad = tk.run_training(tmp_path / "ep3", [*common, "--expert-model-parallel-size", "3"], nproc=None, entry=ENTRY)
    assert bad.returncode == 2 and "--expert-model-parallel-size 3 does not divide" in bad.output, bad.output[-2000:]
