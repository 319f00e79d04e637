"""models/evaluate_vlm.py: MindSpeed-MM's evaluation json on tiny synthetic VLMEvalKit TSVs: the results file holds
every question with its prediction and score, the scores file and the summary line agree with it, two
data-parallel ranks give the one-process result, and bad input is one line and exit 2."""
from __future__ import annotations

import base64
import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENTRY = ROOT / "models" / "evaluate_vlm.py"


def demo_image(root: Path, number: int) -> str:
    return base64.b64encode((root / "demo" / "data" / "images" / f"{number:04d}.png").read_bytes()).decode()


def write_tsv(path: Path, columns: list[str], rows: list[list]) -> Path:
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)
    return path


@pytest.fixture(scope="module")
def evaluation(vlm_job, tmp_path_factory):
    """(json path per dataset, output dir): ai2d_test and docvqa_val TSVs of five rows over the demo's pictures."""
    root, _, raw = vlm_job
    folder = tmp_path_factory.mktemp("evaluation")
    ai2d = write_tsv(folder / "AI2D_TEST.tsv", ["index", "image", "question", "A", "B", "C", "answer", "category"],
                     [[i, demo_image(root, i) if i != 3 else "1", "How many shapes?", "one", "two", "three",
                       "ABCAB"[i], "count" if i % 2 else "shape"] for i in range(5)])
    docvqa = write_tsv(folder / "DocVQA_VAL.tsv", ["index", "image", "question", "answer"],
                       [[i, demo_image(root, i), "What colour?", repr(["red", "blue"])] for i in range(5)])
    generation = {**raw["generation_config"], "max_new_tokens": 4}
    jsons = {}
    for name, tsv in (("ai2d_test", ai2d), ("docvqa_val", docvqa)):
        evaluation_json = {k: v for k, v in raw.items() if k not in ("pipeline_class", "image_path", "prompts")}
        evaluation_json.update({"model_id": "Qwen2VlPipeline", "generation_config": generation,
                                "dataset_path": str(tsv), "evaluation_dataset": name, "evaluation_model": "tiny",
                                "result_output_path": str(folder / "out")})
        jsons[name] = folder / f"evaluate_{name}.json"
        jsons[name].write_text(json.dumps(evaluation_json))
    return jsons, folder / "out", str(root / "hf")


def run_entry(capsys, *argv) -> tuple[int, str, str]:
    from mmrun.models import evaluate_vlm

    try:
        code = evaluate_vlm.main(list(argv))
    except SystemExit as exit_:
        code = exit_.code
    out = capsys.readouterr()
    return code, out.out, out.err


def read_results(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


@pytest.mark.parametrize("name, metric", [("ai2d_test", "accuracy"), ("docvqa_val", "anls")])
def test_results_scores_and_summary_agree(evaluation, capsys, name, metric):
    from mmrun.data.evaluation.metrics import anls_distance, extract_choice

    jsons, out_dir, hf = evaluation
    code, out, err = run_entry(capsys, "--mm-model", str(jsons[name]), "--load", hf)
    assert code == 0, err
    rows = read_results(out_dir / f"tiny_{name}.tsv")
    assert [r["index"] for r in rows] == ["0", "1", "2", "3", "4"] and all(r["prediction"] != "" for r in rows)
    for row in rows:  # each score recomputed from the written prediction
        if metric == "accuracy":
            letter = extract_choice(row["prediction"], {"A": "one", "B": "two", "C": "three"})
            assert row["extracted"] == letter and float(row["score"]) == float(letter == row["answer"])
        else:
            best = 1 - min(anls_distance(t, row["prediction"]) for t in ("red", "blue"))
            assert float(row["score"]) == pytest.approx(0.0 if best < 0.5 else best, abs=1e-6)
    scores = json.loads((out_dir / f"tiny_{name}_acc.json").read_text())
    overall = 100 * sum(float(r["score"]) for r in rows) / 5
    assert scores["metric"] == metric and scores["scores"]["Overall"] == pytest.approx(overall, abs=1e-3)
    assert out.startswith(f"> {name}: {metric} {overall:.2f} over 5 questions")
    assert ", 1 rank(s), " in out and "pytorch on cpu" in out
    if metric == "accuracy":
        assert set(scores["scores"]) == {"Overall", "category=count", "category=shape"}


def test_a_tsv_missing_a_column_is_one_line_and_exit_2(evaluation, capsys, tmp_path):
    jsons, _, hf = evaluation
    raw = json.loads(jsons["docvqa_val"].read_text())
    raw["dataset_path"] = str(write_tsv(tmp_path / "bad.tsv", ["index", "image", "question"], [[0, "x" * 80, "q"]]))
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    code, out, err = run_entry(capsys, "--mm-model", str(path), "--load", hf)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [f"error: dataset_path {raw['dataset_path']}: no column answer (columns: "
                                        "index, image, question); pass VLMEvalKit's TSV of this evaluation_dataset"]


@pytest.mark.slow
def test_two_data_parallel_ranks_give_the_one_process_result(evaluation, capsys, tmp_path):
    jsons, out_dir, hf = evaluation
    single = out_dir / "tiny_docvqa_val.tsv"
    if not single.is_file():
        assert run_entry(capsys, "--mm-model", str(jsons["docvqa_val"]), "--load", hf)[0] == 0
    raw = json.loads(jsons["docvqa_val"].read_text())
    raw["result_output_path"] = str(tmp_path / "dp")
    path = tmp_path / "dp.json"
    path.write_text(json.dumps(raw))
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE")}
    done = subprocess.run([sys.executable, "-m", "mmrun.launchers.cli", "--ai-framework", "pytorch", "--nproc-per-node", "2", "--master-port", "0",
                           str(ENTRY), "--mm-model", str(path), "--load", hf], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "over 5 questions, 2 rank(s)" in done.stdout + done.stderr
    assert read_results(tmp_path / "dp" / "tiny_docvqa_val.tsv") == read_results(single)
    assert (json.loads((tmp_path / "dp" / "tiny_docvqa_val_acc.json").read_text())
            == json.loads((out_dir / "tiny_docvqa_val_acc.json").read_text()))
