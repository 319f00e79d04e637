"""mmrun.data imports no framework: the samples are the same bytes under PyTorch and MindSpore."""
from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
import mmrun.data.corpus, mmrun.data.gpt_dataset, mmrun.data.indexed_dataset
import mmrun.data.preprocess, mmrun.data.samplers, mmrun.data.tokenizers
from mmrun.data.gpt_dataset import build_train_valid_test_datasets
from mmrun.data.samplers import build_pretraining_data_loader
from mmrun.data.tokenizers import build_tokenizer
train = build_train_valid_test_datasets(None, "1", 256, 1, (8, 0, 0), tokenizer=build_tokenizer("NullTokenizer", vocab_size=64), mock=True)[0]
next(iter(build_pretraining_data_loader(train, 0, 2)))
loaded = sorted(m for m in ("torch", "mindspore", "torch_npu", "megatron", "tokenizers") if m in sys.modules)
print(",".join(loaded))
"""


def test_data_modules_load_no_framework():
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""  # not even `tokenizers` when only NullTokenizer is used


MULTIMODAL_CODE = """
import sys, json
from mmrun.data import workers
from mmrun.data.multimodal import collate, data_config, demo, image_processing, llava, mllm_dataset
from mmrun.data.multimodal import rope_index, templates
paths = demo.make_demo(sys.argv[1], num_samples=4)
with open(paths["data_json"]) as f:
    dataset = mllm_dataset.MultimodalDataset(json.load(f)["dataset_param"], 128)
next(iter(workers.build_dataloader(dataset, [[0, 1]], dataset.collate_fn)))
loaded = sorted(m for m in ("torch", "mindspore", "torch_npu", "megatron", "transformers") if m in sys.modules)
print(",".join(loaded))
"""


def test_multimodal_modules_load_no_framework(tmp_path):
    done = subprocess.run([sys.executable, "-c", MULTIMODAL_CODE, str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""  # PIL, numpy and tokenizers only
