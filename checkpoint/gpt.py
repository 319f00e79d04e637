"""Convert a checkpoint between mmrun's GPT and megatron-core's GPTModel, and between TP/PP layouts.

    python -m mmrun.checkpoint.gpt --load ckpt_tp2pp2 --save ckpt_gpt --to mmrun-gpt
    python -m mmrun.checkpoint.gpt --load ckpt_gpt --save ckpt_tp2 --to megatron-core \\
        --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2

It reads one iteration (the tracker's, or --ckpt-step), verifies every rank directory against its
checksums, joins the shards into the whole model (models/gpt_names.py), converts the names and the
fused QKV layout, splits for the target layout and writes the same iteration into --save with the save
sequence training uses (atomic, tracker last). Weights and the optimizer state (moments and fp32 main
params, named after the parameters) convert; RNG states do not (they belong to ranks that no longer
exist), so the run that loads it starts its RNGs from --seed and says so. numpy only: no framework needed.
The trainer does the same on the fly when --load meets another layout; this writes it down once.

Exit status: 0 converted, 2 usage error (bad arguments, no checkpoint, sizes that do not fit), 1 a
write failure (nothing half-written is left).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from mmrun.models.gpt_names import Layout
from mmrun.training.arguments import spellings
from mmrun.training.checkpoint_layout import CheckpointError, iteration_dir, rank_dir_name
from mmrun.training.checkpoint_reshard import WholeCheckpoint, describe, for_rank, read_whole, shape_of
from mmrun.training.checkpoint_store import (CheckpointSaveError, RankFiles, single_process, find_checkpoint,
                                             recover_interrupted_saves, write_checkpoint_shards)
from mmrun.engines.base import MODEL_NAMES

EXAMPLES = """\
examples:
  # a TP=2 x PP=2 megatron-core checkpoint -> mmrun's GPT (one shard, loadable by either framework)
  python -m mmrun.checkpoint.gpt --load ckpt_tp2pp2 --save ckpt_gpt --to mmrun-gpt

  # mmrun's GPT -> megatron-core GPTModel shards for TP=2 x PP=2
  python -m mmrun.checkpoint.gpt --load ckpt_gpt --save ckpt_tp2pp2 --to megatron-core \\
      --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2

exit status: 0 converted, 2 usage error, 1 write failure.
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        print(f"error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m mmrun.checkpoint.gpt", epilog=EXAMPLES,
                formatter_class=argparse.RawDescriptionHelpFormatter,
                description="Convert an mmrun checkpoint between mmrun's GPT and megatron-core's GPTModel "
                            "and between tensor/pipeline-parallel layouts (numpy only).")
    def add(flag: str, **kwargs) -> None:
        p.add_argument(*spellings(flag), **kwargs)

    add("--load", required=True, help="checkpoint directory to read (its tracker names the iteration)")
    add("--save", required=True, help="directory to write the converted iteration into (not --load)")
    add("--to", required=True, choices=MODEL_NAMES, help="model names of the result")
    add("--tensor-model-parallel-size", type=int, default=1, help="target layout (megatron-core only; default 1)")
    add("--pipeline-model-parallel-size", type=int, default=1, help="target layout (megatron-core only; default 1)")
    add("--virtual-pipeline-model-parallel-size", type=int, default=1,
        help="target virtual stages per pipeline rank (default 1)")
    add("--ckpt-step", type=int, default=None, help="iteration to read (default: the tracker's)")
    add("--no-optimizer", action="store_true", help="leave the optimizer state out")
    return p


def _target_meta(whole: WholeCheckpoint, to: str, layout: Layout, tp_rank: int, pp_rank: int,
                 source: str) -> dict:
    meta = {k: v for k, v in whole.meta.items() if k not in ("checksums", "rng_state", "resharded")}
    args = dict(meta.get("args", {}))
    args.update(tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
                virtual_pipeline_model_parallel_size=layout.vpp if layout.vpp > 1 else None,
                use_mcore_models=to == "megatron-core")
    parallel = {**(meta.get("parallel") or {}), "tp": layout.tp, "pp": layout.pp, "vpp": layout.vpp,
                "tp_rank": tp_rank, "pp_rank": pp_rank}
    return {**meta, "args": args, "parallel": parallel, "model_names": to, "rng_state": None,
            "converted_from": source}


def convert(load: str, save: str, to: str, layout: Layout, ckpt_step: int | None = None,
            optimizer: bool = True, log=print) -> Path:
    """Convert one iteration of `load` into `save` (see the module docstring); returns the iteration directory."""
    if Path(save).resolve() == Path(load).resolve():
        raise CheckpointError(f"--save is --load ({load}); the input would be overwritten. Pass another --save")
    if to == "mmrun-gpt" and (layout.tp, layout.pp, layout.vpp) != (1, 1, 1):
        raise CheckpointError(f"mmrun's GPT is one shard: --to mmrun-gpt takes no tensor/pipeline layout. Received: "
                              f"{layout}; drop the sizes or use --to megatron-core")
    root = Path(load)
    if root.is_dir():
        try:
            recover_interrupted_saves(root, log)
        except OSError:
            pass  # read-only input: read what is complete
    probe = find_checkpoint(root, ckpt_step, log)
    if probe is None:
        raise CheckpointError(f"no checkpoint in {load} (no latest_checkpointed_iteration.txt and no iter_* "
                              "directory); pass the --save directory of a training run")
    if iteration_dir(Path(save), probe.iteration).exists():
        raise CheckpointError(f"{iteration_dir(Path(save), probe.iteration)} already exists; it would be replaced. "
                              "Pass an empty --save")
    shape = shape_of(probe.meta.get("args", {}))
    layout.check(shape)
    source = describe(probe.meta)
    log(f"> reading {probe.path.parent} ({source}), verifying every rank directory ...")
    whole = read_whole(probe, shape)
    files = []
    ranks = layout.ranks() if to == "megatron-core" else [(0, 0)]
    for t, p in ranks:
        model = for_rank(whole.model, to, shape, layout, t, p)
        opt = None
        if optimizer and whole.optimizer is not None:
            opt = {**whole.optimizer, "tensors": for_rank(whole.optimizer["tensors"], to, shape, layout, t, p)}
        files.append(RankFiles(rank_dir_name(t, p, layout.pp), model, opt,
                               _target_meta(whole, to, layout, t, p, source)))
    log(f"> writing {len(files)} rank director{'y' if len(files) == 1 else 'ies'} ({to}, tensor-parallel {layout.tp}, "
        f"pipeline-parallel {layout.pp}, virtual stages {layout.vpp}) into {save} ...")
    written = write_checkpoint_shards(save, probe.iteration, files, rank=0, gather=single_process, log=log)
    log(f"> converted iteration {probe.iteration}: {written}")
    return written


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    layout = Layout(args.tensor_model_parallel_size, args.pipeline_model_parallel_size,
                    args.virtual_pipeline_model_parallel_size)
    try:
        convert(args.load, args.save, args.to, layout, args.ckpt_step, not args.no_optimizer)
    except CheckpointSaveError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except (CheckpointError, ValueError) as err:  # ConversionError is a ValueError
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
