import numpy as np

from mmrun import backend
from mmrun.backend import checkpoint_io, tensors
from mmrun.models.gpt import GPT, GPTConfig, gpt_loss

ckpt = checkpoint_io.load_checkpoint("ckpt/iter_0000010")
model = GPT(GPTConfig(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=128,
                      max_position_embeddings=32, seq_length=32, hidden_dropout=0.0, attention_dropout=0.0))
model.load_state_dict(tensors.state_dict_from_numpy(ckpt.model))
series = (np.arange(4)[:, None] * 7 + np.arange(33)) % 128
with backend.autograd.no_grad():
    loss = gpt_loss(model, tensors.from_numpy(series[:, :-1]), tensors.from_numpy(series[:, 1:]),
                    tensors.from_numpy(np.ones((4, 32), np.float32)))
print(f"{backend.framework()}: iteration {ckpt.meta['iteration']}, loss on a fixed batch {float(tensors.to_numpy(loss)):.6f}")
