"""Answer extraction and scores as VLMEvalKit computes them (and MindSpeed-MM's copy of its code).

Multiple choice: the option letter is taken from the prediction by exact matching, no judge model: split the
prediction on whitespace after replacing `.()[],:;!*#{}` by spaces; exactly one option letter among the words
is the answer; none, and a 'Z' or empty word: 'Z'; else, when exactly one option's text (lower case) occurs in
the prediction, that option; else no answer ('Z'). A hit is the extracted letter equal to `answer`. MMMU's
open questions (no option A) become "A = the answer, B = Other Answers" with A correct (VLMEvalKit's
MMMU_preproc).

ChartQA, relaxed accuracy: numbers within 5% (a trailing % divides by 100), other answers equal ignoring case,
the best over the row's answers. As in VLMEvalKit, the prediction is passed as the target: the 5% is
relative to the prediction's value.

DocVQA, ANLS: 1 - normalised Levenshtein distance (lower case, whitespace collapsed; normalised by the longer
raw string), the best over the answers, 0 below 0.5.

Scores are percentages: the mean over rows, overall and per `split` / `category` when the TSV has them.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from typing import Iterable, Mapping

from mmrun.data.evaluation.prompts import Dataset, options
from mmrun.data.evaluation.tsv import Row

REFUSALS = ("Sorry, I can't help with images of people yet.", "I can't process this file.",
            "I'm sorry, but without the image provided", "Cannot determine the answer")
ANLS_THRESHOLD = 0.5
RELAXED_TOLERANCE = 0.05


# ------------------------------------------------------------------------------------------ multiple choice

def _letter_in_words(prediction: str, choices: Mapping[str, str]) -> str | None:
    if any(refusal in prediction for refusal in REFUSALS):
        return "Z"
    cleaned = prediction
    for c in ".()[],:;!*#{}":
        cleaned = cleaned.replace(c, " ")
    words = [w.strip() for w in cleaned.split()]
    matches = [letter for letter in choices if letter in words]
    if len(matches) == 1:
        return matches[0]
    if not matches and ("Z" in words or "" in words):
        return "Z"
    return None


def _letter_by_text(prediction: str, choices: Mapping[str, str]) -> str | None:
    lowered = prediction.lower()
    found = [letter for letter, text in choices.items() if str(text).lower() in lowered]
    return found[0] if len(found) == 1 else None


def extract_choice(prediction: str, choices: Mapping[str, str]) -> str:
    """The option letter the prediction gives, 'Z' when none can be read."""
    return _letter_in_words(prediction, choices) or _letter_by_text(prediction, choices) or "Z"


def mcq_choices_and_answer(row: Row, dataset: Dataset) -> tuple[dict[str, str], str]:
    choices, answer = options(row), row.fields["answer"].strip()
    if dataset.name.startswith("mmmu") and "A" not in choices:  # an open question
        return {"A": answer, "B": "Other Answers"}, "A"
    return choices, answer


# ------------------------------------------------------------------------------------------ VQA

def answers_of(row: Row) -> list[str]:
    """`answer`, or the list a "['a', 'b']" cell holds."""
    text = row.fields["answer"]
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return [text]
    return [str(v) for v in value] if isinstance(value, list) else [text]


def _to_float(text: str) -> float | None:
    try:
        return float(text.rstrip("%")) / 100.0 if text.endswith("%") else float(text)
    except ValueError:
        return None


def relaxed_correctness(target: str, prediction: str, tolerance: float = RELAXED_TOLERANCE) -> bool:
    target_value, prediction_value = _to_float(str(target)), _to_float(str(prediction))
    if prediction_value is not None and target_value:
        return abs(prediction_value - target_value) / abs(target_value) <= tolerance
    return str(prediction).lower() == str(target).lower()


def levenshtein(a: str, b: str) -> int:
    if len(a) > len(b):
        a, b = b, a
    previous = list(range(len(a) + 1))
    for j, cb in enumerate(b):
        current = [j + 1]
        for i, ca in enumerate(a):
            current.append(previous[i] if ca == cb else 1 + min(previous[i], previous[i + 1], current[-1]))
        previous = current
    return previous[-1]


def anls_distance(truth: str, prediction: str) -> float:
    a, b = " ".join(truth.strip().lower().split()), " ".join(prediction.strip().lower().split())
    length = max(len(truth.upper()), len(prediction.upper()))
    return 0.0 if length == 0 else levenshtein(a, b) / length


# ------------------------------------------------------------------------------------------ per row, per dataset

def score_row(row: Row, prediction: str, dataset: Dataset) -> dict:
    """{'score': 0..1, plus what was matched} for one row."""
    if dataset.kind == "MCQ":
        choices, answer = mcq_choices_and_answer(row, dataset)
        letter = extract_choice(str(prediction), choices)
        return {"score": float(letter == answer), "extracted": letter, "truth": answer}
    truths = answers_of(row)
    if dataset.metric == "relaxed_accuracy":
        return {"score": float(max(relaxed_correctness(prediction.strip(), t) for t in truths)), "truth": truths}
    if dataset.metric == "anls":
        similarity = 1 - min(anls_distance(t, prediction) for t in truths)
        return {"score": 0.0 if similarity < ANLS_THRESHOLD else similarity, "truth": truths}
    raise ValueError(f"metric {dataset.metric!r} is not built")


def summarize(rows: Iterable[Row], scores: Mapping[str, float]) -> dict[str, float]:
    """{'Overall': %, '<split>': %, '<category>': %} from each row's score (rows keyed by index)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        value = scores[row.index]
        groups["Overall"].append(value)
        for column in ("split", "category"):
            if row.get(column) is not None:
                groups[f"{column}={row.get(column)}"].append(value)
    return {name: round(100.0 * sum(values) / len(values), 4) for name, values in groups.items()}
