"""Whether two Hugging Face directories hold the same tensors, byte for byte (bf16 compared as its bits)."""
import sys
from pathlib import Path

from mmrun.checkpoint.formats.safetensors import read_safetensors


def tensors(folder):
    out = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        out.update(read_safetensors(file))
    return out


a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
same = sorted(a) == sorted(b) and all(a[n].dtype == b[n].dtype and a[n].tobytes() == b[n].tobytes() for n in a)
print(f"{len(a)} tensors ({', '.join(sorted({str(t.dtype) for t in a.values()}))}); the same bytes: {same}")
