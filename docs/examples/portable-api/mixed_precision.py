import numpy as np
from mmrun import backend
from mmrun.backend.grad_scaler import DynamicGradScaler
from mmrun.backend.lr_schedule import LRSchedule
from mmrun.models.gpt import GPT, GPTConfig, gpt_loss

backend.seeding.seed_everything(1234)
model = GPT(GPTConfig(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=256,
                      max_position_embeddings=32, seq_length=32, hidden_dropout=0.0, attention_dropout=0.0))
model.to(backend.tensors.dtype("fp16"))               # cast first: AdamW then keeps fp32 main params
optimizer = backend.optim.AdamW(model.named_parameters(), lr=1e-3, weight_decay=0.1,
                                no_decay=backend.optim.megatron_no_decay)
step = backend.train_step.TrainStep(model, optimizer, loss_fn=gpt_loss,
                                    lr_scheduler=LRSchedule.from_iterations(1e-3, 12, lr_warmup_iters=2),
                                    grad_scaler=DynamicGradScaler(initial_scale=2.0 ** 20))
rng = np.random.default_rng(0)
for i in range(12):
    start, stride = rng.integers(0, 256, (4, 1)), rng.integers(1, 4, (4, 1))
    series = (start + stride * np.arange(33)) % 256
    batch = [backend.tensors.from_numpy(a) for a in (series[:, :-1], series[:, 1:], np.ones((4, 32), np.float32))]
    r = step([batch])
    print(f"step {i + 1:2d}  loss {r.loss:.4f}  scale {r.loss_scale:>9g}  "
          f"{'skipped (overflow)' if r.skipped else f'grad norm {r.grad_norm:.3f}'}")
print("model", optimizer.params[0].dtype, "| main params", optimizer.main_params[0].dtype)
