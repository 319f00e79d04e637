"""`--load` takes what `mmrun convert` writes: a Hugging Face directory converted to (TP=2, PP=2) in MindSpeed-MM's
names trains on from exactly its weights: in the one-process run on PyTorch and on MindSpore (joined through
mm_layout), and at TP=2 on megatron-core (split again for each rank).

The Hugging Face weights are the one-process run's own initial weights (mm_layout.initial_value, seed 42): the
first loss of a run that loads their conversion must equal the first loss of `vlm("pytorch")`, which starts from
them and equals transformers' model (tests/training/test_pretrain_vlm.py). Any misplaced row of a fused QKV, a
gate/up half or a shard would change it."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mmrun.checkpoint.convert_cli import main
from mmrun.models.qwen2_vl import hf_checkpoint
from mmrun.models.vlm import mm_layout
from mmrun.models.qwen2_vl.configuration import Qwen2VLConfig
from mmrun.models.vlm.model_json import read_model_json

from .conftest import MODEL_JSON

TOLERANCE = 1e-5
TP2 = ["--tensor-model-parallel-size", "2"]


@pytest.fixture(scope="module")
def converted(tmp_path_factory, vlm):
    """The seed-42 initial weights as a Hugging Face directory (with the demo's tokenizer), converted to
    (TP=2, PP=2) with the guides' command line."""
    root = tmp_path_factory.mktemp("convert-load")
    config = Qwen2VLConfig.from_hf_config(read_model_json(MODEL_JSON).hf_config)
    std = 0.02  # Megatron's --init-method-std default, which the runs use
    shapes = mm_layout.hf_shapes(config)
    arrays = {name: mm_layout.initial_value(name, shape, 42, std) for name, shape in shapes.items()}
    hf = hf_checkpoint.save_hf_directory(root / "hf", config, arrays, copy_files_from=vlm.model_dir)
    assert main(["Qwen2VLConverter", "hf_to_mm", "--cfg.mm_dir", str(root / "mm"), "--cfg.hf_config.hf_dir", str(hf),
                 "--cfg.parallel_config.llm_pp_layers", "[[1,1]]", "--cfg.parallel_config.vit_pp_layers", "[[2,0]]",
                 "--cfg.parallel_config.tp_size", "2"]) == 0
    return root / "mm"


def _first_loss(vlm, tk, name: str, framework: str, processes: int, extra: list[str], converted: Path) -> float:
    out = vlm.base_dir / name
    shutil.rmtree(out, ignore_errors=True)
    run = tk.run_training(out, [*vlm.args, "--mm-data", vlm.data_json, "--load", str(converted), "--finetune",
                                "--exit-interval", "1", *extra], framework=framework, nproc=processes, timeout=600,
                          entry=vlm.entry)
    assert run.returncode == 0, run.output[-4000:]
    assert "joining its shards and splitting them again" in run.output, run.output[-3000:]
    return run.losses()[1]


@pytest.mark.slow
@pytest.mark.parametrize("framework, processes, extra", [("pytorch", 1, []), ("mindspore", 1, []),
                                                          ("pytorch", 2, TP2)],
                         ids=["pytorch-one-process", "mindspore-one-process", "pytorch-tp2"])
def test_a_tp2_pp2_conversion_trains_on_from_its_weights(vlm, tk, converted, framework, processes, extra):
    expected = vlm("pytorch").losses()[1]
    loss = _first_loss(vlm, tk, f"load-converted-{framework}-{processes}", framework, processes, extra, converted)
    assert abs(loss - expected) <= TOLERANCE, (loss, expected)
