"""The table of MindSpeed-MM's example-file keys (features/mindspeed_mm_keys.yaml): what mmrun does with each.

    table = load_key_table()
    table.entry("wan_extract_data", "dataset_param.preprocess_parameters.cfg")  # Entry(verdict="refused", accept=...)
    table.keys_of("fsdp2", "refused")                 # the keys a reader refuses
    table.refusal("wan_extract_data", "dataset_param.preprocess_parameters.cfg", 0.1, where="data.json")  # or None
    list(walk_keys({"a": {"b": [{"c": 1}]}}))        # ["a", "a.b", "a.b[].c"]

No framework is imported; the readers (model / data / FSDP2 files) and the docs page take their verdicts here.
"""
from __future__ import annotations

import fnmatch
import functools
import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from mmrun.common.yaml_tables import TableError, check_keys, load_yaml

TABLE = Path(__file__).with_name("mindspeed_mm_keys.yaml")
VERDICTS = ("honoured", "refused", "no_effect", "flag")
_BRACES = re.compile(r"\{([^{}]*)\}")


@dataclass(frozen=True)
class Entry:
    key: str
    verdict: str
    why: str
    accept: tuple = ()  # for "refused": values that are accepted (no effect)
    when: str = ""  # for "refused": the condition, where the reader decides it (not the value alone)


@dataclass(frozen=True)
class Kind:
    name: str
    title: str
    files: tuple[str, ...]
    readers: tuple[str, ...]
    includes: tuple[tuple[str, str], ...]  # (prefix, kind)
    entries: dict[str, Entry]
    fixed: dict[str, dict[str, Any]]  # model_id -> key -> the only value mmrun builds (refused keys with `when`)


def expand(pattern: str) -> list[str]:
    """`a.{b,c}.d` -> [a.b.d, a.c.d]; several braces give every combination."""
    parts = _BRACES.split(pattern)
    literals, choices = parts[0::2], [p.split(",") for p in parts[1::2]]
    out = []
    for combo in itertools.product(*choices):
        text = literals[0]
        for choice, literal in zip(combo, literals[1:]):
            text += choice.strip() + literal
        out.append(text)
    return out


def walk_keys(value: Any, prefix: str = "") -> Iterator[str]:
    """Every key path of a parsed json/yaml value: `.` between levels, `[]` for the items of a list."""
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            yield path
            yield from walk_keys(item, path)
    elif isinstance(value, list):
        for item in value:
            yield from walk_keys(item, prefix + "[]")


@dataclass(frozen=True)
class KeyTable:
    kinds: dict[str, Kind]

    def entry(self, kind: str, key: str) -> Entry | None:
        """The verdict on `key` in a file of `kind` (its includes searched after its own groups)."""
        own = self.kinds[kind]
        if key in own.entries:
            return own.entries[key]
        for prefix, other in own.includes:
            if key.startswith(prefix):
                found = self.entry(other, key[len(prefix):])
                if found is not None:
                    return found
        return None

    def keys_of(self, kind: str, verdict: str) -> tuple[str, ...]:
        return tuple(k for k, e in self.kinds[kind].entries.items() if e.verdict == verdict)

    def kind_of_file(self, relative: str) -> str | None:
        """The kind whose `files` patterns match a path relative to tests/fixtures/mindspeed_mm/."""
        hits = [k.name for k in self.kinds.values() if any(fnmatch.fnmatch(relative, p) for p in k.files)]
        if len(hits) > 1:
            raise TableError(f"{TABLE}: {relative} matches the files of several kinds: {', '.join(hits)}")
        return hits[0] if hits else None

    def refusal(self, kind: str, key: str, value: Any, where: str) -> str | None:
        """The one-line message that stops a job for `key: value`, or None when the table accepts the value."""
        found = self.entry(kind, key)
        if found is None or found.verdict != "refused" or found.when or (found.accept and value in found.accept):
            return None
        accepted = f" (accepted: {', '.join(map(_json, found.accept))})" if found.accept else ""
        shown = _json(value)
        shown = shown if len(shown) <= 60 else ("a section" if isinstance(value, dict) else shown[:57] + "...")
        return f"{where + ': ' if where else ''}{key}: {shown} is refused{accepted}: {found.why}"


def _load(path: Path) -> KeyTable:
    data = check_keys(str(path), load_yaml(path), required=("verdicts", "kinds"))
    if set(data["verdicts"]) != set(VERDICTS):
        raise TableError(f"{path}: verdicts must be exactly {', '.join(VERDICTS)}")
    kinds = {}
    for name, raw in data["kinds"].items():
        where = f"{path}: kinds.{name}"
        check_keys(where, raw, required=("title", "files", "readers", "groups"), optional=("includes", "fixed"))
        entries: dict[str, Entry] = {}
        for index, group in enumerate(raw["groups"]):
            at = f"{where}.groups[{index}]"
            check_keys(at, group, required=("verdict", "why", "keys"), optional=("accept", "when"))
            if group["verdict"] not in VERDICTS:
                raise TableError(f"{at}: verdict {group['verdict']!r} is not one of {', '.join(VERDICTS)}")
            if ("accept" in group or "when" in group) and group["verdict"] != "refused":
                raise TableError(f"{at}: accept and when go only with verdict refused")
            for pattern in group["keys"]:
                for key in expand(str(pattern)):
                    if key in entries:
                        raise TableError(f"{at}: key {key!r} is listed twice in kind {name}")
                    entries[key] = Entry(key, group["verdict"], " ".join(str(group["why"]).split()),
                                         tuple(group.get("accept") or ()), str(group.get("when", "")))
        includes = tuple((str(i["prefix"]), str(i["kind"])) for i in raw.get("includes") or ())
        fixed = {str(model): dict(values) for model, values in (raw.get("fixed") or {}).items()}
        for model, values in fixed.items():
            for key in values:
                if key not in entries or not entries[key].when:
                    raise TableError(f"{where}.fixed.{model}: {key!r} is not a refused key with a `when` of the kind")
        kinds[name] = Kind(name, raw["title"], tuple(raw["files"]), tuple(raw["readers"]), includes, entries, fixed)
    for kind in kinds.values():
        for _, other in kind.includes:
            if other not in kinds:
                raise TableError(f"{path}: kinds.{kind.name} includes unknown kind {other!r}")
    return KeyTable(kinds)


@functools.lru_cache(maxsize=None)
def load_key_table(path: str | None = None) -> KeyTable:
    return _load(Path(path) if path else TABLE)


def check_values(kind: str, data: Any, where: str, table: KeyTable | None = None) -> list[str]:
    """The one-line refusals for the refused keys of a parsed file whose values the table does not accept
    (empty: nothing stops). Keys inside lists are judged per item."""
    table = table or load_key_table()
    out = []
    for key, value in _key_values(data):
        message = table.refusal(kind, key, value, where)
        if message:
            out.append(message)
    return out


def fixed_refusals(kind: str, data: Any, model_id: str, where: str, table: KeyTable | None = None) -> list[str]:
    """The one-line refusals for family-fixed keys (the kind's `fixed` for `model_id`) whose value is another."""
    table = table or load_key_table()
    fixed = table.kinds[kind].fixed.get(model_id, {})
    out = []
    for key, value in _key_values(data):
        if key in fixed and value != fixed[key]:
            out.append(f"{where + ': ' if where else ''}{key}: {_json(value)} describes another model: mmrun builds "
                       f"{model_id}'s architecture, where it is {_json(fixed[key])} (every MindSpeed-MM example); "
                       "set it so or leave it out")
    return out


def _key_values(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            yield path, item
            yield from _key_values(item, path)
    elif isinstance(value, list):
        for item in value:
            yield from _key_values(item, prefix + "[]")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_tables(table: KeyTable | None = None) -> str:
    """docs/mindspeed-mm-keys.md's tables: one section per kind of file, one row per key."""
    table = table or load_key_table()
    parts = []
    for kind in table.kinds.values():
        files = ", ".join(f"`{f}`" for f in kind.files)
        readers = ", ".join(f"`{r}`" for r in kind.readers) or "none (see the rows)"
        lines = [f"### `{kind.name}`: {kind.title}", "", f"Files: {files}. Read by: {readers}."]
        for prefix, other in kind.includes:
            lines.append(f"Keys not listed here are judged as in `{other}`"
                         + (f" under `{prefix}`" if prefix else "") + ".")
        lines += ["", "| key | mmrun | why |", "|---|---|---|"]
        for entry in kind.entries.values():
            verdict = entry.verdict.replace("_", " ")
            if entry.accept:
                verdict += " (accepted: " + ", ".join(_json(v) for v in entry.accept) + ")"
            if entry.when:
                verdict += f" when {entry.when}"
            lines.append(f"| `{_cell(entry.key)}` | {verdict} | {_cell(entry.why)} |")
        if kind.fixed:
            models = list(kind.fixed)
            keys = list(dict.fromkeys(k for values in kind.fixed.values() for k in values))
            lines += ["", f"The fixed values of `{kind.name}` by model_id (another value stops the job):", "",
                      "| key | " + " | ".join(f"`{m}`" for m in models) + " |", "|---|" + "---|" * len(models)]
            lines += [f"| `{k}` | " + " | ".join(_json(kind.fixed[m][k]) if k in kind.fixed[m] else "-" for m in models)
                      + " |" for k in keys]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def _json(value: Any) -> str:
    import json

    return json.dumps(value)


def report(kind: str, data: Any, where: str, table: KeyTable | None = None) -> tuple[list[str], int]:
    """(lines, exit code) for `python -m mmrun.features.mindspeed_keys`: each key of a file and what mmrun does
    with it at the file's value; exit 2 when a value would stop the job."""
    table = table or load_key_table()
    seen: dict[str, str] = {}
    for key, value in _key_values(data):
        entry = table.entry(kind, key)
        if entry is None:
            verdict = "not in the table (see docs/mindspeed-mm-keys.md)"
        elif entry.verdict == "refused" and entry.when:
            verdict = f"refused when {entry.when}"
        elif entry.verdict == "refused" and entry.accept and value in entry.accept:
            verdict = f"accepted at {_json(value)} (other values are refused)"
        else:
            verdict = entry.verdict.replace("_", " ")
        seen.setdefault(key, verdict)
    refusals = check_values(kind, data, where, table)
    lines = [f"{key}: {verdict}" for key, verdict in seen.items()] + [f"refused: {line}" for line in refusals]
    counts = {name: sum(1 for v in seen.values() if v.startswith(name))
              for name in ("honoured", "flag", "no effect", "accepted", "refused", "not in the table")}
    lines.append(f"{where}: {len(seen)} keys: " + ", ".join(f"{n} {name}" for name, n in counts.items() if n)
                 + ("; the job would stop" if refusals else ""))
    return lines, 2 if refusals else 0


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import sys

    table = load_key_table()
    parser = argparse.ArgumentParser(prog="python -m mmrun.features.mindspeed_keys",
                                     description="Say what mmrun does with each key of MindSpeed-MM json/yaml files "
                                                 "(features/mindspeed_mm_keys.yaml; docs/mindspeed-mm-keys.md).")
    parser.add_argument("kind", choices=sorted(table.kinds), help="the kind of file")
    parser.add_argument("files", nargs="+", metavar="FILE")
    args = parser.parse_args(argv)
    code = 0
    for name in args.files:
        path = Path(name)
        try:
            text = path.read_text(encoding="utf-8")
            data = json.loads(text) if path.suffix == ".json" else load_yaml(path)
        except (OSError, ValueError) as err:
            print(f"{name}: cannot be read ({err})", file=sys.stderr)
            return 2
        lines, status = report(args.kind, data, name, table)
        print("\n".join(lines))
        code = max(code, status)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
