"""The feature gate: one table (features.yaml) says what mmrun's models support per framework x device.

Three users, one table:
- the training entry calls `gate(args, framework, device, on_unsupported)` right after parsing,
  before a model is built; it raises `FeatureGateError` (exit 2) or returns the decisions and the
  argument values to switch features off / substitute;
- `mmrun translate` calls `check_flags(tokens, framework, device)` on a script's training arguments
  and gets, per triggering flag, the token span it came from;
- `mmrun features` and docs/features.md render the table.

No framework is imported here: the caller passes the framework and device (for example from
`mmrun.backend.current()`), so the launcher commands work with neither framework installed.

    >>> from mmrun.backend.features import gate, FeatureGateError
    >>> try:
    ...     gate({"use_flash_attn": True}, "mindspore", "cpu")
    ... except FeatureGateError as err:
    ...     print(err.lines[0].split(" is ")[0])
    --use-flash-attn (flash attention)
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import re
import sys
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence, TextIO

from mmrun.backend.vocabulary import DEVICES, FRAMEWORKS
from mmrun.backend.vocabulary import device_kind as normalise_device
from mmrun.backend.vocabulary import framework_name as normalise_framework
from mmrun.common.yaml_tables import TableError, check_keys, load_yaml

TABLE_PATH = Path(__file__).with_name("features.yaml")

STATUSES: tuple[str, ...] = ("supported", "unsupported", "fallback")
POLICIES: tuple[str, ...] = ("error", "warn")


_ENTRY_KEYS = {"title", "group", "triggers", "companions", "support"}
_REQUIRED_ENTRY_KEYS = {"title", "group", "triggers", "support"}
_TRIGGER_KEYS = {"flag", "when", "takes", "off_value", "dest"}
_COMPANION_KEYS = {"flag", "takes"}
_CELL_KEYS = {"status", "reason", "hint", "min_version", "substitute"}
_WHEN_KINDS = {"gt", "in", "matches", "set"}
_TAKES = (0, 1, "+")


class FeatureTableError(TableError):
    """features.yaml breaks the schema; the message names the file and the entry."""


class FeatureGateError(Exception):
    """The training arguments ask for something this framework/device cannot do.

    `lines` holds one line per feature (flag as received, framework, device, reason, hint); the
    training entry prints them and exits with `exit_code`.
    """

    exit_code = 2

    def __init__(self, lines: Sequence[str], decisions: Sequence["Decision"]):
        self.lines = list(lines)
        self.decisions = list(decisions)
        super().__init__("\n".join(self.lines))


# ------------------------------------------------------------------------------------- the table

@dataclass(frozen=True)
class Trigger:
    flag: str
    when: tuple[str, Any] | None  # None: a switch; else (kind, argument) with kind in _WHEN_KINDS
    takes: int | str
    off: Any
    dest: str

    def describe(self) -> str:
        """How the flag reads in docs: `--bf16`, `--tensor-model-parallel-size > 1`, `--x a|b`."""
        if self.when is None:
            return self.flag
        kind, arg = self.when
        if kind == "gt":
            return f"{self.flag} > {arg}"
        if kind == "in":
            return f"{self.flag} {'|'.join(arg)}"
        if kind == "matches":
            return f"{self.flag} DEV:BACKEND,..." if ":" in arg.pattern else f"{self.flag} /{arg.pattern}/"
        return f"{self.flag} {'VALUE...' if self.takes == '+' else 'VALUE'}"

    def example_tokens(self) -> list[str]:
        """One argv that turns this trigger on (tests and docs use it)."""
        if self.when is None:
            return [self.flag]
        kind, arg = self.when
        if kind == "gt":
            return [self.flag, str(arg + 1)]
        if kind == "in":
            return [self.flag, arg[0]]
        if kind == "matches":
            return [self.flag, "npu:hccl,cpu:gloo"]
        return [self.flag, "2"] if self.takes == 1 else [self.flag, "linear_qkv", "linear_proj"]

    def fires(self, value: Any) -> bool:
        """Whether an argument value turns the feature on."""
        if self.when is None:
            return bool(value)
        if value is None or value is False:
            return False
        kind, arg = self.when
        if kind == "set":
            return value != "" and value != [] and value != ()
        if kind == "gt":
            try:
                return float(value) > arg
            except (TypeError, ValueError):
                return False
        if kind == "in":
            return str(value) in arg
        return arg.fullmatch(str(value)) is not None


@dataclass(frozen=True)
class Companion:
    flag: str
    takes: int | str


@dataclass(frozen=True)
class Cell:
    status: str
    reason: str
    hint: str | None = None
    min_version: str | None = None
    substitute: Any = None
    has_substitute: bool = False  # substitute may legitimately be False or None


@dataclass(frozen=True)
class Entry:
    name: str
    title: str
    group: str
    triggers: tuple[Trigger, ...]
    companions: tuple[Companion, ...]
    cells: Mapping[tuple[str, str], Cell]  # (framework, device) -> cell, complete

    @property
    def flags(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.flag for t in self.triggers))

    def describe_flags(self) -> str:
        return ", ".join(t.describe() for t in self.triggers)

    def cell(self, framework: str, device: str) -> Cell:
        return self.cells[(normalise_framework(framework), normalise_device(device))]


@dataclass(frozen=True)
class FeatureTable:
    entries: tuple[Entry, ...]
    path: Path

    def get(self, name: str) -> Entry:
        for entry in self.entries:
            if entry.name == name:
                return entry
        raise KeyError(f"no feature entry named {name!r} in {self.path}")

    def triggers_for(self, flag: str) -> list[tuple[Entry, Trigger]]:
        return [(e, t) for e in self.entries for t in e.triggers if t.flag == flag]

    def companion_flags(self) -> dict[str, list[tuple[Entry, Companion]]]:
        found: dict[str, list[tuple[Entry, Companion]]] = {}
        for entry in self.entries:
            for comp in entry.companions:
                found.setdefault(comp.flag, []).append((entry, comp))
        return found


def load_table(path: str | Path | None = None) -> FeatureTable:
    """Load and validate a feature table (default: backend/features.yaml, cached)."""
    if path is None:
        return _default_table()
    return _load(Path(path))


@functools.lru_cache(maxsize=1)
def _default_table() -> FeatureTable:
    return _load(TABLE_PATH)


def _load(path: Path) -> FeatureTable:
    try:
        raw = load_yaml(path)
    except TableError as err:
        raise FeatureTableError(str(err)) from None
    if not isinstance(raw, dict) or set(raw) != {"features"} or not isinstance(raw["features"], dict):
        keys = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
        raise FeatureTableError(f"{path}: expected one top-level key 'features' holding a mapping. Received: {keys}")
    entries = tuple(_parse_entry(path, name, body) for name, body in raw["features"].items())
    _check_overlaps(path, entries)
    return FeatureTable(entries=entries, path=path)


def _fail(path: Path, name: str, message: str) -> FeatureTableError:
    return FeatureTableError(f"{path}: entry {name!r}: {message}")


def _check_keys(path: Path, name: str, where: str, mapping: Any, allowed: set[str]) -> dict:
    try:
        return check_keys(f"{path}: entry {name!r}: {where}", mapping, optional=allowed)
    except TableError as err:
        raise FeatureTableError(str(err)) from None


def _check_flag(path: Path, name: str, flag: Any) -> str:
    if not isinstance(flag, str) or not re.fullmatch(r"--[a-z0-9][a-z0-9-]*", flag):
        raise _fail(path, name, f"flag must be spelled --lower-case-with-dashes. Received: {flag!r}")
    return flag


def _check_takes(path: Path, name: str, takes: Any) -> int | str:
    if takes not in _TAKES or isinstance(takes, bool):
        raise _fail(path, name, f"takes must be 0, 1 or '+'. Received: {takes!r}")
    return takes


def _parse_entry(path: Path, name: str, body: Any) -> Entry:
    if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
        raise FeatureTableError(f"{path}: entry names are lower-case-with-dashes. Received: {name!r}")
    _check_keys(path, name, "the entry", body, _ENTRY_KEYS)
    missing = sorted(_REQUIRED_ENTRY_KEYS - set(body))
    if missing:
        raise _fail(path, name, f"missing key {missing[0]!r}")
    for key in ("title", "group"):
        if not isinstance(body[key], str) or not body[key].strip() or "\n" in body[key]:
            raise _fail(path, name, f"{key} must be a one-line string. Received: {body[key]!r}")
    if not isinstance(body["triggers"], list) or not body["triggers"]:
        raise _fail(path, name, "triggers must be a non-empty list")
    triggers = tuple(_parse_trigger(path, name, t) for t in body["triggers"])
    companions = tuple(_parse_companion(path, name, c) for c in body.get("companions") or [])
    cells = _parse_support(path, name, body["support"])
    return Entry(name=name, title=body["title"], group=body["group"], triggers=triggers,
                 companions=companions, cells=cells)


def _parse_trigger(path: Path, name: str, raw: Any) -> Trigger:
    _check_keys(path, name, "a trigger", raw, _TRIGGER_KEYS)
    if "flag" not in raw:
        raise _fail(path, name, "a trigger has no 'flag'")
    flag = _check_flag(path, name, raw["flag"])
    when = _parse_when(path, name, flag, raw.get("when"))
    takes = _check_takes(path, name, raw.get("takes", 0 if when is None else 1))
    if when is None and takes != 0:
        raise _fail(path, name, f"{flag} takes a value, so it needs a 'when' condition (for example {{set: true}})")
    if when is not None and takes == 0:
        raise _fail(path, name, f"{flag} has a 'when' condition, so it must take a value")
    if "off_value" in raw:
        off = raw["off_value"]
    else:
        off = False if when is None else (when[1] if when[0] == "gt" else None)
    dest = raw.get("dest", flag[2:].replace("-", "_"))
    if not isinstance(dest, str) or not dest.isidentifier():
        raise _fail(path, name, f"dest must be a Python identifier. Received: {dest!r}")
    return Trigger(flag=flag, when=when, takes=takes, off=off, dest=dest)


def _parse_when(path: Path, name: str, flag: str, raw: Any) -> tuple[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in _WHEN_KINDS:
        raise _fail(path, name, f"{flag}: when must be one of {{gt: N}}, {{in: [..]}}, {{matches: REGEX}}, {{set: true}}. Received: {raw!r}")
    kind, arg = next(iter(raw.items()))
    if kind == "gt" and (isinstance(arg, bool) or not isinstance(arg, (int, float))):
        raise _fail(path, name, f"{flag}: gt needs a number. Received: {arg!r}")
    if kind == "in":
        if not isinstance(arg, list) or not arg or not all(isinstance(v, str) for v in arg):
            raise _fail(path, name, f"{flag}: in needs a non-empty list of strings. Received: {arg!r}")
        arg = tuple(arg)
    if kind == "matches":
        try:
            arg = re.compile(arg)
        except (re.error, TypeError) as err:
            raise _fail(path, name, f"{flag}: matches needs a regular expression ({err}). Received: {arg!r}") from None
    if kind == "set" and arg is not True:
        raise _fail(path, name, f"{flag}: set takes only true. Received: {arg!r}")
    return kind, arg


def _parse_companion(path: Path, name: str, raw: Any) -> Companion:
    _check_keys(path, name, "a companion", raw, _COMPANION_KEYS)
    if "flag" not in raw:
        raise _fail(path, name, "a companion has no 'flag'")
    return Companion(flag=_check_flag(path, name, raw["flag"]), takes=_check_takes(path, name, raw.get("takes", 1)))


def _parse_cell(path: Path, name: str, key: str, raw: Any) -> Cell:
    where = f"support[{key!r}]"
    _check_keys(path, name, where, raw, _CELL_KEYS)
    status = raw.get("status")
    if status not in STATUSES:
        raise _fail(path, name, f"{where}: unknown status {status!r} (allowed: {', '.join(STATUSES)})")
    for text_key in ("reason", "hint"):
        text = raw.get(text_key)
        needed = text_key == "reason" or status != "supported"
        if text is None and needed:
            raise _fail(path, name, f"{where}: missing {text_key} (every {status} cell needs one)")
        if text is not None and (not isinstance(text, str) or not text.strip() or "\n" in text):
            raise _fail(path, name, f"{where}: {text_key} must be a one-line string. Received: {text!r}")
    version = raw.get("min_version")
    if version is not None and (not isinstance(version, str) or _version_tuple(version) is None):
        raise _fail(path, name, f"{where}: min_version must be a quoted version such as \"2.6\". Received: {version!r}")
    if "substitute" in raw and status != "fallback":
        raise _fail(path, name, f"{where}: substitute is only meaningful on a fallback cell (status is {status})")
    return Cell(status=status, reason=raw["reason"], hint=raw.get("hint"), min_version=version,
                substitute=raw.get("substitute"), has_substitute="substitute" in raw)


def _parse_support(path: Path, name: str, raw: Any) -> dict[tuple[str, str], Cell]:
    if not isinstance(raw, dict) or not raw:
        raise _fail(path, name, "support must be a non-empty mapping of 'framework/device' cells")
    parsed: dict[tuple[str, str], Cell] = {}
    for key, body in raw.items():
        fw, _, dev = str(key).partition("/") if key != "*" else ("*", "/", "*")
        if fw not in (*FRAMEWORKS, "*") or dev not in (*DEVICES, "*"):
            raise _fail(path, name, f"unknown support key {key!r} (use framework/device with framework in "
                                    f"{', '.join(FRAMEWORKS)}, device in {', '.join(DEVICES)}, or * for any)")
        parsed[(fw, dev)] = _parse_cell(path, name, str(key), body)
    cells: dict[tuple[str, str], Cell] = {}
    for fw in FRAMEWORKS:
        for dev in DEVICES:
            if (fw, dev) in parsed:
                cells[(fw, dev)] = parsed[(fw, dev)]
                continue
            partial = [k for k in ((fw, "*"), ("*", dev)) if k in parsed]
            if len(partial) == 2:
                raise _fail(path, name, f"cells '{fw}/*' and '*/{dev}' both match {fw}/{dev}; add a '{fw}/{dev}' cell")
            if partial:
                cells[(fw, dev)] = parsed[partial[0]]
            elif ("*", "*") in parsed:
                cells[(fw, dev)] = parsed[("*", "*")]
            else:
                raise _fail(path, name, f"no support cell for {fw}/{dev} (add '{fw}/{dev}' or a wildcard)")
    return cells


def _check_overlaps(path: Path, entries: Sequence[Entry]) -> None:
    """Two entries must never claim the same flag value: the gate would report it twice, differently."""
    seen: dict[str, list[tuple[str, Trigger]]] = {}
    for entry in entries:
        for trig in entry.triggers:
            for other_name, other in seen.get(trig.flag, []):
                if _overlap(trig, other):
                    raise _fail(path, entry.name, f"{trig.describe()} overlaps entry {other_name!r} ({other.describe()})")
            seen.setdefault(trig.flag, []).append((entry.name, trig))
    for flag, claims in seen.items():
        first_name, first = claims[0]
        for other_name, other in claims[1:]:
            if (other.takes, other.dest) != (first.takes, first.dest):
                raise _fail(path, other_name, f"{flag} takes/dest differ from entry {first_name!r}; one flag parses one way")
    for entry in entries:
        for comp in entry.companions:
            if comp.flag in seen:
                raise _fail(path, entry.name, f"companion {comp.flag} is also a trigger flag; list it once")


def _overlap(a: Trigger, b: Trigger) -> bool:
    kinds = {a.when[0] if a.when else None, b.when[0] if b.when else None}
    if kinds == {"in"}:
        return bool(set(a.when[1]) & set(b.when[1]))
    if kinds == {"in", "matches"}:
        values, regex = (a.when[1], b.when[1]) if a.when[0] == "in" else (b.when[1], a.when[1])
        return any(regex.fullmatch(v) for v in values)
    # Any other pair on one flag (two switches, two thresholds, a catch-all `set`) is ambiguous.
    return True


# ------------------------------------------------------------------------------------ decisions

def _version_tuple(version: str) -> tuple[int, ...] | None:
    match = re.match(r"\d+(\.\d+)*", str(version))
    return tuple(int(p) for p in match.group(0).split(".")) if match else None


def _version_at_least(found: str, needed: str) -> bool:
    have, need = _version_tuple(found), _version_tuple(needed)
    if have is None or need is None:
        return True  # an unparseable version is not a reason to refuse
    width = max(len(have), len(need))
    return have + (0,) * (width - len(have)) >= need + (0,) * (width - len(need))


@dataclass(frozen=True)
class Decision:
    """What the table says about one flag as received, for one framework and device."""

    feature: str
    title: str
    received: str  # the flag as received: "--tensor-model-parallel-size 2"
    flag: str
    dest: str
    value: Any
    framework: str
    device: str
    status: str
    reason: str
    hint: str | None
    off: Any
    substitute: Any = None
    has_substitute: bool = False
    span: tuple[int, int] | None = None  # check_flags only: [start, stop) in the token list
    companion_spans: tuple[tuple[int, int], ...] = ()
    value_known: bool = True  # False when a script passes a shell variable ($TP)

    @property
    def automatic(self) -> bool:
        """A substitution the gate makes by itself (notice), whatever the policy."""
        return self.status == "fallback" and self.has_substitute

    @property
    def replacement(self) -> Any:
        """The argument value the job runs with instead (substitute, else the 'off' value)."""
        return self.substitute if self.has_substitute else self.off

    def replacement_tokens(self) -> list[str]:
        """Tokens to put in place of `span` (empty: remove the flag)."""
        value = self.replacement
        if isinstance(value, bool) or value is None:
            return []
        return [self.flag, str(value)]

    def line(self, policy: str = "error") -> str:
        """The one-line message: flag as received, feature, framework and device, reason, hint."""
        subject = f"{self.received} ({self.title})"
        where = f"with the {self.framework} backend on {self.device}"
        hint = f" Hint: {self.hint}." if self.hint else ""
        if self.status == "supported":
            return f"{subject} is supported {where}: {self.reason}."
        if self.automatic:
            using = " ".join(self.replacement_tokens()) or f"{self.flag} off"
            return f"{subject} is not available {where}; using {using} instead: {self.reason}."
        if self.status == "fallback" and policy == "warn":
            return f"{subject} is not supported {where}; running with it off: {self.reason}.{hint}"
        if self.status == "fallback":
            hint += " To run with it off, pass --on-unsupported warn."
        return f"{subject} is not supported {where}: {self.reason}.{hint}"


def _decide(entry: Entry, trig: Trigger, received: str, value: Any, framework: str, device: str,
            framework_version: str | None, **extra: Any) -> Decision:
    cell = entry.cells[(framework, device)]
    status, reason = cell.status, cell.reason
    if cell.min_version and framework_version and not _version_at_least(framework_version, cell.min_version):
        status = "unsupported"
        reason = f"needs {framework} >= {cell.min_version}, found {framework_version} ({cell.reason})"
    hint = cell.hint
    if status != cell.status:
        hint = f"upgrade {framework} to {cell.min_version} or newer, or drop {trig.flag}"
    has_sub = cell.has_substitute and status == "fallback"
    return Decision(feature=entry.name, title=entry.title, received=received, flag=trig.flag, dest=trig.dest,
                    value=value, framework=framework, device=device, status=status, reason=reason, hint=hint,
                    off=trig.off, substitute=cell.substitute if has_sub else None, has_substitute=has_sub, **extra)


def _received(trig: Trigger, value: Any) -> str:
    if trig.when is None:
        return trig.flag
    if isinstance(value, (list, tuple)):
        return " ".join([trig.flag, *map(str, value)])
    return f"{trig.flag} {value}"


def decide_args(args: argparse.Namespace | Mapping[str, Any], framework: str, device: str,
                framework_version: str | None = None, table: FeatureTable | None = None) -> list[Decision]:
    """Every table entry the parsed arguments turn on, with the table's verdict (no policy applied)."""
    table = table or load_table()
    framework, device = normalise_framework(framework), normalise_device(device)
    values = vars(args) if isinstance(args, argparse.Namespace) else dict(args)
    decisions = []
    for entry in table.entries:
        for trig in entry.triggers:
            if trig.dest in values and trig.fires(values[trig.dest]):
                value = values[trig.dest]
                decisions.append(_decide(entry, trig, _received(trig, value), value, framework, device, framework_version))
    return decisions


@dataclass
class GateResult:
    """The gate's outcome when the job may go on."""

    framework: str
    device: str
    policy: str
    decisions: list[Decision]
    notices: list[str] = field(default_factory=list)  # substitutions, under every policy
    warnings: list[str] = field(default_factory=list)  # fallbacks switched off under --on-unsupported warn

    @property
    def supported(self) -> list[Decision]:
        return [d for d in self.decisions if d.status == "supported"]

    @property
    def changed(self) -> list[Decision]:
        """Decisions whose argument the job must run with a different value."""
        return [d for d in self.decisions if d.status == "fallback"]

    @property
    def overrides(self) -> dict[str, Any]:
        """argparse dest -> value to run with (features switched off, substitutes)."""
        return {d.dest: d.replacement for d in self.changed}

    def apply(self, args: argparse.Namespace | dict) -> argparse.Namespace | dict:
        """Write `overrides` into the parsed arguments (in place) and return them."""
        for dest, value in self.overrides.items():
            if isinstance(args, dict):
                args[dest] = value
            else:
                setattr(args, dest, value)
        return args


# stream -> lines already printed on it: a warning is said once per process, however often gate runs.
_ALREADY_SAID: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()


def gate(args: argparse.Namespace | Mapping[str, Any], framework: str, device: str,
         on_unsupported: str = "error", *, framework_version: str | None = None,
         stream: TextIO | None = sys.stderr, table: FeatureTable | None = None) -> GateResult:
    """Check parsed training arguments against the table before a model is built.

    policy "error" (default): any `unsupported` feature, and any `fallback` that would switch a
    feature off, raises FeatureGateError with one line per feature. policy "warn": such fallbacks
    are switched off with a warning (printed once per process), `unsupported` still raises.
    Substitutions that cannot change what the job computes (communication backend, checkpoint file
    format, switches of the other framework) are made under both policies with a notice.
    The caller applies the result with `result.apply(args)`.
    """
    if on_unsupported not in POLICIES:
        raise ValueError(f"on_unsupported must be one of {', '.join(POLICIES)}. Received: {on_unsupported!r}")
    decisions = decide_args(args, framework, device, framework_version, table)
    stops = [d for d in decisions if d.status == "unsupported"
             or (d.status == "fallback" and not d.automatic and on_unsupported == "error")]
    if stops:
        raise FeatureGateError([d.line(on_unsupported) for d in stops], stops)
    result = GateResult(framework=normalise_framework(framework), device=normalise_device(device),
                        policy=on_unsupported, decisions=decisions)
    for d in result.changed:
        (result.notices if d.automatic else result.warnings).append(d.line(on_unsupported))
    if stream is not None:
        said = _ALREADY_SAID.setdefault(stream, set())
        for prefix, lines in (("notice", result.notices), ("warning", result.warnings)):
            for text in lines:
                if text not in said:
                    said.add(text)
                    print(f"{prefix}: {text}", file=stream, flush=True)
    return result


def add_gate_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `--on-unsupported error|warn` (both spellings) to a training entry's parser."""
    parser.add_argument("--on-unsupported", "--on_unsupported", dest="on_unsupported", choices=POLICIES,
                        default="error", help="what to do with a feature this framework/device lacks: "
                        "error stops (exit 2); warn runs with a fallback feature off (unsupported still stops)")


# ------------------------------------------------------------------------------ script tokens

def _is_option(token: str) -> bool:
    return token.startswith("-") and not re.fullmatch(r"-\d+(\.\d*)?([eE][-+]?\d+)?", token)


def _value_unknown(token: str) -> bool:
    return "$" in token or "`" in token


def _split_option(token: str) -> tuple[str, str | None]:
    """`--foo_bar=1` -> (`--foo-bar`, `1`); Megatron spells flags with dashes, users sometimes not."""
    name, eq, value = token.partition("=")
    return "--" + name[2:].replace("_", "-"), (value if eq else None)


def _take_values(tokens: Sequence[str], start: int, takes: int | str, inline: str | None) -> tuple[list[str], int]:
    """Values of the option at tokens[start] and the index after them."""
    if takes == 0:
        return [], start + 1
    if inline is not None:
        return [inline], start + 1
    stop = start + 1
    limit = start + 2 if takes == 1 else len(tokens)
    while stop < min(limit, len(tokens)) and not _is_option(tokens[stop]):
        stop += 1
    return list(tokens[start + 1:stop]), stop


def check_flags(tokens: Sequence[str], framework: str, device: str, *, framework_version: str | None = None,
                table: FeatureTable | None = None) -> list[Decision]:
    """Decisions for the training flags in a token list, each with the token span it came from.

    `tokens` are the arguments as the shell passes them (quotes removed), e.g.
    `["--bf16", "--tensor-model-parallel-size", "2"]`. Both `--opt value` and `--opt=value` count.
    A value that is a shell expansion (`$TP`) cannot be judged: for a threshold or any-value trigger
    the decision comes with `value_known=False`; for a choice among values (`--ckpt-format $FMT`)
    there is no decision. Companion flags (`--fsdp2-config-path` of `--use-torch-fsdp2`) are listed
    in `companion_spans` of their feature's decision so a script rewrite removes them together.
    """
    table = table or load_table()
    framework, device = normalise_framework(framework), normalise_device(device)
    companions = table.companion_flags()
    decisions: list[Decision] = []
    companion_hits: dict[str, list[tuple[int, int]]] = {}
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if not token.startswith("--"):
            index += 1
            continue
        flag, inline = _split_option(token)
        triggers = table.triggers_for(flag)
        if triggers:
            takes = triggers[0][1].takes
            values, stop = _take_values(tokens, index, takes, inline)
            value: Any = values if takes == "+" else (values[0] if values else (True if takes == 0 else None))
            unknown = any(_value_unknown(v) for v in values)
            received = " ".join(tokens[index:stop])
            for entry, trig in triggers:
                if unknown and trig.when is not None and trig.when[0] in ("in", "matches"):
                    continue
                if unknown or trig.fires(value):
                    decisions.append(_decide(entry, trig, received, value, framework, device, framework_version,
                                             span=(index, stop), value_known=not unknown))
            index = stop
            continue
        if flag in companions:
            _, stop = _take_values(tokens, index, companions[flag][0][1].takes, inline)
            for owner, _ in companions[flag]:
                companion_hits.setdefault(owner.name, []).append((index, stop))
            index = stop
            continue
        index += 1
    return [_with_companions(d, companion_hits) for d in decisions]


def _with_companions(decision: Decision, hits: Mapping[str, list[tuple[int, int]]]) -> Decision:
    spans = tuple(hits.get(decision.feature, ()))
    if not spans:
        return decision
    return dataclasses.replace(decision, companion_spans=spans)


def entries_by_group(table: FeatureTable | None = None) -> dict[str, list[Entry]]:
    """Entries in table order, grouped by their `group` (for docs and `mmrun features`)."""
    grouped: dict[str, list[Entry]] = {}
    for entry in (table or load_table()).entries:
        grouped.setdefault(entry.group, []).append(entry)
    return grouped

