"""mmrun's Qwen2.5-Omni thinker, loaded from transformers' directory, on this process's framework, against
transformers: logits at real tokens, the loss and every parameter's gradient."""
import numpy as np

from mmrun import backend
from mmrun.backend import autograd, tensors
from mmrun.models.qwen2_5_omni import from_pretrained

model = from_pretrained("tiny-omni-thinker")
reference = dict(np.load("reference.npz"))
names, params = zip(*model.named_parameters())
for batch in ("audio_batch", "video_audio_batch"):
    fields = {k.split("/", 1)[1]: v for k, v in reference.items()
              if k.startswith(batch + "/") and k.count("/") == 1 and not k.endswith(("/logits", "/loss"))}
    inputs = {k: bool(v) if k == "use_audio_in_video" else tensors.from_numpy(v) for k, v in fields.items()}
    (loss, logits), grads = autograd.value_and_grad(
        lambda: (lambda out: (out["loss_dict"]["loss"], out["logits"]))(model(**inputs)), list(params),
        has_aux=True)()
    real = fields["attention_mask"] == 1
    logit_error = np.abs(tensors.to_numpy(logits)[real] - reference[f"{batch}/logits"][real]).max()
    grad_error = max(np.abs(tensors.to_numpy(g) - reference[f"{batch}/grad/{n}"]).max() for n, g in zip(names, grads))
    print(f"{backend.framework()} {batch}: loss {float(tensors.to_numpy(loss)):.6f} (transformers "
          f"{float(reference[batch + '/loss']):.6f}); logits < 1e-5: {logit_error < 1e-5}; "
          f"{len(names)} gradients < 1e-5: {grad_error < 1e-5}")
