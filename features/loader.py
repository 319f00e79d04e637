"""Read and validate the three YAML files of the feature table into `Tables`.

catalogue.yaml defines each feature and its flags once; stack.yaml and trainer.yaml each give one
layer's verdicts per framework x device. Every schema mistake is a `FeatureTableError` naming the file
and the entry. YAML is read only through `mmrun.common.yaml_tables`.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Sequence

from mmrun.backend.vocabulary import DEVICES, FRAMEWORKS
from mmrun.common.yaml_tables import TableError, check_keys, load_yaml
from mmrun.features.table import (
    ALL_COLUMNS, LAYERS, STACK, STATUSES, Cell, Companion, Feature, Layer, Source, Tables, Trigger, version_tuple,
)

HERE = Path(__file__).parent
CATALOGUE_PATH = HERE / "catalogue.yaml"
LAYER_PATHS: dict[str, Path] = {layer: HERE / f"{layer}.yaml" for layer in LAYERS}

_FEATURE_KEYS = {"title", "group", "triggers", "companions"}
_REQUIRED_FEATURE_KEYS = ("title", "group", "triggers")
_TRIGGER_KEYS = {"flag", "when", "takes", "off_value", "dest"}
_COMPANION_KEYS = {"flag", "takes"}
_CELL_KEYS = {"status", "reason", "hint", "min_version", "substitute", "source"}
_SOURCE_KEYS = {"title", "url", "section", "check"}
_WHEN_KINDS = {"gt", "in", "matches", "set"}
_TAKES = (0, 1, "+")
# What each layer's file may hold at the top, and which statuses its cells may use.
_LAYER_TOP = {STACK: ({"features", "sources"}, {"columns"}), "trainer": ({"features"}, set())}
_LAYER_STATUSES = {STACK: STATUSES, "trainer": tuple(s for s in STATUSES if s != "unknown")}


class FeatureTableError(TableError):
    """A feature table file breaks the schema; the message names the file and the entry."""


def load_tables(catalogue: str | Path | None = None, stack: str | Path | None = None,
                trainer: str | Path | None = None) -> Tables:
    """Load and validate the feature table (the shipped files by default, cached)."""
    if catalogue is None and stack is None and trainer is None:
        return _default_tables()
    return _load(Path(catalogue or CATALOGUE_PATH), {STACK: Path(stack or LAYER_PATHS[STACK]),
                                                     "trainer": Path(trainer or LAYER_PATHS["trainer"])})


@functools.lru_cache(maxsize=1)
def _default_tables() -> Tables:
    return _load(CATALOGUE_PATH, LAYER_PATHS)


def _load(catalogue: Path, layer_paths: dict[str, Path]) -> Tables:
    features = _load_catalogue(catalogue)
    names = {f.name for f in features}
    sources: dict[str, Source] = {}
    layers = {}
    for layer, path in layer_paths.items():
        raw = _read(path)
        required, optional = _LAYER_TOP[layer]
        _keys(path, "the file", raw, required, optional)
        if layer == STACK:
            sources = _parse_sources(path, raw["sources"])
        layers[layer] = _parse_layer(path, layer, raw, names, sources)
    unlisted = [f.name for f in features if not any(layer.lists(f.name) for layer in layers.values())]
    if unlisted:
        raise FeatureTableError(f"{catalogue}: entry {unlisted[0]!r}: no layer lists it (add it to "
                                f"{' or '.join(p.name for p in layer_paths.values())}, or drop it)")
    return Tables(features=features, layers=layers, sources=sources)


def _read(path: Path) -> Any:
    try:
        return load_yaml(path)
    except TableError as err:  # a YAML syntax error spans lines (the offending line, a caret): one line here
        raise FeatureTableError(" ".join(str(err).split())) from None


def _keys(path: Path, where: str, mapping: Any, required: Sequence[str] | set = (), optional: Sequence[str] | set = ()) -> dict:
    try:
        return check_keys(f"{path}: {where}", mapping, required=sorted(required), optional=sorted(optional))
    except TableError as err:
        raise FeatureTableError(str(err)) from None


def _fail(path: Path, name: str, message: str) -> FeatureTableError:
    return FeatureTableError(f"{path}: entry {name!r}: {message}")


def _one_line(path: Path, name: str, where: str, text: Any) -> str:
    if not isinstance(text, str) or not text.strip() or "\n" in text:
        raise _fail(path, name, f"{where} must be a one-line string. Received: {text!r}")
    return text


def _check_name(path: Path, name: Any) -> str:
    if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
        raise FeatureTableError(f"{path}: entry names are lower-case-with-dashes. Received: {name!r}")
    return name


# ------------------------------------------------------------------------------------ catalogue

def _load_catalogue(path: Path) -> tuple[Feature, ...]:
    raw = _read(path)
    if not isinstance(raw, dict) or set(raw) != {"features"} or not isinstance(raw["features"], dict):
        keys = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
        raise FeatureTableError(f"{path}: expected one top-level key 'features' holding a mapping. Received: {keys}")
    features = tuple(_parse_feature(path, name, body) for name, body in raw["features"].items())
    _check_overlaps(path, features)
    return features


def _parse_feature(path: Path, name: Any, body: Any) -> Feature:
    name = _check_name(path, name)
    _keys(path, f"entry {name!r}: the entry", body, optional=_FEATURE_KEYS)
    missing = [key for key in _REQUIRED_FEATURE_KEYS if key not in body]
    if missing:
        raise _fail(path, name, f"missing key {missing[0]!r}")
    title = _one_line(path, name, "title", body["title"])
    group = _one_line(path, name, "group", body["group"])
    if not isinstance(body["triggers"], list) or not body["triggers"]:
        raise _fail(path, name, "triggers must be a non-empty list")
    triggers = tuple(_parse_trigger(path, name, t) for t in body["triggers"])
    companions = tuple(_parse_companion(path, name, c) for c in body.get("companions") or [])
    return Feature(name=name, title=title, group=group, triggers=triggers, companions=companions)


def _check_flag(path: Path, name: str, flag: Any) -> str:
    if not isinstance(flag, str) or not re.fullmatch(r"--[a-z0-9][a-z0-9-]*", flag):
        raise _fail(path, name, f"flag must be spelled --lower-case-with-dashes. Received: {flag!r}")
    return flag


def _check_takes(path: Path, name: str, takes: Any) -> int | str:
    if takes not in _TAKES or isinstance(takes, bool):
        raise _fail(path, name, f"takes must be 0, 1 or '+'. Received: {takes!r}")
    return takes


def _parse_trigger(path: Path, name: str, raw: Any) -> Trigger:
    _keys(path, f"entry {name!r}: a trigger", raw, optional=_TRIGGER_KEYS)
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
    _keys(path, f"entry {name!r}: a companion", raw, optional=_COMPANION_KEYS)
    if "flag" not in raw:
        raise _fail(path, name, "a companion has no 'flag'")
    return Companion(flag=_check_flag(path, name, raw["flag"]), takes=_check_takes(path, name, raw.get("takes", 1)))


def _check_overlaps(path: Path, features: Sequence[Feature]) -> None:
    """Two features must never claim the same flag value: the gate would report it twice, differently."""
    seen: dict[str, list[tuple[str, Trigger]]] = {}
    for feature in features:
        for trig in feature.triggers:
            for other_name, other in seen.get(trig.flag, []):
                if _overlap(trig, other):
                    raise _fail(path, feature.name, f"{trig.describe()} overlaps entry {other_name!r} ({other.describe()})")
            seen.setdefault(trig.flag, []).append((feature.name, trig))
    for flag, claims in seen.items():
        first_name, first = claims[0]
        for other_name, other in claims[1:]:
            if (other.takes, other.dest) != (first.takes, first.dest):
                raise _fail(path, other_name, f"{flag} takes/dest differ from entry {first_name!r}; one flag parses one way")
    for feature in features:
        for comp in feature.companions:
            if comp.flag in seen:
                raise _fail(path, feature.name, f"companion {comp.flag} is also a trigger flag; list it once")


def _overlap(a: Trigger, b: Trigger) -> bool:
    kinds = {a.when[0] if a.when else None, b.when[0] if b.when else None}
    if kinds == {"in"}:
        return bool(set(a.when[1]) & set(b.when[1]))
    if kinds == {"in", "matches"}:
        values, regex = (a.when[1], b.when[1]) if a.when[0] == "in" else (b.when[1], a.when[1])
        return any(regex.fullmatch(v) for v in values)
    # Any other pair on one flag (two switches, two thresholds, a catch-all `set`) is ambiguous.
    return True


# ---------------------------------------------------------------------------------------- layers

def _parse_sources(path: Path, raw: Any) -> dict[str, Source]:
    if not isinstance(raw, dict) or not raw:
        raise FeatureTableError(f"{path}: sources must be a non-empty mapping of id -> {{title, url, section}}")
    sources = {}
    for key, body in raw.items():
        key = _check_name(path, key)
        where = f"source {key!r}"
        _keys(path, where, body, required={"title"}, optional=_SOURCE_KEYS - {"title"})
        for field_name in ("title", "url", "section", "check"):
            if field_name in body:
                _one_line(path, key, f"{where}: {field_name}", body[field_name])
        url, check = body.get("url"), body.get("check")
        if (url is None) == (check is None):
            raise FeatureTableError(f"{path}: {where}: give a public url, or for a measurement the check that re-runs it (one of the two)")
        if url is not None and not re.fullmatch(r"https://\S+", url):
            raise FeatureTableError(f"{path}: {where}: url must be an https:// address. Received: {url!r}")
        # An installed package ships no tests/, so the file itself is checked by tests/features/test_layers.py.
        if check is not None and not re.fullmatch(r"tests/[\w./-]+\.py", check):
            raise FeatureTableError(f"{path}: {where}: check must name a test file (tests/....py). Received: {check!r}")
        sources[key] = Source(key=key, title=body["title"], url=url, section=body.get("section"), check=check)
    return sources


def _parse_layer(path: Path, layer: str, raw: dict, names: set[str], sources: dict[str, Source]) -> Layer:
    if not isinstance(raw["features"], dict) or not raw["features"]:
        raise FeatureTableError(f"{path}: features must be a non-empty mapping of feature name -> cells")
    cells = {}
    for name, body in raw["features"].items():
        name = _check_name(path, name)
        if name not in names:
            raise _fail(path, name, f"not in the feature catalogue ({CATALOGUE_PATH.name}); define it there first")
        cells[name] = _parse_support(path, layer, name, body, sources)
    columns = {}
    for key, text in (raw.get("columns") or {}).items():
        column = _column_key(path, "columns", str(key))
        if "*" in column:
            raise FeatureTableError(f"{path}: columns: name one framework/device per line. Received: {key!r}")
        columns[column] = _one_line(path, "columns", str(key), text)
    if columns and set(columns) != set(ALL_COLUMNS):
        missing = sorted(f"{fw}/{dev}" for fw, dev in set(ALL_COLUMNS) - set(columns))
        raise FeatureTableError(f"{path}: columns: describe every framework/device; missing {', '.join(missing)}")
    return Layer(name=layer, path=path, cells=cells, columns=columns)


def _column_key(path: Path, name: str, key: str) -> tuple[str, str]:
    fw, _, dev = key.partition("/") if key != "*" else ("*", "/", "*")
    if fw not in (*FRAMEWORKS, "*") or dev not in (*DEVICES, "*"):
        raise _fail(path, name, f"unknown support key {key!r} (use framework/device with framework in "
                                f"{', '.join(FRAMEWORKS)}, device in {', '.join(DEVICES)}, or * for any)")
    return fw, dev


def _parse_cell(path: Path, layer: str, name: str, key: str, raw: Any, sources: dict[str, Source]) -> Cell:
    where = f"[{key!r}]"
    _keys(path, f"entry {name!r}: {where}", raw, optional=_CELL_KEYS if layer == STACK else _CELL_KEYS - {"source"})
    status = raw.get("status")
    allowed = _LAYER_STATUSES[layer]
    if status not in allowed:
        raise _fail(path, name, f"{where}: unknown status {status!r} (allowed: {', '.join(allowed)})")
    for text_key in ("reason", "hint"):
        text = raw.get(text_key)
        needed = text_key == "reason" or status in ("fallback", "unsupported")
        if text is None and needed:
            raise _fail(path, name, f"{where}: missing {text_key} (every {status} cell needs one)")
        if text is not None:
            _one_line(path, name, f"{where}: {text_key}", text)
    version = raw.get("min_version")
    if version is not None and (not isinstance(version, str) or version_tuple(version) is None):
        raise _fail(path, name, f"{where}: min_version must be a quoted version such as \"2.6\". Received: {version!r}")
    if "substitute" in raw and status != "fallback":
        raise _fail(path, name, f"{where}: substitute is only meaningful on a fallback cell (status is {status})")
    cited = _parse_source_refs(path, name, where, raw.get("source"), sources)
    if layer == STACK and status != "unknown" and not cited:
        raise _fail(path, name, f"{where}: missing source (every {status} verdict of the stack cites one; "
                                f"a verdict no source states is status: unknown)")
    return Cell(status=status, reason=raw["reason"], hint=raw.get("hint"), min_version=version,
                substitute=raw.get("substitute"), has_substitute="substitute" in raw, sources=cited)


def _parse_source_refs(path: Path, name: str, where: str, raw: Any, sources: dict[str, Source]) -> tuple[Source, ...]:
    if raw is None:
        return ()
    keys = raw if isinstance(raw, list) else [raw]
    cited = []
    for key in keys:
        if key not in sources:
            raise _fail(path, name, f"{where}: source {key!r} is not defined under sources")
        cited.append(sources[key])
    return tuple(cited)


def _parse_support(path: Path, layer: str, name: str, raw: Any, sources: dict[str, Source]) -> dict[tuple[str, str], Cell]:
    if not isinstance(raw, dict) or not raw:
        raise _fail(path, name, "give a non-empty mapping of 'framework/device' cells")
    parsed: dict[tuple[str, str], Cell] = {}
    for key, body in raw.items():
        parsed[_column_key(path, name, str(key))] = _parse_cell(path, layer, name, str(key), body, sources)
    cells: dict[tuple[str, str], Cell] = {}
    for fw, dev in ALL_COLUMNS:
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
