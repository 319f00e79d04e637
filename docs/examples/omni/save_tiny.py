"""A tiny random transformers Qwen2.5-Omni thinker (tiny_omni.py: tests/models/tiny_omni.py) saved in bf16, as a
thinker directory (tiny-omni-thinker/) and as a whole Qwen2.5-Omni as downloaded (tiny-omni/: thinker.* keys and
a talker tensor)."""
import torch
import transformers

import tiny_omni

transformers.utils.logging.disable_progress_bar()
thinker = tiny_omni.hf_model()
tiny_omni.whole_model_dir(thinker, "tiny-omni")
thinker.to(torch.bfloat16).save_pretrained("tiny-omni-thinker")
print(f"saved tiny-omni-thinker/ (bf16) and tiny-omni/ with transformers {transformers.__version__}")
