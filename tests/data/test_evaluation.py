"""mmrun.data.evaluation: VLMEvalKit TSVs (tiny synthetic ones written here), MindSpeed-MM's Qwen2-VL prompts,
VLMEvalKit's choice extraction and metrics, and a missing column as one clear error."""
from __future__ import annotations

import base64
import csv
import io

import pytest
from PIL import Image

from mmrun.data.evaluation import metrics
from mmrun.data.evaluation.prompts import DATASETS, build_prompt
from mmrun.data.evaluation.tsv import TSVError, read_tsv


def png_base64(colour=(200, 30, 30), size=(56, 56)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def write_tsv(path, columns, rows) -> str:
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)
    return str(path)


def test_rows_shared_images_image_lists_and_rows_without_image(tmp_path):
    image = png_base64()
    path = write_tsv(tmp_path / "AI2D_TEST.tsv", ["index", "image", "question", "hint", "A", "B", "C", "answer"], [
        [0, image, "What is red?", "", "sun", "sea", "", "A"],
        [1, "0", "Which is left?", "Look left", "x", "y", "z", "C"],  # shares row 0's image
        [2, "", "no image", "", "a", "b", "", "A"],  # dropped, as MindSpeed-MM drops NaN images
        [3, repr([image, image]), "two images", "", "a", "b", "", "B"],
    ])
    rows = read_tsv(path, DATASETS["ai2d_test"].required)
    assert [r.index for r in rows] == ["0", "1", "3"]
    assert rows[1].images == [image] and len(rows[2].images) == 2
    assert build_prompt(rows[0], DATASETS["ai2d_test"]) == (
        "Question: What is red?\nOptions:\nA. sun\nB. sea\nPlease select the correct answer from the options above.")
    assert build_prompt(rows[1], DATASETS["ai2d_test"]).startswith("Hint: Look left\nQuestion: Which is left?\n")


def test_mmmu_and_vqa_prompts_and_the_chinese_instruction(tmp_path):
    path = write_tsv(tmp_path / "MMMU.tsv", ["index", "image", "question", "A", "B", "answer"], [
        [7, png_base64(), "2+2?", "3", "4", "B"], [8, png_base64(), "哪个是红色?", "", "", "red"]])
    rows = read_tsv(path, DATASETS["mmmu_dev_val"].required)
    assert build_prompt(rows[0], DATASETS["mmmu_dev_val"]) == (
        "Question: 2+2?\nOptions:\nA. 3\nB. 4\nPlease select the correct answer from the options above.")
    assert build_prompt(rows[1], DATASETS["mmmu_dev_val"]) == "Question: 哪个是红色?"
    cn = read_tsv(write_tsv(tmp_path / "cn.tsv", ["index", "image", "question", "A", "B", "answer"],
                            [[1, png_base64(), "哪个?", "甲", "乙", "A"]]), DATASETS["ai2d_test"].required)
    assert build_prompt(cn[0], DATASETS["ai2d_test"]).endswith("B. 乙\n请直接回答选项字母。")
    vqa = read_tsv(write_tsv(tmp_path / "c.tsv", ["index", "image", "question", "answer"],
                             [[0, png_base64(), "What is the peak?", "12"]]), DATASETS["chartqa_test"].required)
    assert build_prompt(vqa[0], DATASETS["chartqa_test"]) == (
        "What is the peak?\nPlease try to answer the question with short words or phrases if possible.")


def test_a_tsv_missing_a_column_is_one_line(tmp_path):
    path = write_tsv(tmp_path / "bad.tsv", ["index", "image", "question"], [[0, png_base64(), "q"]])
    with pytest.raises(TSVError) as error:
        read_tsv(path, DATASETS["docvqa_val"].required)
    assert str(error.value).startswith(f"dataset_path {path}: no column answer (columns: index, image, question)")
    assert error.value.exit_code == 2 and "\n" not in str(error.value)


@pytest.mark.parametrize("prediction, letter", [
    ("B", "B"), ("The answer is (C).", "C"), ("A. sun", "A"), ("sea", "B"), ("It is the sun or the sea", "Z"),
    ("Cannot determine the answer", "Z"), ("", "Z"), ("A or B", "Z"),
])
def test_choice_extraction_as_vlmevalkit(prediction, letter):
    assert metrics.extract_choice(prediction, {"A": "sun", "B": "sea", "C": "sky"}) == letter


def test_relaxed_accuracy_anls_and_summary(tmp_path):
    assert metrics.relaxed_correctness("100", "104") and not metrics.relaxed_correctness("100", "106")
    assert metrics.relaxed_correctness("50%", "0.51") and metrics.relaxed_correctness("Yes", "yes")
    assert metrics.levenshtein("kitten", "sitting") == 3
    docvqa = DATASETS["docvqa_val"]
    path = write_tsv(tmp_path / "d.tsv", ["index", "image", "question", "answer", "split"], [
        [0, png_base64(), "q", "['Invoice 42', 'invoice']", "val"], [1, png_base64(), "q", "total", "val"]])
    rows = read_tsv(path, docvqa.required)
    exact = metrics.score_row(rows[0], "invoice", docvqa)["score"]
    near = metrics.score_row(rows[1], "totals", docvqa)["score"]
    far = metrics.score_row(rows[1], "nothing alike", docvqa)["score"]
    assert exact == 1.0 and near == pytest.approx(1 - 1 / 6) and far == 0.0
    assert metrics.summarize(rows, {"0": exact, "1": near}) == {"Overall": pytest.approx(100 * (1 + 5 / 6) / 2, 1e-6),
                                                               "split=val": pytest.approx(100 * (1 + 5 / 6) / 2, 1e-6)}
    mmmu = DATASETS["mmmu_dev_val"]
    open_row = read_tsv(write_tsv(tmp_path / "m.tsv", ["index", "image", "question", "A", "answer"],
                                  [[0, png_base64(), "Name it", "", "Paris"]]), mmmu.required)[0]
    assert metrics.score_row(open_row, "It is Paris.", mmmu) == {"score": 1.0, "extracted": "A", "truth": "A"}


def test_use_custom_prompt_false_gives_the_datasets_own_prompt(tmp_path):
    """examples/qwen2.5vl/evaluate_qwen2_5_vl_72b.json says use_custom_prompt false: MindSpeed-MM then asks its
    eval dataset's build_prompt (datasets_ai2d.py / datasets_vqa.py at 57069cd5): the English instruction with its
    " \\n" kept, whatever the language; VQA's own short-answer line. MMMU's (images split into the text) is refused."""
    import dataclasses
    import json
    from pathlib import Path

    from mmrun.backend.errors import UsageError
    from mmrun.models.evaluate_vlm import read_evaluation_keys

    real = Path(__file__).resolve().parents[1] / "fixtures" / "mindspeed_mm" / "qwen2.5vl" / "evaluate_qwen2_5_vl_72b.json"
    raw = json.loads(real.read_text())
    dataset, *_ = read_evaluation_keys(raw, "evaluate_qwen2_5_vl_72b.json")
    assert dataset.name == "ai2d_test" and dataset.custom is False
    cn = read_tsv(write_tsv(tmp_path / "cn.tsv", ["index", "image", "question", "hint", "A", "B", "answer"],
                            [[1, png_base64(), "哪个?", "看左边", "甲", "乙", "A"]]), dataset.required)
    assert build_prompt(cn[0], dataset) == ("Hint: 看左边\nQuestion: 哪个?\nOptions:\nA. 甲\nB. 乙\n"
                                            "Please select the correct answer from the options above. \n")
    vqa = read_tsv(write_tsv(tmp_path / "c.tsv", ["index", "image", "question", "answer"],
                             [[0, png_base64(), "What is the peak?", "12"]]), DATASETS["chartqa_test"].required)
    chart = dataclasses.replace(DATASETS["chartqa_test"], custom=False)
    assert build_prompt(vqa[0], chart) == "What is the peak?\nAnswer the question using a single word or phrase."
    with pytest.raises(UsageError, match="use_custom_prompt False for mmmu_dev_val: MMMU's own prompt"):
        read_evaluation_keys({**raw, "evaluation_dataset": "mmmu_dev_val"}, "e.json")
