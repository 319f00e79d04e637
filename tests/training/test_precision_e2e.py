"""The precision tools on real training runs of the tiny GPT through mmrun: PyTorch and MindSpore agree per
iteration and per module (--dump-config), a perturbed learning rate is caught at the right iteration."""
from __future__ import annotations

import json

import pytest

from mmrun.precision.cli import main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory, demo_data, tk):
    root = tmp_path_factory.mktemp("precision")
    base = [*tk.tiny_gpt, *tk.data_args(demo_data), "--train-iters", "6", "--log-interval", "1"]
    logs = {}
    for name, framework, extra in (("pt", "pytorch", []), ("ms", "mindspore", []),
                                   ("lr", "pytorch", ["--lr", "2.2e-3"])):
        config = root / f"{name}.json"
        config.write_text(json.dumps({"task": "statistics", "level": "L0", "dump_path": str(root / f"dump_{name}"),
                                      "step": [2], "rank": []}))
        run = tk.run_training(root / name, [*base, *extra, "--dump-config", str(config)], framework=framework)
        assert run.returncode == 0, run.output[-3000:]
        logs[name] = root / f"{name}.log"
        logs[name].write_text(run.output)
    return root, logs


def test_pytorch_and_mindspore_agree_per_iteration_and_per_module(runs, capsys):
    root, logs = runs
    assert main([str(logs["pt"]), str(logs["ms"]), "--rtol", "1e-5"]) == 0
    assert "verdict: PASS: lm loss within rtol 1e-05, atol 0 at all 6 common iterations" in capsys.readouterr().out
    assert "> MindSpore train step in PyNative: module hooks" in logs["ms"].read_text()
    assert main(["--dump", str(root / "dump_pt"), str(root / "dump_ms")]) == 0
    out = capsys.readouterr().out
    assert "step 2 rank 0: pytorch vs mindspore, 112 records paired (220 tensors), 0 outside the tolerance" in out


def test_a_perturbed_learning_rate_fails_at_its_first_iteration(runs, capsys):
    root, logs = runs
    # warmup starts at lr 0: iteration 1's update is the same, iteration 2's differs, so iteration 3's loss does
    assert main([str(logs["pt"]), str(logs["lr"]), "--rtol", "1e-5"]) == 1
    assert "lm loss first outside the tolerance at iteration 3: " in capsys.readouterr().out
    assert main(["--dump", str(root / "dump_pt"), str(root / "dump_lr")]) == 1
    first = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("first"))
    assert first.startswith("first diverging module: wte (forward, step 2 rank 0: Module.wte.Embedding.forward.0 "
                            "output.0")  # the embedding table is the first weight the changed update touches
