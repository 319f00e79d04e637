"""Chat templates as data, and encoding a conversation into input_ids and labels as MindSpeed-MM does.

MindSpeed-MM (after LLaMA-Factory) formats each message with its role's slot, the first one preceded by the
system slot, tokenizes each formatted message as one string (special tokens such as `<|im_end|>` are
recognised as such), and pairs them (user, assistant). Labels are the assistant ids; prompt ids are -100
unless `train_on_prompt`; with `mask_history` only the last pair is trained on and pairs are filled from the
last one backwards, so that the cut-off drops the oldest turns first. Truncation to the cut-off (mmrun:
`--seq-length`) shares the room between prompt and answer with LLaMA-Factory's `infer_seqlen`.

`<image>` / `<video>` placeholders become `<|vision_start|>` + one pad token per merged patch + `<|vision_end|>`,
as MindSpeed-MM's `Qwen2VLPlugin.process_messages` does, before tokenization.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np

IGNORE_INDEX = -100
IMAGE_PLACEHOLDER = "<image>"
VIDEO_PLACEHOLDER = "<video>"

# Conversation roles (MindSpeed-MM's `Role` values) after the data.json tags are mapped onto them.
USER, ASSISTANT, OBSERVATION, FUNCTION = "user", "assistant", "observation", "function"


@dataclass(frozen=True)
class ChatTemplate:
    """One template: a format string per role (`{content}` is the message) and the vision token strings."""

    name: str
    slots: dict[str, str]
    system_slot: str
    default_system: str
    vision_start: str
    vision_end: str
    image_pad: str
    video_pad: str
    end_of_turn: str
    pad: str  # the padding token the collator uses (Qwen: <|endoftext|>)
    # A reasoning template (MindSpeed-MM's ReasoningTemplate): the (open, close) thought words; None: plain.
    thought_words: tuple[str, str] | None = None
    # Qwen3-VL's video layout: each frame (temporal patch) as "<t seconds>" + its own vision block
    timestamped_video: bool = False

    @property
    def empty_thought(self) -> str:
        """The empty thought a reasoning template puts before an answer that has none: `<think>\n\n</think>\n\n`."""
        return f"{self.thought_words[0]}\n\n{self.thought_words[1]}\n\n" if self.thought_words else ""

    def remove_thought(self, content: str) -> str:
        """`content` without its thoughts (open ... close, across lines) and the newlines that then lead it."""
        if not self.thought_words:
            return content
        opening, closing = (re.escape(word) for word in self.thought_words)
        return re.sub(f"{opening}(.*?){closing}", "", content, flags=re.DOTALL).lstrip("\n")

    @property
    def special_tokens(self) -> dict[str, str]:
        """Name -> token string, for every token this template needs from the tokenizer."""
        return {"vision_start": self.vision_start, "vision_end": self.vision_end, "image_pad": self.image_pad,
                "video_pad": self.video_pad, "end_of_turn": self.end_of_turn, "pad": self.pad}


QWEN2VL = ChatTemplate(
    name="qwen2vl",
    slots={
        USER: "<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n",
        ASSISTANT: "{content}<|im_end|>\n",
        OBSERVATION: "<|im_start|>tool\n{content}<|im_end|>\n<|im_start|>assistant\n",
    },
    system_slot="<|im_start|>system\n{content}<|im_end|>\n",
    default_system="You are a helpful assistant.",
    vision_start="<|vision_start|>",
    vision_end="<|vision_end|>",
    image_pad="<|image_pad|>",
    video_pad="<|video_pad|>",
    end_of_turn="<|im_end|>",
    pad="<|endoftext|>",
)

# Qwen3-VL (MindSpeed-MM's template.py, "copied from qwen template"): no default system prompt, tool results
# come back as a user turn; "qwen3_vl" is a reasoning template (an answer without <think>...</think> is
# trained with an empty thought before it), "qwen3_vl_nothink" a plain one.
_QWEN3_VL_SLOTS = {
    USER: "<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n",
    ASSISTANT: "{content}<|im_end|>\n",
    OBSERVATION: "<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
}
QWEN3_VL_NOTHINK = ChatTemplate(
    name="qwen3_vl_nothink",
    slots=_QWEN3_VL_SLOTS,
    system_slot=QWEN2VL.system_slot,
    default_system="",
    vision_start=QWEN2VL.vision_start,
    vision_end=QWEN2VL.vision_end,
    image_pad=QWEN2VL.image_pad,
    video_pad=QWEN2VL.video_pad,
    end_of_turn=QWEN2VL.end_of_turn,
    pad=QWEN2VL.pad,
    timestamped_video=True,
)
QWEN3_VL = dataclasses.replace(QWEN3_VL_NOTHINK, name="qwen3_vl", thought_words=("<think>", "</think>"))

# Qwen2.5-Omni (MindSpeed-MM's "qwen2_omni"): Qwen3-VL's slots with Qwen2-VL's default system prompt, and the Omni
# tokenizer's names for the vision tokens; audio blocks (<|audio_bos|> <|AUDIO|>* <|audio_eos|>): data/multimodal/omni.py
QWEN2_OMNI = dataclasses.replace(QWEN3_VL_NOTHINK, name="qwen2_omni", default_system=QWEN2VL.default_system,
                                 vision_start="<|vision_bos|>", vision_end="<|vision_eos|>", image_pad="<|IMAGE|>",
                                 video_pad="<|VIDEO|>", timestamped_video=False)

# MindSpeed-MM's `basic_parameters.template` names. Qwen2.5-VL's examples use "qwen2vl" too.
TEMPLATES: dict[str, ChatTemplate] = {t.name: t for t in (QWEN2VL, QWEN3_VL, QWEN3_VL_NOTHINK, QWEN2_OMNI)}


class TextTokenizer(Protocol):
    def tokenize(self, text: str) -> list[int]: ...


def expand_placeholders(messages: Sequence[dict], template: ChatTemplate, image_tokens: Sequence[int],
                        video_tokens: Sequence[Any]) -> list[dict]:
    """Copies of `messages` with the i-th `<image>` (`<video>`) replaced by its vision block of
    `image_tokens[i]` (`video_tokens[i]`) pad tokens; counts are grid_t*grid_h*grid_w // merge_size**2. With a
    template's timestamped_video (Qwen3-VL), `video_tokens[i]` is a list of (seconds, tokens) per frame: each frame
    becomes `<{seconds:.1f} seconds>` + its own vision block, as transformers' Qwen3VLProcessor writes it."""
    images, videos = iter(image_tokens), iter(video_tokens)

    def block(pad: str, count: Any) -> str:
        if isinstance(count, (int, np.integer)):
            return f"{template.vision_start}{pad * int(count)}{template.vision_end}"
        return "".join(f"<{seconds:.1f} seconds>{block(pad, tokens)}" for seconds, tokens in count)

    out = []
    for message in messages:
        content = message["content"]
        for placeholder, pad, counts in ((IMAGE_PLACEHOLDER, template.image_pad, images),
                                         (VIDEO_PLACEHOLDER, template.video_pad, videos)):
            pieces = content.split(placeholder)
            content = pieces[0] + "".join(f"{block(pad, next(counts))}{piece}" for piece in pieces[1:])
        out.append({**message, "content": content})
    return out


def frame_timestamps(frames: int, fps: float, temporal_patch_size: int) -> list[float]:
    """Seconds of each temporal patch of a video of `frames` frames sampled at `fps`: the mean of its first and last
    frame's times, the last frame repeated to fill the last patch (transformers' Qwen3VLProcessor's timestamps)."""
    indices = list(range(frames))
    indices += [indices[-1]] * (-frames % temporal_patch_size)
    times = [i / fps for i in indices]
    return [(times[i] + times[i + temporal_patch_size - 1]) / 2 for i in range(0, len(times), temporal_patch_size)]


def infer_seqlen(source_len: int, target_len: int, cutoff_len: int) -> tuple[int, int]:
    """LLaMA-Factory's split of `cutoff_len` between a prompt (source) and its answer (target)."""
    if target_len * 2 < cutoff_len:  # the answer fits in half: cut the prompt
        max_target_len = cutoff_len
    elif source_len * 2 < cutoff_len:  # the prompt fits in half: cut the answer
        max_target_len = cutoff_len - source_len
    else:  # both long: share in proportion
        max_target_len = int(cutoff_len * (target_len / (source_len + target_len)))
    new_target_len = min(max_target_len, target_len)
    new_source_len = min(max(cutoff_len - new_target_len, 0), source_len)
    return new_source_len, new_target_len


def encode_conversation(tokenizer: TextTokenizer, messages: Sequence[dict], template: ChatTemplate,
                        cutoff_len: int, system: str | None = None, train_on_prompt: bool = False,
                        mask_history: bool = False, enable_thinking: bool = True) -> tuple[list[int], list[int]]:
    """(input_ids, labels) of a conversation of alternating prompt/answer messages (roles already mapped, an
    even count, placeholders already expanded); `system` None or "" means the template's default.

    A reasoning template (thought_words) does what MindSpeed-MM's ReasoningTemplate.encode_multiturn does: an
    answer holding no thought word gets the empty thought, tokenized on its own, before it (trained on) with
    `enable_thinking`, else at the end of its prompt (not trained on), every thought removed from the answers
    first. MindSpeed-MM's data.json `enable_thinking` never reaches its template, whose True always applies."""
    system = system or template.default_system
    if template.thought_words and not enable_thinking:
        messages = [{**m, "content": template.remove_thought(m["content"])} if i % 2 else m
                    for i, m in enumerate(messages)]
    encoded = []
    for index, message in enumerate(messages):
        text = template.system_slot.format(content=system) if index == 0 and system else ""
        text += template.slots[message["role"]].format(content=message["content"])
        encoded.append(tokenizer.tokenize(text))
    if template.thought_words:
        thought = tokenizer.tokenize(template.empty_thought)
        for i in range(0, len(messages) - 1, 2):
            if not any(word in messages[i + 1]["content"] for word in template.thought_words):
                if enable_thinking:
                    encoded[i + 1] = thought + encoded[i + 1]
                else:
                    encoded[i] = encoded[i] + thought
    pairs = [(encoded[i], encoded[i + 1]) for i in range(0, len(encoded), 2)]
    if mask_history:
        pairs = pairs[::-1]  # the last turn first: it is the one trained on, and it must survive the cut-off
    input_ids: list[int] = []
    labels: list[int] = []
    total = 0
    for turn, (source, target) in enumerate(pairs):
        if total >= cutoff_len:
            break
        source_len, target_len = infer_seqlen(len(source), len(target), cutoff_len - total)
        source, target = source[:source_len], target[:target_len]
        total += source_len + target_len
        source_labels = list(source) if train_on_prompt else [IGNORE_INDEX] * source_len
        target_labels = [IGNORE_INDEX] * target_len if mask_history and turn != 0 else list(target)
        if mask_history:
            input_ids = source + target + input_ids
            labels = source_labels + target_labels + labels
        else:
            input_ids += source + target
            labels += source_labels + target_labels
    return input_ids, labels
