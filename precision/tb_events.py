"""Scalars out of TensorBoard event files, without tensorboard, tensorflow or protobuf.

An event file (`events.out.tfevents.*`) is a TFRecord stream: per record a little-endian uint64 length, a
masked CRC32C of the length, the bytes of one `Event` protobuf, a masked CRC32C of the bytes. The scalars
mmrun (tensorboardX), Megatron-LM and MindSpeed write are `Event{step: 2, summary: 5 {value: 1 {tag: 1,
simple_value: 2}}}`. Decoding those few fields by hand keeps `mmrun compare` free of heavy dependencies;
the CRCs are not checked (a cut-off last record is detected by its length and reported).

    read_scalars(path) -> ({tag: {step: value}}, notes)      # a file, or a directory of event files
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

EVENT_PREFIX = "events.out.tfevents"


class EventFileError(ValueError):
    """An event file that cannot be read (one line: which file, what was found, what to do)."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise EventFileError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes):
    """(field number, wire type, value) of one protobuf message; value is int, float bytes or bytes."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(data, pos)
            value, pos = data[pos:pos + size], pos + size
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise EventFileError(f"unsupported protobuf wire type {wire}")
        yield number, wire, value


def _scalars_of_event(record: bytes) -> tuple[int, list[tuple[str, float]]]:
    step, values = 0, []
    for number, wire, value in _fields(record):
        if number == 2 and wire == 0:
            step = value
        elif number == 5 and wire == 2:  # Summary
            for vnum, vwire, item in _fields(value):
                if vnum != 1 or vwire != 2:
                    continue
                tag, scalar = None, None
                for fnum, fwire, fval in _fields(item):
                    if fnum == 1 and fwire == 2:
                        tag = fval.decode("utf-8", errors="replace")
                    elif fnum == 2 and fwire == 5:
                        scalar = struct.unpack("<f", fval)[0]
                if tag is not None and scalar is not None:
                    values.append((tag, float(scalar)))
    return step, values


def event_files(path: str | os.PathLike) -> list[Path]:
    p = Path(path)
    if p.is_dir():
        return sorted(f for f in p.rglob(f"{EVENT_PREFIX}*") if f.is_file())
    return [p]


def read_scalars(path: str | os.PathLike) -> tuple[dict[str, dict[int, float]], list[str]]:
    """{tag: {step: value}} from an event file or every event file under a directory (in name order, which
    is time order: a later file, a resumed run, overrides the steps it repeats)."""
    files = event_files(path)
    if not files:
        raise EventFileError(f"{path}: no TensorBoard event files ({EVENT_PREFIX}.*) under this directory; pass "
                             "the run's --tensorboard-dir, a training log or a --metrics-file")
    scalars: dict[str, dict[int, float]] = {}
    notes: list[str] = []
    for file in files:
        data = file.read_bytes()
        pos = 0
        while pos < len(data):
            if pos + 12 > len(data):
                notes.append(f"{file.name}: a cut-off record at byte {pos} ignored")
                break
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            end = pos + 12 + length + 4
            if end > len(data):
                notes.append(f"{file.name}: a cut-off record at byte {pos} ignored")
                break
            try:
                step, values = _scalars_of_event(data[pos + 12:pos + 12 + length])
            except (EventFileError, struct.error, IndexError) as err:
                raise EventFileError(f"{file}: record at byte {pos} is not a TensorBoard event ({err}); the file is "
                                     "garbled or not an event file") from None
            for tag, value in values:
                scalars.setdefault(tag, {})[step] = value
            pos = end
    return scalars, notes
