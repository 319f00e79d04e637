"""Qwen3-VL split over pipeline stages on megatron-core (models/pretrain_vlm.py on PyTorch,
engines/torch/megatron_core/qwen3_vlm.py): a real torchrun job through `mmrun`, against the one-process run.

The tiny model with four decoder layers: stage 0 holds the ViT and decoder layer 0, stage 1 layers 1 to 3. Its
DeepStack indexes [0, 1] feed decoder layers 0 and 1, so the second DeepStack feature crosses the stage boundary
with the hidden states, is added after layer 1 and reaches the text tokens' loss through the later layers' attention
(after the last layer it would touch only vision rows, whose labels are ignored), and its gradient comes back to the
ViT on stage 0 (measured: dropping the carried feature moves iteration 1's loss by 4e-4, detaching it iteration 2's
by 2e-3). The run starts from the one-process run's initial weights converted by `mmrun convert
Qwen3VLMegatronConverter` (MindSpeed-MM's names, the format the MindSpore engine's test loads), reads the same
micro-batches and computes the same loss, so each iteration's loss equals the unsplit run's within 1e-5; its saved
shards hold exactly the layout's names and shapes per stage. A TP=2 run with sequence parallelism (QK-norm on each
rank's heads) meets the same bar; both runs are 2 processes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.numpy import load_file

from mmrun.data.multimodal.demo import make_demo

from tests.training.test_qwen3_vl_parallel import (ARGS, REPO, STAGES, TOLERANCE, _converted_initial_weights,
                                                   _model_jsons)


@pytest.mark.slow
def test_pp2_from_a_converted_checkpoint_and_tp2_train_on_megatron_core_with_the_one_process_losses(tk, tmp_path):
    from mmrun.models.qwen2_vl.mm_layout import VLMLayout
    from mmrun.models.qwen3_vl.configuration import Qwen3VLConfig
    from mmrun.models.qwen3_vl.model_json import parse_model_json

    demo = make_demo(str(tmp_path / "demo"), num_samples=8, seed=7, model="qwen3_vl")
    one_json, pp2_json = _model_jsons(tmp_path)
    common = [*ARGS, "--mm-data", demo["data_json"]]
    entry = REPO / "models" / "pretrain_vlm.py"
    one = tk.run_training(tmp_path / "one", [*common, "--mm-model", str(one_json)], framework="pytorch", nproc=None,
                          entry=entry)
    assert one.returncode == 0, one.output[-3000:]
    converted = _converted_initial_weights(tmp_path, demo, tp=1, model_json=one_json,
                                           llm_pp_layers=json.dumps([STAGES]))
    split = tk.run_training(tmp_path / "split", [*common, "--mm-model", str(pp2_json), "--load", str(converted),
                                                 "--finetune", "--pipeline-model-parallel-size", "2",
                                                 "--save", str(tmp_path / "ckpt"), "--save-interval", "2"],
                            framework="pytorch", nproc=2, timeout=600, entry=entry)
    assert split.returncode == 0, split.output[-3000:]
    assert "engine megatron-core" in split.output and "pipeline-parallel 2" in split.output, split.output[-3000:]
    assert f"successfully loaded weights from {converted}" in split.output, split.output[-3000:]
    expected, losses = one.losses(), split.losses()
    assert sorted(losses) == [1, 2] and max(abs(losses[i] - expected[i]) for i in losses) <= TOLERANCE, (losses,
                                                                                                        expected)
    spec = parse_model_json(json.loads(pp2_json.read_text()), str(pp2_json))
    layout = VLMLayout.build(Qwen3VLConfig.from_hf_config(spec.hf_config), tp=1, pp=2,
                             vit_pp_layers=spec.pipeline_layers["vit"], llm_pp_layers=spec.pipeline_layers["llm"])
    for pp_rank in range(2):
        shard = load_file(tmp_path / "ckpt" / "iter_0000002" / f"mp_rank_00_{pp_rank:03d}" / "model.safetensors")
        assert {n: t.shape for n, t in shard.items()} == layout.rank_shapes(0, pp_rank)
    assert "text_decoder.decoder.layers.1.self_attention.q_layernorm.weight" in shard  # stage 1's own numbering
    # TP=2 with sequence parallelism, from the seed's weights: QK-norm on each rank's heads (its gradient summed over
    # TP), the DeepStack rows split over the sequence like the hidden states
    tp = tk.run_training(tmp_path / "tp", [*common, "--mm-model", str(one_json), "--tensor-model-parallel-size", "2",
                                           "--sequence-parallel"], framework="pytorch", nproc=2, timeout=600,
                         entry=entry)
    assert tp.returncode == 0, tp.output[-3000:]
    assert "engine megatron-core" in tp.output and "tensor-parallel 2" in tp.output, tp.output[-3000:]
    losses = tp.losses()
    assert sorted(losses) == [1, 2] and max(abs(losses[i] - expected[i]) for i in losses) <= TOLERANCE, (losses,
                                                                                                        expected)


@pytest.mark.parametrize("change, message", [
    ({"vpp": True}, r"--virtual-pipeline-model-parallel-size 2 is not built .*set it to 1"),
    ({"text_decoder": {"add_qkv_bias": True}}, r"text_decoder.add_qkv_bias true is not built .*set it to false"),
])
def test_what_megatron_core_does_not_build_for_qwen3_vl_is_one_line(change, message):
    import argparse

    from mmrun.backend.errors import UsageError
    from mmrun.engines.torch.megatron_core.qwen3_vlm import check_qwen3
    from mmrun.models.qwen2_vl.mm_layout import VLMLayout
    from mmrun.models.qwen3_vl.configuration import Qwen3VLConfig
    from mmrun.models.qwen3_vl.model_json import parse_model_json

    raw = json.loads(MODEL_JSON.read_text())
    raw["text_decoder"].update(change.get("text_decoder", {}))
    vpp = change.get("vpp", False)
    raw["text_decoder"]["num_layers"] = 4 if vpp else 2  # one layer per virtual stage
    config = Qwen3VLConfig.from_hf_config(parse_model_json(raw, "model.json").hf_config)
    layout = VLMLayout.build(config, pp=2, vit_pp_layers=[[2, 0], [0, 0]] if vpp else [2, 0],
                             llm_pp_layers=[[1, 1], [1, 1]] if vpp else [1, 1], vpp=2 if vpp else 1)
    with pytest.raises(UsageError, match=message):
        check_qwen3(argparse.Namespace(), layout)
