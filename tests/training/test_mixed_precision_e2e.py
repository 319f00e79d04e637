"""--fp16 end to end through `mmrun`, on both frameworks: Megatron's loss scaling, logs and checkpoints.

`--initial-loss-scale 2^20` overflows this tiny GPT's fp16 gradients for the first iterations, so the
runs exercise the skip-and-back-off path before they train; both frameworks must skip the same ones.
"""
from __future__ import annotations

import json
import re

import pytest
from safetensors.numpy import load_file

pytestmark = pytest.mark.slow

ITERS = 20  # tk.tiny_gpt's --train-iters
FP16 = ["--fp16", "--initial-loss-scale", str(2 ** 20)]
LOG_FIELDS = re.compile(r"iteration\s+(\d+)/.*\| loss scale: ([0-9.]+) \|.*number of skipped iterations:\s+(\d+) \|")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, demo_data, tk):
    base = tmp_path_factory.mktemp("fp16")
    args = [*tk.tiny_gpt, *FP16, *tk.data_args(demo_data)]
    ckpt = base / "ckpt"
    done = {
        "pt": tk.run_training(base / "pt", args + ["--save", str(ckpt), "--save-interval", "10"]),
        "ms": tk.run_training(base / "ms", args, "mindspore"),
    }
    done["pt_resume"] = tk.run_training(base / "pt_resume", args + ["--load", str(ckpt), "--ckpt-step", "10"])
    for name, run in done.items():
        assert run.returncode == 0, f"{name} failed:\n{run.output[-3000:]}"
    done["ckpt"] = ckpt
    return done


def _train_records(run) -> dict[int, dict]:
    return {r["iteration"]: r for r in run.metrics if r["kind"] == "train"}


def test_both_frameworks_skip_the_same_overflowing_iterations_and_agree_after(runs):
    pt, ms = _train_records(runs["pt"]), _train_records(runs["ms"])
    assert [pt[i]["skipped"] for i in pt] == [ms[i]["skipped"] for i in ms]
    assert [pt[i]["loss_scale"] for i in pt] == [ms[i]["loss_scale"] for i in ms]
    skipped = [i for i in pt if pt[i]["skipped"]]
    assert skipped and skipped == list(range(1, len(skipped) + 1)), skipped  # overflows first, then none
    assert pt[ITERS]["loss_scale"] < 2 ** 20
    assert max(abs(pt[i]["lm_loss"] - ms[i]["lm_loss"]) for i in pt) <= 1e-4
    advanced = [pt[i]["lm_loss"] for i in pt if not pt[i]["skipped"]]
    assert advanced[-1] < advanced[0] - 0.3


def test_the_log_carries_megatrons_loss_scale_and_skipped_counts(runs):
    for name in ("pt", "ms"):
        records = _train_records(runs[name])
        lines = {int(m.group(1)): (float(m.group(2)), int(m.group(3))) for m in LOG_FIELDS.finditer(runs[name].output)}
        assert sorted(lines) == [5, 10, 15, 20], runs[name].output[-2000:]
        for it, (scale, skipped) in lines.items():
            assert scale == records[it]["loss_scale"]
            assert skipped == sum(records[i]["skipped"] for i in range(it - 4, it + 1))
        assert "> fp16 model with fp32 main params in the optimizer, dynamic loss scale from 1.04858e+06" in runs[name].output


def test_checkpoint_holds_main_params_and_the_scaler_and_resume_is_bit_exact(runs):
    rank_dir = runs["ckpt"] / "iter_0000010" / "mp_rank_00"
    model, optimizer = load_file(str(rank_dir / "model.safetensors")), load_file(str(rank_dir / "optimizer.safetensors"))
    assert {v.dtype.name for v in model.values()} == {"float16"}
    mains = {k[: -len(".main_param")]: v for k, v in optimizer.items() if k.endswith(".main_param")}
    assert set(mains) == set(model) and {v.dtype.name for v in mains.values()} == {"float32"}
    assert all((mains[k].astype("float16") == model[k]).all() for k in model)
    meta = json.loads((rank_dir / "meta.json").read_text())
    pt = _train_records(runs["pt"])
    assert meta["grad_scaler"]["kind"] == "dynamic" and meta["grad_scaler"]["scale"] == pt[10]["loss_scale"]

    resumed = _train_records(runs["pt_resume"])
    assert sorted(resumed) == list(range(11, ITERS + 1))
    for i in resumed:
        assert (resumed[i]["lm_loss"], resumed[i]["loss_scale"], resumed[i]["skipped"]) == (
            pt[i]["lm_loss"], pt[i]["loss_scale"], pt[i]["skipped"])
