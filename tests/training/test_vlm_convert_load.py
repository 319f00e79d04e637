"""`--load` takes what `mmrun convert` writes: a Hugging Face directory converted to (TP=2, PP=2) in MindSpeed-MM's
names trains on from exactly its weights, in the one-process run (joined through mm_layout) and, once the
parallel VLM engines are there, at TP=2 on PyTorch and MindSpore (split again for each rank).

The Hugging Face weights are the one-process run's own initial weights (mm_layout.initial_value, seed 42): the
first loss of a run that loads their conversion must equal the first loss of `vlm("pytorch")`, which starts from
them and equals transformers' model (tests/training/test_pretrain_vlm.py). Any misplaced row of a fused QKV, a
gate/up half or a shard would change it."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from mmrun.models.convert_cli import main
from mmrun.models.qwen2_vl import hf_checkpoint, mm_layout
from mmrun.models.qwen2_vl.configuration import Qwen2VLConfig
from mmrun.models.qwen2_vl.model_json import read_model_json

from .conftest import MODEL_JSON

TOLERANCE = 1e-5
# What a run prints when no parallel VLM engine takes the layout (the engines land in their own sessions).
NO_ENGINE = "trains with data parallelism only"
TP2 = ["--tensor-model-parallel-size", "2"]


def _parallel_engine_missing(framework: str) -> bool:
    """The entry's own answer, without starting a run: its model source says data parallelism only."""
    from mmrun.models import pretrain_vlm

    source = pretrain_vlm._model_source(["--ai-framework", framework, *TP2, "--mm-model", str(MODEL_JSON)])
    return getattr(source, "data_parallel_only", False)


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
    if run.returncode != 0 and NO_ENGINE in run.output and extra:
        pytest.skip(f"no parallel VLM engine on {framework} yet: {run.output.strip().splitlines()[-1][:200]}")
    assert run.returncode == 0, run.output[-4000:]
    assert "joining its shards and splitting them again" in run.output, run.output[-3000:]
    return run.losses()[1]


@pytest.mark.slow
def test_the_one_process_run_loads_a_tp2_pp2_conversion(vlm, tk, converted):
    expected = vlm("pytorch").losses()[1]
    loss = _first_loss(vlm, tk, "load-converted", "pytorch", 1, [], converted)
    assert abs(loss - expected) <= TOLERANCE, (loss, expected)


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["pytorch", "mindspore"])
def test_tp2_engines_load_a_tp2_pp2_conversion(vlm, tk, converted, framework):
    if _parallel_engine_missing(framework):
        pytest.skip("no parallel VLM engine yet: models/pretrain_vlm.py trains with data parallelism only "
                    "(the vlmpt/vlmms engines make this test run)")
    expected = vlm("pytorch").losses()[1]
    loss = _first_loss(vlm, tk, f"load-converted-tp2-{framework}", framework, 2, TP2, converted)
    assert abs(loss - expected) <= TOLERANCE, (loss, expected)
    assert np.isfinite(loss)
