"""The question text MindSpeed-MM sends to Qwen2-VL per benchmark (its Qwen2vlPromptTemplate, the prompt builder
of evaluation_model qwen2_vl_7b with use_custom_prompt true, the default). The images come first in the user
turn, then this text.

    multiple choice (ai2d_test; mmmu_dev_val the same with the English instruction always):
        [Hint: <hint>\\n]Question: <question>\\nOptions:\\nA. <A>\\nB. <B>\\n...<instruction>   (trailing space cut)
    VQA (chartqa_test, docvqa_val):
        <question>\\nPlease try to answer the question with short words or phrases if possible.
"""
from __future__ import annotations

import re
import string
from dataclasses import dataclass

from mmrun.data.evaluation.tsv import Row


@dataclass(frozen=True)
class Dataset:
    name: str
    kind: str  # "MCQ" (accuracy of the extracted letter) or "VQA" (per-answer score)
    metric: str  # accuracy | relaxed_accuracy | anls
    required: tuple[str, ...]  # TSV columns this dataset needs
    custom: bool = True  # use_custom_prompt: the model's prompt (Qwen2-VL's), or false: the dataset's own


# MindSpeed-MM's datasets_type, with the metric VLMEvalKit reports for each.
DATASETS: dict[str, Dataset] = {
    "ai2d_test": Dataset("ai2d_test", "MCQ", "accuracy", ("index", "image", "question", "answer", "A", "B")),
    "mmmu_dev_val": Dataset("mmmu_dev_val", "MCQ", "accuracy", ("index", "image", "question", "answer", "A")),
    "chartqa_test": Dataset("chartqa_test", "VQA", "relaxed_accuracy", ("index", "image", "question", "answer")),
    "docvqa_val": Dataset("docvqa_val", "VQA", "anls", ("index", "image", "question", "answer")),
}
MCQ_EN = "Please select the correct answer from the options above."
MCQ_CN = "请直接回答选项字母。"
VQA_SUFFIX = "\nPlease try to answer the question with short words or phrases if possible."
_CJK = re.compile("[\u4e00-\u9fff]")


def options(row: Row) -> dict[str, str]:
    """The option columns A, B, ... that hold a value."""
    return {letter: row.get(letter) for letter in string.ascii_uppercase if row.get(letter) is not None}


DATASET_VQA_SUFFIX = "\nAnswer the question using a single word or phrase."


def dataset_prompt(row: Row, dataset: Dataset) -> str:
    """The dataset's own prompt (MindSpeed-MM's eval_datasets build_prompt, used with use_custom_prompt false):
    VQA: the question and a short-answer instruction; multiple choice: hint, question, options and the English
    instruction, its trailing " \n" kept."""
    if dataset.kind == "VQA":
        return row.fields["question"] + DATASET_VQA_SUFFIX
    choices = options(row)
    prompt = f"Hint: {row.get('hint')}\n" if row.get("hint") is not None else ""
    prompt += f"Question: {row.fields['question']}\n"
    if choices:
        prompt += "Options:\n" + "".join(f"{k}. {v}\n" for k, v in choices.items()) + MCQ_EN + " \n"
    return prompt


def build_prompt(row: Row, dataset: Dataset) -> str:
    if not dataset.custom:
        return dataset_prompt(row, dataset)
    if dataset.kind == "VQA":
        return row.fields["question"] + VQA_SUFFIX
    choices = options(row)
    prompt = f"Hint: {row.get('hint')}\n" if row.get("hint") is not None else ""
    prompt += f"Question: {row.fields['question']}\n"
    if choices:
        prompt += "Options:\n" + "".join(f"{k}. {v}\n" for k, v in choices.items())
        if dataset.name.startswith("mmmu"):
            prompt += MCQ_EN + " \n"
        else:
            prompt += MCQ_CN if _CJK.search(prompt) else MCQ_EN
    return prompt.rstrip()
