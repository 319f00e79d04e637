"""Qwen3-VL split over pipeline stages on MindSpore's parallel engine (models/pretrain_vlm.py,
engines/mindspore/parallel/qwen3_vlm.py): a real msrun job through `mmrun`, against the one-process PyTorch run.

The tiny model with four decoder layers: stage 0 holds the ViT and decoder layer 0, stage 1 layers 1 to 3. Its
DeepStack indexes [0, 1] feed decoder layers 0 and 1, so the second DeepStack feature crosses the stage boundary
with the hidden states, reaches the text tokens' loss through the later layers, and its gradient comes back to the
ViT on stage 0. The split run starts from the one-process run's initial weights written as a Hugging Face directory
and converted by `mmrun convert Qwen3VLMegatronConverter` (--load ... --finetune), reads the same micro-batches and
computes the same loss, so each iteration's loss equals the unsplit run's within 1e-5. Two processes, not TP=2 x
PP=2's four: on a 2-core machine four MindSpore ranks sometimes gave up in the gradient norm's all-reduce under load
(docs/qwen3-vl.md); TP's QK-norm is the attention the Qwen2-VL TP tests run (tests/training/
test_vlm_parallel_mindspore.py), and megatron-core's TP=2 run checks it for Qwen3-VL (test_qwen3_vl_megatron.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.numpy import load_file

from mmrun.data.multimodal.demo import make_demo

REPO = Path(__file__).resolve().parents[2]
MODEL_JSON = REPO / "scripts" / "qwen3vl" / "model_tiny.json"
# one sample per micro-batch: stage 0's last backward (the ViT) stays short, so stage 1 does not wait long in the
# gradient norm's all-reduce (MindSpore's CPU collectives give up on a peer after some 30 s: seen on this loaded
# 2-core machine with two samples per micro-batch)
ARGS = ["--micro-batch-size", "1", "--global-batch-size", "2", "--seq-length", "128", "--lr", "2e-3",
        "--lr-decay-style", "constant", "--weight-decay", "0", "--clip-grad", "1.0", "--seed", "42",
        "--log-interval", "1", "--eval-iters", "0", "--train-iters", "2"]
TOLERANCE = 1e-5


def _converted_initial_weights(tmp_path: Path, demo: dict, tp: int = 2, model_json: Path = MODEL_JSON,
                               llm_pp_layers: str = "[[1,1]]") -> Path:
    """The one-process run's initial weights (--seed 42, std 0.02: mm_layout.initial_value) as a Hugging Face
    directory, converted by `mmrun convert Qwen3VLMegatronConverter hf_to_mm` to the TP=tp x PP=2 split."""
    from mmrun.models.convert_cli import main
    from mmrun.models.qwen2_vl import hf_checkpoint, mm_layout
    from mmrun.models.qwen3_vl.configuration import Qwen3VLConfig
    from mmrun.models.qwen3_vl.model_json import parse_model_json

    spec = parse_model_json(json.loads(model_json.read_text()), str(model_json))
    config = Qwen3VLConfig.from_hf_config(spec.hf_config)
    arrays = {name: mm_layout.initial_value(name, shape, 42, 0.02)
              for name, shape in mm_layout.hf_shapes(config).items()}
    hf_dir = hf_checkpoint.save_hf_directory(tmp_path / "hf-init", config, arrays, dtype="float32")
    assert main(["Qwen3VLMegatronConverter", "hf_to_mm", "--cfg.mm_dir", str(tmp_path / "mm-init"),
                 "--cfg.hf_config.hf_dir", str(hf_dir), "--cfg.parallel_config.tp_size", str(tp),
                 "--cfg.parallel_config.vit_pp_layers", "[[2,0]]",
                 "--cfg.parallel_config.llm_pp_layers", llm_pp_layers]) == 0
    return tmp_path / "mm-init"


STAGES = [1, 3]  # decoder layers per pipeline stage (Megatron's arguments ask for a multiple of the stages)


def _model_jsons(tmp_path: Path) -> tuple[Path, Path]:
    """The tiny model.json with four decoder layers: one stage, and the two-stage split (ViT on stage 0). With two
    layers the carried DeepStack feature would be added after the last layer, on vision rows only, whose labels
    are ignored: the loss could not see it."""
    raw = json.loads(MODEL_JSON.read_text())
    raw["text_decoder"]["num_layers"] = sum(STAGES)
    paths = []
    for name, vit, llm in (("one", [2], [sum(STAGES)]), ("pp2", [2, 0], STAGES)):
        raw["image_encoder"]["vision_encoder"]["pipeline_num_layers"] = vit
        raw["text_decoder"]["pipeline_num_layers"] = llm
        paths.append(tmp_path / f"model_4layers_{name}.json")
        paths[-1].write_text(json.dumps(raw))
    return paths[0], paths[1]


@pytest.mark.slow
def test_a_converted_pp2_checkpoint_trains_on_mindspore_with_the_one_process_losses(tk, tmp_path):
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
                            framework="mindspore", nproc=2, timeout=600, entry=entry)
    assert split.returncode == 0, split.output[-3000:]
    assert "pipeline-parallel 2" in split.output, split.output[-3000:]
    assert f"successfully loaded weights from {converted}" in split.output, split.output[-3000:]
    expected, losses = one.losses(), split.losses()
    assert sorted(losses) == [1, 2] and max(abs(losses[i] - expected[i]) for i in losses) <= TOLERANCE, (losses,
                                                                                                        expected)
    # every pipeline rank's directory holds exactly the layout's tensors for it: MindSpeed-MM's Qwen3-VL names
    spec = parse_model_json(json.loads(pp2_json.read_text()), str(pp2_json))
    layout = VLMLayout.build(Qwen3VLConfig.from_hf_config(spec.hf_config), tp=1, pp=2,
                             vit_pp_layers=spec.pipeline_layers["vit"], llm_pp_layers=spec.pipeline_layers["llm"])
    for pp_rank in range(2):
        shard = load_file(tmp_path / "ckpt" / "iter_0000002" / f"mp_rank_00_{pp_rank:03d}" / "model.safetensors")
        assert {n: t.shape for n, t in shard.items()} == layout.rank_shapes(0, pp_rank)
    assert "text_decoder.decoder.layers.1.self_attention.q_layernorm.weight" in shard
