"""Qwen3-VL split over pipeline and tensor ranks (models/pretrain_vlm.py): on MindSpore's parallel engine
(engines/mindspore/parallel/qwen3_vlm.py, msrun) and on megatron-core (engines/torch/megatron_core/qwen3_vlm.py,
torchrun), real jobs through `mmrun`, against one one-process PyTorch run.

The tiny model with four decoder layers: stage 0 holds the ViT and decoder layer 0, stage 1 layers 1 to 3. Its
DeepStack indexes [0, 1] feed decoder layers 0 and 1, so the second DeepStack feature crosses the stage boundary
with the hidden states, is added after layer 1 and reaches the text tokens' loss through the later layers' attention
(after the last layer it would touch only vision rows, whose labels are ignored), and its gradient comes back to the
ViT on stage 0 (measured on megatron-core: dropping the carried feature moves iteration 1's loss by 4e-4, detaching
it iteration 2's by 2e-3). Each PP=2 run starts from the one-process run's initial weights converted by `mmrun
convert Qwen3VLMegatronConverter` (MindSpeed-MM's names: one checkpoint for both engines), reads the same
micro-batches and computes the same loss, so each iteration's loss equals the unsplit run's within 1e-5; its saved
shards hold exactly the layout's names and shapes per stage. A megatron-core TP=2 run with sequence parallelism
(QK-norm on each rank's heads) meets the same bar. Every run is 2 processes: on this 2-core machine four MindSpore
ranks (TP=2 x PP=2) sometimes gave up in the gradient norm's all-reduce under load (docs/qwen3-vl.md)."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from safetensors.numpy import load_file

from mmrun.data.multimodal.demo import make_demo

REPO = Path(__file__).resolve().parents[2]
MODEL_JSON = REPO / "scripts" / "qwen3vl" / "model_tiny.json"
ENTRY = REPO / "models" / "pretrain_vlm.py"
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
    from mmrun.checkpoint.convert_cli import main
    from mmrun.models.qwen2_vl import hf_checkpoint
    from mmrun.models.vlm import mm_layout
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


@pytest.fixture(scope="module")
def pp2_job(tk, tmp_path_factory) -> SimpleNamespace:
    """The one-process PyTorch run of the 4-layer model, and its initial weights converted for PP=2."""
    root = tmp_path_factory.mktemp("qwen3_vl_pp2")
    demo = make_demo(str(root / "demo"), num_samples=8, seed=7, model="qwen3_vl")
    one_json, pp2_json = _model_jsons(root)
    common = [*ARGS, "--mm-data", demo["data_json"]]
    one = tk.run_training(root / "one", [*common, "--mm-model", str(one_json)], framework="pytorch", nproc=None,
                          entry=ENTRY)
    assert one.returncode == 0, one.output[-3000:]
    converted = _converted_initial_weights(root, demo, tp=1, model_json=one_json, llm_pp_layers=json.dumps([STAGES]))
    return SimpleNamespace(common=common, one=one, one_json=one_json, pp2_json=pp2_json, converted=converted)


def _assert_one_process_losses(run, job: SimpleNamespace) -> None:
    assert run.returncode == 0, run.output[-3000:]
    expected, losses = job.one.losses(), run.losses()
    assert sorted(losses) == [1, 2] and max(abs(losses[i] - expected[i]) for i in losses) <= TOLERANCE, (losses,
                                                                                                        expected)


def _pp2_run(tk, job: SimpleNamespace, tmp_path: Path, framework: str):
    """The converted checkpoint trained on two pipeline stages: the one-process losses, the layout's shards."""
    from mmrun.models.vlm.mm_layout import VLMLayout
    from mmrun.models.qwen3_vl.configuration import Qwen3VLConfig
    from mmrun.models.qwen3_vl.model_json import parse_model_json

    split = tk.run_training(tmp_path / "split", [*job.common, "--mm-model", str(job.pp2_json), "--load",
                                                 str(job.converted), "--finetune", "--pipeline-model-parallel-size",
                                                 "2", "--save", str(tmp_path / "ckpt"), "--save-interval", "2"],
                            framework=framework, nproc=2, timeout=600, entry=ENTRY)
    _assert_one_process_losses(split, job)
    assert "pipeline-parallel 2" in split.output, split.output[-3000:]
    assert f"successfully loaded weights from {job.converted}" in split.output, split.output[-3000:]
    spec = parse_model_json(json.loads(job.pp2_json.read_text()), str(job.pp2_json))
    layout = VLMLayout.build(Qwen3VLConfig.from_hf_config(spec.hf_config), tp=1, pp=2,
                             vit_pp_layers=spec.pipeline_layers["vit"], llm_pp_layers=spec.pipeline_layers["llm"])
    for pp_rank in range(2):
        shard = load_file(tmp_path / "ckpt" / "iter_0000002" / f"mp_rank_00_{pp_rank:03d}" / "model.safetensors")
        assert {n: t.shape for n, t in shard.items()} == layout.rank_shapes(0, pp_rank)
    assert "text_decoder.decoder.layers.1.self_attention.q_layernorm.weight" in shard  # stage 1's own numbering
    return split


@pytest.mark.slow
def test_a_converted_pp2_checkpoint_trains_on_mindspore_with_the_one_process_losses(tk, pp2_job, tmp_path):
    _pp2_run(tk, pp2_job, tmp_path, "mindspore")


@pytest.mark.slow
def test_pp2_from_a_converted_checkpoint_and_tp2_train_on_megatron_core_with_the_one_process_losses(tk, pp2_job,
                                                                                                   tmp_path):
    split = _pp2_run(tk, pp2_job, tmp_path, "pytorch")
    assert "engine megatron-core" in split.output, split.output[-3000:]
    # TP=2 with sequence parallelism, from the seed's weights: QK-norm on each rank's heads (its gradient summed over
    # TP), the DeepStack rows split over the sequence like the hidden states
    tp = tk.run_training(tmp_path / "tp", [*pp2_job.common, "--mm-model", str(pp2_job.one_json),
                                           "--tensor-model-parallel-size", "2", "--sequence-parallel"],
                         framework="pytorch", nproc=2, timeout=600, entry=ENTRY)
    _assert_one_process_losses(tp, pp2_job)
    assert "engine megatron-core" in tp.output and "tensor-parallel 2" in tp.output, tp.output[-3000:]


@pytest.mark.parametrize("change, message", [
    ({"vpp": True}, r"--virtual-pipeline-model-parallel-size 2 is not built .*set it to 1"),
    ({"text_decoder": {"add_qkv_bias": True}}, r"text_decoder.add_qkv_bias true is not built .*set it to false"),
])
def test_what_megatron_core_does_not_build_for_qwen3_vl_is_one_line(change, message):
    import argparse

    from mmrun.backend.errors import UsageError
    from mmrun.engines.torch.megatron_core.qwen3_vlm import check_qwen3
    from mmrun.models.vlm.mm_layout import VLMLayout
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
