"""A random Qwen2.5-Omni thinker of model_tiny.json's sizes saved by transformers (the --load of the split example)."""
import json
import sys

import torch
import transformers

from mmrun.models.qwen2_5_omni import model_json

transformers.utils.logging.disable_progress_bar()

path, out = sys.argv[1], sys.argv[2]
raw = json.loads(open(path).read())
torch.manual_seed(0)
config = transformers.Qwen2_5OmniThinkerConfig(**model_json.parse_model_json(raw, path).hf_config)
transformers.Qwen2_5OmniThinkerForConditionalGeneration(config).save_pretrained(out)
print(f"saved {out}/ with transformers {transformers.__version__}")
