"""The pipeline's greedy tokens for each json against transformers' thinker `generate` on the same inputs."""
import json
import sys

import numpy as np
import torch
import transformers

from mmrun.data.multimodal.vlm_prompt import open_image
from mmrun.models.inference_vlm import Qwen2VlPipeline

transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()
for path in sys.argv[1:]:
    raw = json.loads(open(path).read())
    pipeline = Qwen2VlPipeline(raw, path, None, seed=0, quiet=True)
    images = [open_image(raw["image_path"], "image")] if raw.get("image_path") else []
    media = ([raw["video_path"]] if raw.get("video_path") else [], [raw["audio_path"]] if raw.get("audio_path") else [])
    prompt = pipeline.prompt(raw["prompts"], images, *media)
    ours = pipeline.answer(raw["prompts"], images, None, *media)[0]
    thinker = transformers.Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(raw["tokenizer"]["from_pretrained"])
    inputs = {{"second_per_grid_ts": "video_second_per_grid"}.get(k, k): torch.from_numpy(np.asarray(v))
              for k, v in vars(prompt).items() if isinstance(v, np.ndarray)}
    theirs = thinker.generate(**inputs, attention_mask=torch.ones_like(inputs["input_ids"]), max_new_tokens=len(ours),
                              do_sample=False, use_audio_in_video=prompt.use_audio_in_video)
    theirs = theirs[0, prompt.input_ids.shape[1]:].tolist()
    print(f"{path}: mmrun {ours}\n{' ' * len(path)}  transformers {theirs}: equal {ours == theirs}")
