"""The round trip's tensors against the original's, byte for byte, and transformers loading the result."""
import sys
from pathlib import Path

import numpy as np
import torch
import transformers

from mmrun.checkpoint.formats.safetensors import read_safetensors

transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()


def tensors(folder):
    out = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        out.update(read_safetensors(file))
    return out


before, after = tensors(sys.argv[1]), tensors(sys.argv[2])
same = sorted(before) == sorted(after) and all(
    before[n].dtype == after[n].dtype and np.array_equal(before[n].view(np.uint8), after[n].view(np.uint8))
    for n in before)
print(f"{len(after)} tensors, the same bytes as {sys.argv[1]}: {same}")
loaded = transformers.Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(sys.argv[2])
original = dict(transformers.Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(sys.argv[1]).named_parameters())
print(f"transformers loads {sys.argv[2]}: {type(loaded).__name__}, {loaded.dtype}, every parameter equal: "
      f"{all(torch.equal(p, original[n]) for n, p in loaded.named_parameters())}")
