"""Convert a --ckpt-format torch_dcp checkpoint (FSDP2 on PyTorch) into something else:

    python -m mmrun.checkpoint.dcp --load ckpt --save ckpt_st --to safetensors   # mmrun's format
    python -m mmrun.checkpoint.dcp --load ckpt --save hf_dir  --to hf            # a Hugging Face directory

`safetensors`: the same iteration in mmrun's framework-neutral layout (iter_*/mp_rank_00/model.safetensors,
optimizer.safetensors, meta.json; atomic, tracker last), so a job trained with FSDP2 on PyTorch continues
on MindSpore (mmrun's GPT: `--load ckpt_st` under --ai-framework mindspore) or under any engine.
`hf`: config.json + model.safetensors written by transformers itself from the config the checkpoint
kept (a transformers model trained by models/pretrain_transformers.py), for `from_pretrained`.

One process, no process group: DCP's shards are read whole (backend/torch/fsdp2/dcp.py, through
mmrun.engines' facade: this module imports no framework). Exit status:
0 converted, 2 usage error (no checkpoint, not DCP, no model config for hf), 1 a write failure.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

from mmrun import engines
from mmrun.training.arguments import spellings
from mmrun.training.checkpoint_dcp import find_dcp, is_dcp_dir, read_meta
from mmrun.training.checkpoint_layout import CheckpointError, iteration_dir

TARGETS = ("safetensors", "hf")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mmrun.checkpoint.dcp", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(*spellings("--load"), required=True, help="the checkpoint root (with the tracker) or an iter_* directory")
    p.add_argument(*spellings("--save"), required=True, help="where to write")
    p.add_argument(*spellings("--to"), choices=TARGETS, required=True)
    p.add_argument(*spellings("--ckpt-step"), type=int, default=None, help="the iteration (default: the tracker's)")
    return p


def _source(load: str, ckpt_step: int | None) -> Path:
    path = Path(load)
    if is_dcp_dir(path):
        return path
    found = find_dcp(path, ckpt_step)
    if found is None:
        where = iteration_dir(path, ckpt_step) if ckpt_step is not None else path
        raise CheckpointError(f"{where} holds no torch_dcp checkpoint (no .metadata); pass the --save directory of a "
                              "--ckpt-format torch_dcp run, or one of its iter_* directories")
    return found


def to_safetensors(source: Path, save: str, log: Any = print) -> Path:
    from mmrun.training.checkpoint_store import write_checkpoint

    meta = read_meta(source)
    state = engines.dcp_state(source)  # torch reads it; numpy comes back
    model = dict(state["model"])
    optimizer = None
    if "optim" in state:
        tensors, step = {}, 0
        for name, values in state["optim"]["state"].items():
            for key in ("exp_avg", "exp_avg_sq"):
                tensors[f"{name}.{key}"] = values[key]
            step = int(float(values.get("step", step)))
        optimizer = {"step": step, "lr": float(state["optim"]["param_groups"][0]["lr"]), "tensors": tensors}
    out_meta = {k: v for k, v in meta.items() if k not in ("ckpt_format", "fsdp2", "optimizer", "hf_config")}
    out_meta.update({"parallel": {"tp": 1, "pp": 1, "vpp": 1, "cp": 1, "dp": 1, "tp_rank": 0, "pp_rank": 0},
                     "converted_from": f"torch_dcp {source}", "rng_state": None, "grad_scaler": None})
    return write_checkpoint(save, int(meta["iteration"]), model, optimizer, out_meta, log=log)


def to_hf(source: Path, save: str) -> Path:
    from mmrun.common.atomic_write import replace_directory

    meta = read_meta(source)
    if not meta.get("hf_config"):
        raise CheckpointError(f"{source} keeps no transformers config (it was not trained by "
                              "models/pretrain_transformers.py); convert it --to safetensors instead")
    out = Path(save)
    out.parent.mkdir(parents=True, exist_ok=True)
    # transformers writes its own files: into a temporary directory, swapped in when complete.
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        engines.dcp_to_hf(meta["hf_config"], source, tmp)
        tmp.chmod(0o755)
        return replace_directory(tmp, out)
    finally:
        if tmp.exists():
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        source = _source(args.load, args.ckpt_step)
        written = to_safetensors(source, args.save) if args.to == "safetensors" else to_hf(source, args.save)
    except CheckpointError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: writing {args.save} failed: {err}", file=sys.stderr)
        return 1
    print(f"converted {source} -> {written} ({args.to})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
