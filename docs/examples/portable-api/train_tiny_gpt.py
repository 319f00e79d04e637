import numpy as np

from mmrun import backend
from mmrun.backend import checkpoint_io, optim, tensors, train_step
from mmrun.backend.lr_schedule import LRSchedule
from mmrun.models.gpt import GPT, GPTConfig, gpt_loss

backend.seeding.seed_everything(1234)
config = GPTConfig(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=128,
                   max_position_embeddings=32, seq_length=32, hidden_dropout=0.0, attention_dropout=0.0)
model = GPT(config)
optimizer = optim.AdamW(model.named_parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1,
                        no_decay=optim.megatron_no_decay)
schedule = LRSchedule.from_iterations(lr=1e-3, min_lr=1e-4, train_iters=10, lr_warmup_iters=2,
                                      lr_decay_style="cosine")
step = train_step.TrainStep(model, optimizer, loss_fn=gpt_loss, lr_scheduler=schedule, clip_grad=1.0)

rng = np.random.default_rng(0)
for iteration in range(1, 11):
    series = (rng.integers(0, 128, (4, 1)) + np.arange(33)) % 128   # learnable: count upwards
    batch = (tensors.from_numpy(series[:, :-1]), tensors.from_numpy(series[:, 1:]),
             tensors.from_numpy(np.ones((4, 32), np.float32)))
    result = step([batch])  # one micro-batch
    print(f"iteration {iteration:2d} | lr {result.lr:.3e} | loss {result.loss:.4f} | grad norm {result.grad_norm:.3f}")

state = optimizer.state_dict()
path = checkpoint_io.save_checkpoint(
    "ckpt/iter_0000010", model=tensors.state_dict_to_numpy(model.state_dict()),
    optimizer={**state, "tensors": tensors.state_dict_to_numpy(state["tensors"])},
    meta={"iteration": 10, "lr_scheduler": schedule.state_dict()})
print(f"{backend.framework()}: saved {sorted(p.name for p in path.iterdir())}")
