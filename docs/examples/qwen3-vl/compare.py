"""mmrun's Qwen3-VL, loaded from transformers' directory, on this process's framework, against transformers."""
import numpy as np

from mmrun import backend
from mmrun.backend import autograd, tensors
from mmrun.models.qwen3_vl import from_pretrained

model = from_pretrained("tiny-qwen3-vl")
reference = dict(np.load("reference.npz"))
keys = ("input_ids", "attention_mask", "labels", "pixel_values", "image_grid_thw")
inputs = {k: tensors.from_numpy(reference[k]) for k in keys}
names, params = zip(*model.named_parameters())
(loss, logits), grads = autograd.value_and_grad(
    lambda: (lambda out: (out["loss_dict"]["loss"], out["logits"]))(model(**inputs)), list(params), has_aux=True)()
logit_error = np.abs(tensors.to_numpy(logits) - reference["logits"]).max()
grad_error = max(np.abs(tensors.to_numpy(g).reshape(reference[f"grad/{n}"].shape) - reference[f"grad/{n}"]).max()
                 for n, g in zip(names, grads))
print(f"{backend.framework()}: {len(names)} parameters, loss {float(tensors.to_numpy(loss)):.6f} "
      f"(transformers {float(reference['loss']):.6f})")
print(f"max |logits - transformers'| < 1e-5: {logit_error < 1e-5}; max |gradient - transformers'| < 1e-5: "
      f"{grad_error < 1e-5}")
