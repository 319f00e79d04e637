"""An Omni inference json and its files: omni_job.py's tokenizer and processor (tests/training/omni_job.py), a random
thinker of scripts/qwen2_5omni/model_tiny.json's sizes saved beside them, a picture, a tone and a 2.5 s video with
its own sound; the json is the Qwen2.5-VL inference json's keys with Omni's model.json sections."""
import json
from pathlib import Path

import numpy as np
import torch
import transformers
from PIL import Image

import omni_job
from mmrun.models.qwen2_5_omni import model_json

transformers.utils.logging.disable_progress_bar()
files = Path("scripts/qwen2_5omni")
paths = omni_job.make_job(Path("job"), samples=1, files=files)
raw = json.loads((files / "model_tiny.json").read_text())
torch.manual_seed(0)
config = transformers.Qwen2_5OmniThinkerConfig(**model_json.parse_model_json(raw).hf_config)
thinker = transformers.Qwen2_5OmniThinkerForConditionalGeneration(config)
with torch.no_grad():
    for param in thinker.parameters():
        param.add_(0.05 * torch.randn_like(param))
thinker.save_pretrained(paths["model_dir"])
Image.fromarray(np.random.default_rng(1).integers(0, 255, (60, 80, 3), dtype=np.uint8)).save("picture.png")
omni_job.write_video_with_sound(Path("clip.mp4"), seconds=2.5)
inference = {k: v for k, v in raw.items() if k != "model_id"}
inference.update(pipeline_class="Qwen2VlPipeline", tokenizer={"from_pretrained": str(paths["model_dir"])},
                 generation_config={"max_new_tokens": 8, "do_sample": False}, dtype="fp32",
                 prompts="What do you hear and see?", image_path="picture.png", audio_path="job/data/audio/0.wav")
Path("omni_image_audio.json").write_text(json.dumps(inference, indent=1))
video = {k: v for k, v in inference.items() if k not in ("image_path", "audio_path")}
video.update(prompts="What happens?", video_path="clip.mp4", use_audio_in_video=True)
Path("omni_video.json").write_text(json.dumps(video, indent=1))
print(f"job/model: {sum(p.numel() for p in thinker.parameters())} parameters, tokenizer, processor; "
      "omni_image_audio.json, omni_video.json")
