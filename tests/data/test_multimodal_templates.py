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


# ------------------------------------------------------------------------------------------ Qwen3-VL

QWEN3_USER = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


def test_qwen3_vl_templates_as_mindspeed_mm_defines_them(tokenizer):
    """MindSpeed-MM's template.py: qwen3_vl / qwen3_vl_nothink have no default system prompt, tool results come
    back as a user turn, and qwen3_vl (a ReasoningTemplate, enable_thinking True) trains an answer without a
    thought with an empty `<think>\\n\\n</think>\\n\\n` before it; the nothink one adds nothing."""
    from mmrun.data.multimodal.templates import QWEN3_VL, QWEN3_VL_NOTHINK, TEMPLATES

    assert TEMPLATES["qwen3_vl"] is QWEN3_VL and TEMPLATES["qwen3_vl_nothink"] is QWEN3_VL_NOTHINK
    messages = _turns("hello there", "fine thanks", "what is this", "a red circle")
    trained = lambda ids, labels: tokenizer.detokenize([i for i, l in zip(ids, labels) if l != IGNORE_INDEX])

    ids, labels = encode_conversation(tokenizer, messages, QWEN3_VL_NOTHINK, cutoff_len=1000)
    assert tokenizer.detokenize(ids) == (QWEN3_USER.format("hello there") + "fine thanks<|im_end|>\n"
                                         + QWEN3_USER.format("what is this") + "a red circle<|im_end|>\n")
    assert trained(ids, labels) == "fine thanks<|im_end|>\na red circle<|im_end|>\n"

    ids, labels = encode_conversation(tokenizer, messages, QWEN3_VL, cutoff_len=1000)
    think = "<think>\n\n</think>\n\n"
    assert tokenizer.detokenize(ids) == (QWEN3_USER.format("hello there") + think + "fine thanks<|im_end|>\n"
                                         + QWEN3_USER.format("what is this") + think + "a red circle<|im_end|>\n")
    assert trained(ids, labels) == think + "fine thanks<|im_end|>\n" + think + "a red circle<|im_end|>\n"
    # An answer that has its own thought keeps it and gets no empty one.
    reasoned = _turns("what is this", "<think>\nround and red\n</think>\n\na red circle")
    ids, labels = encode_conversation(tokenizer, reasoned, QWEN3_VL, cutoff_len=1000)
    assert trained(ids, labels) == "<think>\nround and red\n</think>\n\na red circle<|im_end|>\n"
    # enable_thinking False: thoughts removed, the empty thought goes to the prompt, untrained.
    ids, labels = encode_conversation(tokenizer, reasoned, QWEN3_VL, cutoff_len=1000, enable_thinking=False)
    assert tokenizer.detokenize(ids) == QWEN3_USER.format("what is this") + think + "a red circle<|im_end|>\n"
    assert trained(ids, labels) == "a red circle<|im_end|>\n"
    # A system prompt, a tool result, and the same vision expansion as qwen2vl.
    ids, _ = encode_conversation(tokenizer, [{"role": "observation", "content": "42"},
                                             {"role": "assistant", "content": "fine"}], QWEN3_VL_NOTHINK, 1000,
                                 system="be brief")
    assert tokenizer.detokenize(ids) == ("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n<tool_response>"
                                         "\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\nfine<|im_end|>\n")
    expanded = expand_placeholders([{"role": "user", "content": "<image>what"}], QWEN3_VL, [2], [])
    assert expanded[0]["content"] == "<|vision_start|><|image_pad|><|image_pad|><|vision_end|>what"
