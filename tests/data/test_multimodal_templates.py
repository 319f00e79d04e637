"""The qwen2vl template: labels on assistant turns, MindSpeed-MM's truncation, placeholder expansion = Qwen2VLProcessor."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from PIL import Image

from mmrun.data.multimodal.demo import build_tokenizer_json
from mmrun.data.multimodal.image_processing import ImageProcessorConfig, preprocess_images
from mmrun.data.multimodal.templates import (IGNORE_INDEX, QWEN2VL, encode_conversation, expand_placeholders,
                                             infer_seqlen)
from mmrun.data.tokenizers import HuggingFaceTokenizer

TEXTS = ["hello there, how are you?", "fine thanks and you", "a red circle on a white plate", "what is this"]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    path.write_text(build_tokenizer_json(TEXTS * 3))
    return str(path)


@pytest.fixture(scope="module")
def tokenizer(tokenizer_file):
    return HuggingFaceTokenizer(tokenizer_file)


def _turns(*contents):
    roles = ("user", "assistant")
    return [{"role": roles[i % 2], "content": c} for i, c in enumerate(contents)]


def test_labels_only_on_assistant_turns(tokenizer):
    messages = _turns("hello there", "fine thanks", "what is this", "a red circle")
    ids, labels = encode_conversation(tokenizer, messages, QWEN2VL, cutoff_len=1000)
    text = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhello there<|im_end|>\n"
            "<|im_start|>assistant\nfine thanks<|im_end|>\n<|im_start|>user\nwhat is this<|im_end|>\n"
            "<|im_start|>assistant\na red circle<|im_end|>\n")
    assert tokenizer.detokenize(ids) == text
    trained = [[i for i, l in zip(ids, labels) if l != IGNORE_INDEX]]
    assert tokenizer.detokenize(trained[0]) == "fine thanks<|im_end|>\na red circle<|im_end|>\n"
    assert len(ids) == len(labels)
    # train_on_prompt: everything is a label; mask_history: only the last answer
    _, all_labels = encode_conversation(tokenizer, messages, QWEN2VL, 1000, train_on_prompt=True)
    assert all_labels == ids
    ids_h, labels_h = encode_conversation(tokenizer, messages, QWEN2VL, 1000, mask_history=True)
    assert ids_h == ids
    assert tokenizer.detokenize([i for i, l in zip(ids_h, labels_h) if l != IGNORE_INDEX]) == "a red circle<|im_end|>\n"
    # a system prompt of the sample replaces the default
    custom, _ = encode_conversation(tokenizer, messages[:2], QWEN2VL, 1000, system="be brief")
    assert tokenizer.detokenize(custom).startswith("<|im_start|>system\nbe brief<|im_end|>\n")


def test_truncation_as_llama_factory(tokenizer):
    assert infer_seqlen(10, 3, 8) == (5, 3)  # short answer kept whole, prompt cut
    assert infer_seqlen(3, 10, 8) == (3, 5)  # short prompt kept, answer cut
    assert infer_seqlen(10, 10, 8) == (4, 4)  # shared in proportion
    messages = _turns("hello there how are you", "fine thanks and you", "what is this", "a red circle")
    full, _ = encode_conversation(tokenizer, messages, QWEN2VL, 1000)
    first_pair, _ = encode_conversation(tokenizer, messages[:2], QWEN2VL, 1000)
    ids, labels = encode_conversation(tokenizer, messages, QWEN2VL, len(first_pair))
    assert ids == first_pair and len(ids) < len(full)  # the second pair has no room left
    ids, _ = encode_conversation(tokenizer, messages, QWEN2VL, len(first_pair), mask_history=True)
    assert ids[-3:] == full[-3:]  # mask_history keeps the last turn first


def test_expansion_equals_qwen2vl_processor(tokenizer, tokenizer_file):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformers import PreTrainedTokenizerFast
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
        from transformers.models.qwen2_vl.processing_qwen2_vl import Qwen2VLProcessor

    class ImageOnlyProcessor(Qwen2VLProcessor):  # transformers' video processor needs torchvision
        @classmethod
        def get_attributes(cls):
            return ["image_processor", "tokenizer"]

    processor = ImageOnlyProcessor(image_processor=Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=28 * 28 * 64),
                                   tokenizer=PreTrainedTokenizerFast(tokenizer_file=tokenizer_file))
    images = [Image.new("RGB", (150, 90), (200, 10, 10)), Image.new("RGB", (60, 60), (0, 0, 255))]
    _, grids = preprocess_images(images, ImageProcessorConfig(min_pixels=3136, max_pixels=28 * 28 * 64))
    counts = [int(np.prod(g)) // 4 for g in grids]
    messages = expand_placeholders(_turns("<image>what is this<image>", "a red circle"), QWEN2VL, counts, [])
    ids, _ = encode_conversation(tokenizer, messages, QWEN2VL, 1000)
    hf_text = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
               "<|vision_start|><|image_pad|><|vision_end|>what is this<|vision_start|><|image_pad|><|vision_end|>"
               "<|im_end|>\n<|im_start|>assistant\na red circle<|im_end|>\n")
    want = processor(text=[hf_text], images=images, return_tensors="np")
    assert ids == want["input_ids"][0].tolist()
    assert counts == [6 * 10 // 4 * 1, 4 * 4 // 4] and grids.tolist() == want["image_grid_thw"].tolist()
