"""Train megatron-core's GPT on MindSpore with tensor, pipeline and data parallelism, on random tokens: the
engine (mmrun.engines.mindspore_gpt_step: engines/mindspore/parallel/gpt.py build_engine) driven directly, as a trainer drives it.

    mmrun --ai-framework mindspore --nproc-per-node 2 models/megatron_gpt_demo.py --tensor-model-parallel-size 2
    mmrun --ai-framework mindspore --nproc-per-node 4 models/megatron_gpt_demo.py \\
        --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --global-batch-size 8

Every rank builds its stage and shard, all ranks of a data-parallel group train on the same micro-batches,
and rank 0 prints one line per iteration. Megatron's flag names (both spellings); the model sizes are a
CPU-sized GPT unless given.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

EXAMPLES = """\
examples:
  mmrun --ai-framework mindspore --nproc-per-node 2 models/megatron_gpt_demo.py --tensor-model-parallel-size 2
  mmrun --ai-framework mindspore --nproc-per-node 2 models/megatron_gpt_demo.py --pipeline-model-parallel-size 2
  mmrun --ai-framework mindspore --nproc-per-node 2 models/megatron_gpt_demo.py --tensor-model-parallel-size 2 \\
      --sequence-parallel --hidden-dropout 0.1 --attention-dropout 0.1

exit status: 0 done, 2 usage error, 1 anything else.
"""

# flag -> (type, default); both --dash-names and --underscore_names are accepted.
FLAGS: dict[str, tuple[type, object]] = {
    "tensor-model-parallel-size": (int, 1), "pipeline-model-parallel-size": (int, 1),
    "num-layers": (int, 4), "hidden-size": (int, 64), "num-attention-heads": (int, 4), "ffn-hidden-size": (int, None),
    "seq-length": (int, 32), "max-position-embeddings": (int, None), "vocab-size": (int, 512),
    "micro-batch-size": (int, 2), "global-batch-size": (int, None), "train-iters": (int, 5),
    "lr": (float, 1e-3), "weight-decay": (float, 0.01), "clip-grad": (float, 1.0), "adam-beta1": (float, 0.9),
    "adam-beta2": (float, 0.999), "adam-eps": (float, 1e-8), "init-method-std": (float, 0.02),
    "hidden-dropout": (float, 0.0), "attention-dropout": (float, 0.0), "norm-epsilon": (float, 1e-5),
    "seed": (int, 1234), "dropout-impl": (str, "auto"),
}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="megatron_gpt_demo.py", description=__doc__, epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, (kind, default) in FLAGS.items():
        parser.add_argument(f"--{flag}", f"--{flag.replace('-', '_')}", type=kind, default=default)
    parser.add_argument("--sequence-parallel", "--sequence_parallel", action="store_true")
    parser.add_argument("--untie-embeddings-and-output-weights", "--untie_embeddings_and_output_weights",
                        action="store_true")
    parser.add_argument("--no-jit", "--no_jit", action="store_true", help="run forward/backward in PyNative")
    parser.add_argument("--ai-framework", "--ai_framework", help=argparse.SUPPRESS)  # mmrun passes it on
    args = parser.parse_args(argv)
    args.max_position_embeddings = args.max_position_embeddings or args.seq_length
    args.padded_vocab_size = args.vocab_size
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from mmrun import backend
    from mmrun.backend.errors import BackendError

    info = backend.init_distributed()  # under msrun, the scheduler process stops here
    from mmrun.engines import mindspore_gpt_step
    from mmrun.models.mcore_layout import LayoutError, causal_position_ids

    try:
        engine = mindspore_gpt_step(args, jit=not args.no_jit)
    except (BackendError, LayoutError) as err:
        # Every rank says it: the launcher shows the log of whichever rank stopped first.
        print(f"error: {err}", file=sys.stderr, flush=True)
        return getattr(err, "exit_code", 1)
    state = engine.state
    dp = state.data_parallel_size
    global_batch = args.global_batch_size or args.micro_batch_size * dp
    if global_batch % (args.micro_batch_size * dp):
        print(f"error: --global-batch-size ({global_batch}) must be a multiple of --micro-batch-size x "
              f"data-parallel size ({args.micro_batch_size} x {dp})", file=sys.stderr, flush=True)
        return 2
    num_micro = global_batch // (args.micro_batch_size * dp)
    if info.rank == 0:
        print(f"> megatron GPT on MindSpore: {state.world_size} processes = tp {state.tensor_model_parallel_size} x "
              f"pp {state.pipeline_model_parallel_size} x dp {dp}; {num_micro} micro-batch(es) of "
              f"{args.micro_batch_size} per rank and step", flush=True)
    rng = np.random.default_rng([args.seed, state.dp_rank])  # the same data on every rank of a DP group
    positions = causal_position_ids(args.micro_batch_size, args.seq_length)
    mask = np.ones((args.micro_batch_size, args.seq_length), np.float32)
    for iteration in range(1, args.train_iters + 1):
        batches = []
        for _ in range(num_micro):
            tokens = rng.integers(0, args.vocab_size, (args.micro_batch_size, args.seq_length + 1))
            batches.append((tokens[:, :-1], positions, tokens[:, 1:], mask))
        start = time.perf_counter()
        result = engine(batches)
        if info.rank == 0:
            print(f" iteration {iteration:4d}/{args.train_iters} | lm loss: {result.loss:.6E} | "
                  f"grad norm: {result.grad_norm:.4f} | elapsed (ms): {1000 * (time.perf_counter() - start):.1f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
