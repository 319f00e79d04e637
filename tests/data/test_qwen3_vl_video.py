"""Qwen3-VL's per-frame video layout in the data pipeline (data/multimodal): each temporal patch of a video is
`<t seconds>` + its own vision block, as transformers' Qwen3VLProcessor writes it, and the M-RoPE positions are
transformers' Qwen3VLModel.get_rope_index's for those tokens.

transformers' Qwen3VLVideoProcessor needs torchvision, which this environment lacks, so the processor's own
__call__ cannot run here: the timestamps come from its `_calculate_timestamps` (the rule replace_video_token uses)
and the positions from the real model's get_rope_index; the grid is checked against the video's size."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmrun.data.multimodal.demo import make_demo
from mmrun.data.multimodal.mllm_dataset import MultimodalDataset

FPS = 2.0


@pytest.fixture(scope="module")
def video_dataset(tmp_path_factory):
    """The Qwen3-VL demo's tokenizer and processor, one sample: text, a 5-frame 64 x 96 video, text."""
    base = tmp_path_factory.mktemp("qwen3_video")
    demo = make_demo(str(base / "demo"), num_samples=2, seed=3, model="qwen3_vl")
    for i in range(5):
        Image.new("RGB", (96, 64), (50 * i, 20, 255 - 40 * i)).save(base / f"f{i}.png")
    rows = [{"messages": [{"role": "user", "content": "what happens in <video> here"},
                          {"role": "assistant", "content": "colours change"}],
             "videos": [[f"f{i}.png" for i in range(5)]]}]
    (base / "video.json").write_text(json.dumps(rows))
    param = copy.deepcopy(json.loads(open(demo["data_json"], encoding="utf-8").read())["dataset_param"])
    param["basic_parameters"].update(dataset=str(base / "video.json"), dataset_dir=str(base))
    param["preprocess_parameters"].update(video_max_pixels=10 ** 6, video_min_pixels=0, video_fps=FPS)
    param["attr"]["videos"] = "videos"
    return MultimodalDataset(param, seq_length=256)


def test_frames_are_timestamped_vision_blocks_with_transformers_positions(video_dataset):
    import torch
    import transformers
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    dataset = video_dataset
    ids = dataset.token_ids
    sample = dataset[0]
    # 5 frames (the last repeated to 6) of 64 x 96 px, 16-px patches, 2 frames per temporal patch
    assert sample["video_grid_thw"].tolist() == [[3, 4, 6]]
    per_frame = 4 * 6 // 4
    # transformers' timestamps for frames 0..4 sampled at FPS (its rule pads the indices as the frames are padded)
    seconds = Qwen3VLProcessor._calculate_timestamps(None, list(range(5)), FPS, 2)
    expected = "".join(f"<{t:.1f} seconds><|vision_start|>{'<|video_pad|>' * per_frame}<|vision_end|>"
                       for t in seconds)
    text = dataset.tokenizer.detokenize(sample["input_ids"].tolist())
    assert f"what happens in {expected} here" in text, text
    assert int((sample["input_ids"] == ids["video_pad"]).sum()) == 3 * per_frame
    assert int((sample["input_ids"] == ids["vision_start"]).sum()) == 3  # one block per frame, no outer one

    batch = dataset.collate_fn([sample])
    hf = transformers.Qwen3VLConfig(
        text_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=8, vocab_size=dataset.tokenizer.vocab_size + 64,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1],
                                          "mrope_interleaved": True}),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=16,
                           patch_size=16, num_position_embeddings=16, deepstack_visual_indexes=[]),
        image_token_id=ids["image_pad"], video_token_id=ids["video_pad"], vision_start_token_id=ids["vision_start"],
        vision_end_token_id=ids["vision_end"])
    model = transformers.Qwen3VLModel(hf)
    input_ids = torch.from_numpy(batch["input_ids"])
    mm_types = torch.where(input_ids == ids["image_pad"], 1, torch.where(input_ids == ids["video_pad"], 2, 0))
    positions, _ = model.get_rope_index(input_ids, mm_types, video_grid_thw=torch.from_numpy(batch["video_grid_thw"]),
                                        attention_mask=torch.from_numpy(batch["attention_mask"]))
    mask = batch["attention_mask"][0] == 1
    assert np.array_equal(batch["position_ids"][:, 0, mask], positions.numpy()[:, 0, mask])


def test_a_training_step_on_the_video_sample(video_dataset):
    """mmrun's Qwen3-VL takes the collated video batch (positions from the pipeline) and its gradients are finite."""
    from mmrun.backend import autograd, tensors
    from mmrun.models.qwen3_vl.configuration import Qwen3VLConfig
    from mmrun.models.qwen3_vl.modeling import Qwen3VLForConditionalGeneration
    from mmrun.models.vlm.blocks import init_weights
    from mmrun.models.qwen3_vl.model_json import parse_model_json

    raw = json.loads((Path(__file__).resolve().parents[2] / "scripts" / "qwen3vl" / "model_tiny.json").read_text())
    model = Qwen3VLForConditionalGeneration(Qwen3VLConfig.from_hf_config(parse_model_json(raw).hf_config))
    init_weights(model, 0)
    batch = video_dataset.collate_fn([video_dataset[0]])
    inputs = {k: tensors.from_numpy(v) for k, v in batch.items()}
    params = [p for _, p in model.named_parameters()]
    loss, grads = autograd.value_and_grad(lambda: model(**inputs)["loss_dict"]["loss"], params)()
    assert np.isfinite(float(tensors.to_numpy(loss)))
    names = [name for name, _ in model.named_parameters()]
    deepstack = names.index("model.visual.deepstack_merger_list.0.linear_fc2.weight")
    assert np.abs(tensors.to_numpy(grads[deepstack])).sum() > 0  # the video's DeepStack features reached the loss
