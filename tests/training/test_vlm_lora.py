"""LoRA through models/pretrain_vlm.py (MindSpeed-MM's `--lora-target-modules linear_qkv linear_proj linear_fc1
linear_fc2` on Qwen2-VL): from a Hugging Face directory, only the adapters train (the base bit-identical);
`mmrun convert Qwen2VLConverter lora_to_peft` writes an adapter that `peft` loads
onto transformers' Qwen2VLForConditionalGeneration with mmrun's logits, and merge_lora_to_base folds it in.
Bad target names and a TP/PP split on PyTorch are one line, exit 2; on MindSpore a split run (TP2 with sequence
parallelism here) trains the unsplit run's losses within 1e-5 (engines/mindspore/parallel/vlm_lora.py). The runs
are the `vlm` fixture's demo (conftest.py).
PyTorch == MindSpore for LoRA training (losses, adapters) is tests/models/test_qwen2_vl_frameworks.py's lora case:
the entry's MindSpore run costs ~100 s of PyNative on the CPU (measured), too much for one more e2e run here.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mmrun.models import lora
from mmrun.checkpoint.convert_cli import main as convert

LORA = ["--lora-target-modules", "linear_qkv", "linear_proj", "linear_fc1", "linear_fc2", "--lora-r", "4",
        "--lora-alpha", "8", "--train-iters", "3", "--save-interval", "3", "--lr", "1e-2"]
TOLERANCE = 1e-5
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def base(vlm, tmp_path_factory):
    """Random weights for the demo's model.json as a Hugging Face directory, and the LoRA runs from it."""
    from mmrun.models.qwen2_vl import hf_checkpoint
    from mmrun.models.vlm import mm_layout
    from mmrun.models.qwen2_vl.configuration import Qwen2VLConfig
    from mmrun.models.vlm.model_json import read_model_json

    root = tmp_path_factory.mktemp("vlm-lora")
    config = Qwen2VLConfig.from_hf_config(read_model_json(vlm.args[vlm.args.index("--mm-model") + 1]).hf_config)
    rng = np.random.default_rng(3)
    arrays = {n: (0.05 * rng.standard_normal(s)).astype(np.float32) for n, s in mm_layout.hf_shapes(config).items()}
    hf_checkpoint.save_hf_directory(root / "hf", config, arrays)
    vlm.add("lora-pytorch", "pytorch", 1, [*LORA, "--load", str(root / "hf")])
    # MindSpore's parallel engine over two tensor-parallel ranks with sequence parallelism: its first 2 iterations
    # (--exit-interval). Over two pipeline stages (--mm-model scripts/qwen2vl/model_tiny_pp2.json --pipeline-model-parallel-size 2) the same
    # run measured a gap of 1.4e-6 too; it costs ~50 s more, so the suite runs the TP one, the more intricate split
    # (the real 7B LoRA twin runs PP2: test_mindspeed_mm_real_scripts.py).
    vlm.add("lora-ms-tp2-sp", "mindspore", 2, [*LORA, "--load", str(root / "hf"), "--tensor-model-parallel-size",
                                               "2", "--sequence-parallel", "--exit-interval", "2"])
    return root, config, arrays


@pytest.mark.slow
def test_only_adapters_train(vlm, base):
    from mmrun.training.checkpoint_store import find_checkpoint

    _, _, arrays = base
    run = vlm("lora-pytorch")
    assert "LoRA r 4, alpha 8 on 24 layers" in run.output, run.output[-2000:]
    losses = run.losses()
    assert sorted(losses) == [1, 2, 3] and losses[3] < losses[1], losses
    weights, adapter = lora.split_adapter(find_checkpoint(vlm.ckpt("lora-pytorch"), log=lambda m: None).model)
    assert sorted(weights) == sorted(arrays)
    for name, value in arrays.items():  # the base: bit for bit the Hugging Face directory's
        assert value.tobytes() == np.asarray(weights[name], np.float32).tobytes(), name
    b = [v for k, v in adapter.items() if k.endswith(".lora_B.weight")]
    assert len(b) == 24 and all(np.abs(v).max() > 0 for v in b)  # B starts at zero: every adapter moved


@pytest.mark.slow
def test_the_adapter_loads_into_peft_with_mmruns_logits_and_merges(vlm, base, tmp_path, capsys):
    import torch
    from peft import PeftModel
    from transformers import Qwen2VLForConditionalGeneration as HF

    from mmrun.backend import tensors
    from mmrun.models.qwen2_vl.modeling import Qwen2VLForConditionalGeneration
    from mmrun.checkpoint.peft import LORA_TARGETS
    from mmrun.training.checkpoint_store import find_checkpoint

    root, config, _ = base
    vlm("lora-pytorch")
    adapter = tmp_path / "adapter"
    assert convert(["Qwen2VLConverter", "lora_to_peft", "--cfg.source_path", str(vlm.ckpt("lora-pytorch")),
                    "--cfg.target_path", str(adapter)]) == 0
    saved_config = json.loads((adapter / "adapter_config.json").read_text())
    assert saved_config["r"] == 4 and saved_config["lora_alpha"] == 8
    assert "model.language_model.layers.0.self_attn.q_proj" in saved_config["target_modules"]

    ids = np.array([[10, 11, 3] + [5] * 4 + [4, 12, 13, 14, 15]], np.int64)  # text, a 4x4-patch image, text
    pixels = np.random.default_rng(0).standard_normal((16, 1176)).astype(np.float32)
    grid = np.array([[1, 4, 4]], np.int64)
    ours = Qwen2VLForConditionalGeneration(config)
    lora.apply_lora(ours, lora.expand_targets(LORA[1:5], LORA_TARGETS), r=4, alpha=8)
    ours.load_state_dict(tensors.state_dict_from_numpy(find_checkpoint(vlm.ckpt("lora-pytorch"),
                                                                       log=lambda m: None).model))
    ours.eval()
    logits = tensors.to_numpy(ours(input_ids=tensors.from_numpy(ids), pixel_values=tensors.from_numpy(pixels),
                                   image_grid_thw=tensors.from_numpy(grid))["logits"])
    inputs = dict(input_ids=torch.from_numpy(ids), pixel_values=torch.from_numpy(pixels),
                  image_grid_thw=torch.from_numpy(grid),
                  mm_token_type_ids=torch.from_numpy((ids == 5).astype(np.int64)))
    peft = PeftModel.from_pretrained(HF.from_pretrained(str(root / "hf")), str(adapter)).eval()
    with torch.no_grad():
        theirs = peft(**inputs).logits.numpy()
        plain = HF.from_pretrained(str(root / "hf")).eval()(**inputs).logits.numpy()
    assert np.abs(theirs - plain).max() > 1e-3  # the adapter changes the answer ...
    np.testing.assert_allclose(theirs, logits, atol=TOLERANCE, rtol=0)  # ... as mmrun's adapted model does

    merged = tmp_path / "merged"
    assert convert(["Qwen2VLConverter", "merge_lora_to_base", "--cfg.source_path", str(root / "hf"),
                    "--cfg.lora_path", str(adapter), "--cfg.target_path", str(merged)]) == 0
    with torch.no_grad():
        folded = HF.from_pretrained(str(merged)).eval()(**inputs).logits.numpy()
    np.testing.assert_allclose(folded, theirs, atol=TOLERANCE, rtol=0)
    capsys.readouterr()  # mm_to_hf of a LoRA checkpoint says which two commands to run, in one line
    assert convert(["Qwen2VLConverter", "mm_to_hf", "--cfg.save_hf_dir", str(tmp_path / "out"), "--cfg.mm_dir",
                    str(vlm.ckpt("lora-pytorch")), "--cfg.hf_config.hf_dir", str(root / "hf")]) == 2
    err = capsys.readouterr().err
    assert "is a LoRA run's checkpoint" in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_lora_split_over_tensor_parallel_ranks_on_mindspore_trains_the_unsplit_losses(vlm, base, tmp_path,
                                                                                       capsys):
    run = vlm("lora-ms-tp2-sp")
    assert "LoRA r 4, alpha 8 on" in run.output and "layers of this stage" in run.output, run.output[-2000:]
    losses, expected = run.losses(), vlm("lora-pytorch").losses()
    assert sorted(losses) == [1, 2], losses
    gap = max(abs(losses[i] - expected[i]) for i in (1, 2))
    assert gap < TOLERANCE, (losses, expected)
    # its checkpoint holds the adapters in each rank's shard: not exported yet, said in one line
    assert convert(["Qwen2VLConverter", "lora_to_peft", "--cfg.source_path", str(vlm.ckpt("lora-ms-tp2-sp")),
                    "--cfg.target_path", str(tmp_path / "adapter")]) == 2
    assert "is a LoRA run split over tensor/pipeline ranks" in capsys.readouterr().err


@pytest.mark.slow
def test_lora_targets_that_match_nothing_are_one_line(vlm, tk, tmp_path):
    run = tk.run_training(tmp_path / "bad", [*vlm.args, "--mm-data", vlm.data_json, "--train-iters", "3",
                                             "--lora-target-modules", "linear_qkvv"], nproc=None, entry=vlm.entry)
    assert run.returncode == 2, run.output[-2000:]
    errors = [line for line in run.output.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "linear_qkvv match no Linear layer of the model" in errors[0], run.output[-2000:]


@pytest.mark.parametrize("extra, expected", [
    (["--pipeline-model-parallel-size", "2"], "LoRA on Qwen2-VL trains split on mindspore only"),
    (["--mm-model", str(ROOT / "scripts" / "qwen3vl" / "model_tiny.json")], "not yet for Qwen3-VL")])
def test_lora_with_a_pipeline_split_or_on_qwen3_vl_is_refused_in_one_line(vlm, capsys, extra, expected):
    from mmrun.models import pretrain_vlm

    with pytest.raises(SystemExit) as info:
        pretrain_vlm.main([*vlm.args, "--mm-data", vlm.data_json, "--lora-target-modules", "linear_qkv", *extra])
    assert info.value.code == 2
    err = capsys.readouterr()
    lines = [line for line in (err.out + err.err).splitlines() if expected in line]
    assert len(lines) == 1, err
