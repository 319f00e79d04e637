"""Byte-offset edits: the only bytes a translation changes; every other byte of the script is copied as it was."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class Edit:
    start: int
    end: int  # start == end: an insertion
    new: bytes

    @property
    def is_insertion(self) -> bool:
        return self.start == self.end


class EditConflict(ValueError):
    """Two rewrites want different bytes in the same place (e.g. one variable used by two launch lines)."""

    def __init__(self, first: Edit, second: Edit):
        self.first, self.second = first, second
        super().__init__(f"two rewrites overlap at bytes {second.start}..{second.end}")


def normalise(edits: Iterable[Edit]) -> list[Edit]:
    """Edits in application order, identical duplicates merged (two launch lines sharing one variable ask for the
    same rewrite); insertions at one offset keep their given order."""
    ordered: list[Edit] = []
    seen: set[Edit] = set()
    for edit in edits:
        if edit.start > edit.end:
            raise ValueError(f"edit ends before it starts: {edit}")
        if edit in seen:
            continue
        seen.add(edit)
        ordered.append(edit)
    # Stable sort: at one offset an insertion comes before a replacement starting there.
    ordered = [e for _, e in sorted(enumerate(ordered), key=lambda item: (item[1].start, item[1].end > item[1].start, item[0]))]
    for previous, current in zip(ordered, ordered[1:]):
        if current.start < previous.end:
            raise EditConflict(previous, current)
    return ordered


def apply_edits(source: bytes, edits: Iterable[Edit]) -> bytes:
    out: list[bytes] = []
    position = 0
    for edit in normalise(edits):
        out.append(source[position:edit.start])
        out.append(edit.new)
        position = edit.end
    out.append(source[position:])
    return b"".join(out)
