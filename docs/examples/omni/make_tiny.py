"""A tiny random transformers Qwen2.5-Omni thinker (tiny_omni.py: tests/models/tiny_omni.py), saved, and its
logits, loss and gradients on two batches: audio alone, and a video with its sound track interleaved."""
import numpy as np
import transformers

import tiny_omni

transformers.utils.logging.disable_progress_bar()
model = tiny_omni.hf_model()
model.save_pretrained("tiny-omni-thinker")
arrays = {}
for name in ("audio_batch", "video_audio_batch"):
    batch = getattr(tiny_omni, name)()
    reference = tiny_omni.hf_forward_backward(model, batch)
    arrays.update({f"{name}/{k}": v for k, v in batch.items()})
    arrays.update({f"{name}/logits": reference["logits"], f"{name}/loss": reference["loss"]})
    arrays.update({f"{name}/grad/{k}": v for k, v in reference["grads"].items()})
    print(f"{name}: loss {float(reference['loss']):.6f}")
np.savez("reference.npz", **arrays)
print(f"transformers {transformers.__version__}: saved tiny-omni-thinker/")
