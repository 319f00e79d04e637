"""The rewrite: torchrun launch lines become msrun ones (and back), changing only the bytes that must change.

Per launch line: read the launcher options wherever they are written (the line itself, a string or
array variable, if/else definitions), translate them with the shared table (launchers/option_rules.py,
the same rules and refusal messages as the `mmrun` launcher), then edit each option where it is
written: rename in place, replace a computed value, remove what the target launcher lacks, add what
it needs after the last option. `export LOCAL_WORLD_SIZE` and `--ai-framework` are added or removed,
and the training arguments are checked against the feature gate.

The way back is exact for scripts mmrun produced: `marker.py` keeps a header line (and, only where
the reverse rules would not give the original text back, an undo record) and verifies it.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mmrun.launchers.options import BY_LAUNCHER, MSRUN, TORCHRUN, LauncherOption
from mmrun.launchers.translate import lint as lints
from mmrun.launchers.translate.edits import Edit, EditConflict, apply_edits
from mmrun.launchers.translate.hidden import find_hidden_launches
from mmrun.launchers.translate.launch_forms import EXECUTABLES, Launch, LauncherArgs, OptionUse, find_launches, read_args
from mmrun.launchers.translate.parse import Node, Script, encode, parse_script
from mmrun.launchers.translate.report import Change, Report
from mmrun.launchers.translate.values import ProductIndex, ScriptValues
from mmrun.launchers.translate.words import MAX_ALTERNATIVES, Container, Definitions, ExpansionRefused, Word, Words
from mmrun.launchers.translate.rules import (
    DEVICES, FRAMEWORK_FLAGS, FRAMEWORK_OF, INLINE_ADDED, KEEP_DEFAULTS, MARKER_PREFIX, MMRUN, MMRUN_OWN_TO_MSRUN, MSRUN_EXTRAS,
    ON_UNSUPPORTED, OTHER, WHY_ADDED, WHY_DROPPED, WHY_FROM_MMRUN, WHY_LAUNCHER, WHY_RENAMED,
)
from mmrun.launchers.option_rules import Refusal, Translation, to_msrun, to_torchrun

if TYPE_CHECKING:
    from mmrun.features.decisions import Decision


def line_ending(source: bytes) -> str:
    """The script's own line ending, for the lines we add (a CRLF script stays CRLF)."""
    first = source.split(b"\n", 1)[0]
    return "\r\n" if first.endswith(b"\r") else "\n"


def _splits(value: str) -> bool:
    """An unquoted expansion bash would split and glob (shellcheck SC2086); `$((...))` yields one number."""
    return "$" in value and not re.fullmatch(r"\$\(\(.*\)\)", value, flags=re.S)


_GAP = re.compile(r"[ \t]*(?:\\\r?\n[ \t]*|\r?\n[ \t]*)*")
_COMMAND_SUBSTITUTION = re.compile(r"\$\((?!\()|`")  # `$(cmd)` or a backquote; `$((...))` alone runs nothing
_IDENTIFIER = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")
_NEEDS_QUOTES = re.compile(r"[\s;&|<>'\"`]")


def _fallback_advice(decision: Decision) -> str:
    """What a fallback warning adds: a user's script can only be changed, and translate can change it; mmrun's
    trainer can also run with the feature off under its own --on-unsupported warn."""
    value = decision.replacement
    change = (f"write {' '.join(decision.replacement_tokens())} instead" if isinstance(value, str)
              else "take it out of the script")
    if decision.layer == "trainer":
        return (" The job stops on it unless the training script runs with --on-unsupported warn (the feature then off); "
                f"translate with --on-unsupported comment|remove to {change}.")
    return f" Translate with --on-unsupported comment|remove to {change}."


@dataclass(frozen=True)
class Options:
    target: str = MSRUN  # launcher to translate to: MSRUN or TORCHRUN
    device: str = "npu"  # the device the training flags are checked for (feature gate)
    on_unsupported: str = "error"  # error | comment | remove
    gate: bool = True  # check training flags (off only while computing or checking an undo record)

    def __post_init__(self) -> None:
        if self.target not in OTHER:
            raise ValueError(f"target must be {MSRUN} or {TORCHRUN}. Received: {self.target!r}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}. Received: {self.device!r}")
        if self.on_unsupported not in ON_UNSUPPORTED:
            raise ValueError(f"on_unsupported must be one of {', '.join(ON_UNSUPPORTED)}. Received: {self.on_unsupported!r}")

    @property
    def source(self) -> str:
        return OTHER[self.target]


class TranslationRefused(Exception):
    """The script cannot be translated; `report.refusals` says why, one line each."""

    def __init__(self, report: Report):
        self.report = report
        first = report.refusals[0]
        super().__init__(f"{report.path}:{first.line}: {first.message}")


@dataclass
class Result:
    source: bytes
    output: bytes
    report: Report

    @property
    def changed(self) -> bool:
        return self.output != self.source


def translate_rules(source: bytes, options: Options, path: str) -> tuple[bytes, Report]:
    """The rule-based rewrite alone (no header, no undo record)."""
    return _Rewriter(source, options, path).run()


# ------------------------------------------------------------------------------------ the rewriter


@dataclass
class _Removal:
    container: Container
    indices: set[int] = field(default_factory=set)


class _Rewriter:
    def __init__(self, source: bytes, options: Options, path: str):
        self.source = source
        self.options = options
        self.target = options.target
        self.script: Script = parse_script(source, path)
        self.defs = Definitions(self.script)
        self.words = Words(self.script, self.defs)
        self.report = Report(path, options.source, options.target)
        self.eol = line_ending(source)
        self.edits: list[Edit] = []
        self.removals: dict[int, _Removal] = {}
        self.exports: dict[int, str] = {}  # insertion offset -> LOCAL_WORLD_SIZE value written there
        self.lint_roots: dict[tuple[int, int], Node] = {}  # each node once, however many launches expand it
        self.backend_findings: list[lints.Finding] = []
        self.products = ProductIndex(self.script, self.defs)
        self.once: dict[int, str] = {}  # value offset -> the variable a command substitution is assigned to
        self._identifiers: set[bytes] | None = None

    # ---------------------------------------------------------------- driver

    def run(self) -> tuple[bytes, Report]:
        launches = find_launches(self.script, self.words)
        todo = [launch for launch in launches if launch.launcher == self.options.source]
        if todo and all(launch.form == MMRUN for launch in todo):
            self.report.source = MMRUN  # the report (and the marker) say "mmrun -> msrun"
        for launch in launches:
            if launch.launcher == self.target:
                used = MMRUN if launch.form == MMRUN else self.target  # mmrun picks its launcher itself
                self.report.add_note(self._line(launch.command.start_byte), f"this launch line already uses {used}; left as it is")
        hidden = find_hidden_launches(self.script, self.options.source)
        for launch in hidden:
            self.report.warn(self._line(launch.offset), launch.message)
        self.report.hidden_launches = len(hidden)
        if not launches:
            self.report.add_note(1, f"no {self.options.source} launch line found (looked for {self._forms()}); nothing to translate")
        for launch in todo:
            self._launch(launch)
        if todo:
            self._drop_marker_lines()
            if self.target == TORCHRUN:
                self._drop_local_world_size()
        self.report.launches = len(todo)
        self.report.lint = sorted(
            lints.broken_continuations(self.script) + lints.array_as_scalar(self.script, self.defs)
            + self.backend_findings + lints.unset_variables(self.script, self.defs, list(self.lint_roots.values())),
            key=lambda f: (f.line, f.column, f.code),
        )
        if self.report.refusals:
            raise TranslationRefused(self.report)
        try:
            output = apply_edits(self.source, self.edits + self._removal_edits())
        except EditConflict as conflict:
            self.report.refuse(self._line(conflict.second.start),
                               "two launch lines need different rewrites of the same text (a variable shared by launches with "
                               "different options); give each launch its own variable")
            raise TranslationRefused(self.report) from None
        return output, self.report

    def _forms(self) -> str:
        return "torchrun, python -m torch.distributed.run|launch" if self.options.source == TORCHRUN else "msrun, python -m mindspore.parallel.cluster.run"

    def _line(self, offset: int) -> int:
        return self.script.line_of(offset)

    # ---------------------------------------------------------------- one launch line

    def _launch(self, launch: Launch) -> None:
        line = self._line(launch.command.start_byte)
        self._lint_root(launch.statement)  # the whole line: `| tee logs/${logfile}.log` included
        try:
            alternatives = self._alternatives(launch)
        except ExpansionRefused as error:
            self.report.refuse(line, str(error))
            return
        parsed = [read_args(launch, alternative) for alternative in alternatives]
        refused = len(self.report.refusals)
        for args in parsed:
            for word, message in args.problems:
                self.report.refuse(self._line(word.start), message)
            if args.script is None:
                self.report.refuse(line, f"no training script follows the {launch.launcher} options; "
                                         f"write it as `{launch.launcher} [options] SCRIPT [arguments]`")
        if len(self.report.refusals) > refused:
            return
        self._rename_launcher(launch)
        if launch.legacy and not any(u.option is None for args in parsed for u in args.uses):
            self.report.add_note(line, "torch.distributed.launch without --use_env passed --local-rank=N to the training script; "
                                       "the target launcher passes no such argument: the script must read its rank from the environment")
        for args in parsed:
            self._options(launch, args)
        training = list({id(w): w for args in parsed for w in args.training}.values())
        self._framework_flag(launch, training)
        self._gate(training, [args.script.text for args in parsed if args.script is not None])

    def _alternatives(self, launch: Launch) -> list[list[Word]]:
        """The launch's words after expansion, once per combination of if/else definitions of its option variables."""
        flat = [(i, w) for i, arg in enumerate(launch.args) for w in self.words.expand(arg, union=True)[0]]
        for _, word in flat:
            if word.container.kind != "command":
                self._lint_root(word.container.node)
        probe = read_args(launch, [w for _, w in flat])
        last = next((i for i, w in flat if w is probe.script), len(launch.args) - 1)
        heads = [self.words.expand(arg, union=False) for arg in launch.args[:last + 1]]
        tail = [w for i, w in flat if i > last]
        combinations = list(itertools.islice(itertools.product(*heads), MAX_ALTERNATIVES + 1))
        if len(combinations) > MAX_ALTERNATIVES:
            raise ExpansionRefused(f"the launcher options have more than {MAX_ALTERNATIVES} possible values (if/else definitions); simplify them")
        return [[w for part in combination for w in part] + tail for combination in combinations]

    def _lint_root(self, node: Node) -> None:
        self.lint_roots.setdefault((node.start_byte, node.end_byte), node)

    def _rename_launcher(self, launch: Launch) -> None:
        start, end = launch.name_span
        before = self.script.text(start, end)
        if launch.form in EXECUTABLES and launch.name_word.static:
            after = before[: len(before) - len(launch.form)] + self.target  # keep a directory: /opt/env/bin/msrun
        else:
            after = self.target
        why = WHY_LAUNCHER[self.target] + (WHY_FROM_MMRUN if launch.form == MMRUN else "")
        if launch.dropped:
            why += f"; python's own options {' '.join(launch.dropped)} are dropped (msrun starts `python SCRIPT` itself)"
        self._edit(start, end, after, Change(self._line(start), before, after, why))

    # ---------------------------------------------------------------- launcher options

    def _options(self, launch: Launch, args: LauncherArgs) -> None:
        uses = [u for u in args.uses if u.option is not None and u.option.launcher != MMRUN]
        for own in (u for u in args.uses if u.option is not None and u.option.launcher == MMRUN):
            action, reason, *hint = MMRUN_OWN_TO_MSRUN[own.dest]
            if action == "remove":
                self._remove_use(own, reason)
            else:
                self.report.refuse(self._line(own.start), str(Refusal(own.flag, own.value if own.option.takes_value else None,
                                                                      self.target, reason, hint[0])))
        for legacy in (u for u in args.uses if u.option is None):
            self._remove_use(legacy, "torch.distributed.launch's --use_env: msrun passes no --local-rank argument, so there is nothing to switch off")
        position = max((u.start for u in uses), default=launch.command.start_byte)
        values = ScriptValues(self.script, self.defs, position, self.products)
        given: dict[str, str | bool] = {}
        spelled: dict[str, str] = {}
        for use in uses:
            given[use.dest] = values.shield(use.value)  # `${NNODES:-1}` is one value, not a MIN:MAX range
            spelled[use.dest] = use.flag
        filled = self._fill(given)
        shared = to_msrun if self.target == MSRUN else to_torchrun

        def translate(options: dict[str, str | bool], **kwargs) -> Translation:
            return values.unshield_translation(shared(options, **kwargs))

        try:
            full = translate(given, spelled=spelled, values=values)
            if self._evaluate_once(uses, given, full):
                full = translate(given, spelled=spelled, values=values)
        except ValueError as error:
            self.report.refuse(self._line(position), str(error))
            return
        if full.module:
            module_use = next(u for u in uses if u.dest == "module")
            refusal = Refusal(module_use.flag, None, MSRUN, "msrun starts each worker as `python SCRIPT`, it cannot run a module",
                              "pass the module's file path as SCRIPT, or launch with `mmrun --ai-framework mindspore -m MODULE`, whose worker bootstrap runs modules")
            self.report.refuse(self._line(module_use.start), str(refusal))
        for refusal in full.refusals:
            use = next((u for u in uses if u.flag == refusal.flag), None)
            self.report.refuse(self._line(use.start if use else position), str(refusal))
        if full.module or full.refusals:
            return
        source_of = self._attribute(given, full, translate, spelled, values)
        outputs: dict[str | None, list[str]] = {}
        for option, _ in full.options:
            if option.dest in full.defaulted and option.dest not in KEEP_DEFAULTS:
                continue
            outputs.setdefault(source_of.get(option.dest), []).append(option.dest)
        notes = {note.flag: note for note in full.notes}
        for use in uses:
            produced = outputs.get(use.dest, [])
            note = notes.pop(use.flag, None)
            if not produced:
                self._remove_use(use, note.message if note else WHY_DROPPED.get(use.dest, f"{self.target} has no equivalent"))
            elif len(produced) == 1:
                self._rewrite_use(use, produced[0], full, note.message if note else None)
            else:
                self._replace_use(use, produced, full)
        for note in notes.values():
            self.report.add_note(self._line(position), str(note))
        added = outputs.get(None, []) + [d for source in filled for d in outputs.get(source, [])]
        self._add_options(launch, uses, added, full)
        if self.target == MSRUN:
            self._export_local_world_size(launch, uses, outputs, full)

    def _evaluate_once(self, uses: list[OptionUse], given: dict[str, str | bool], full: Translation) -> bool:
        """A value that runs a command (`--nproc_per_node $(nproc)`) and that the translation writes in several places
        (--local_worker_num, the --worker_num product, LOCAL_WORLD_SIZE) is assigned to a variable once, above the
        statement that holds it, and the variable is used instead: each copy would run the command again (a command
        with side effects, or one whose answer changes, would then disagree with itself). True if `given` changed."""
        written = [str(value) for option, value in full.options if option.dest not in full.defaulted or option.dest in KEEP_DEFAULTS]
        written += full.env.values()
        changed = False
        for use in uses:
            value = use.value
            if not isinstance(value, str) or use.value_span is None or not _COMMAND_SUBSTITUTION.search(value):
                continue
            if use.value_span[0] not in self.once and sum(text.count(value) for text in written) < 2:
                continue
            name = self.once.get(use.value_span[0]) or self._assign_once(use, value)
            given[use.dest] = "$" + name
            changed = True
        return changed

    def _assign_once(self, use: OptionUse, value: str) -> str:
        base = use.dest.upper()
        if self._identifiers is None:
            self._identifiers = set(_IDENTIFIER.findall(self.source))
        taken = self._identifiers | {n.encode() for n in self.once.values()}
        name = next(n for n in (base if i == 0 else f"{base}_{i + 1}" for i in itertools.count()) if n.encode() not in taken)
        self.once[use.value_span[0]] = name
        text = f"{name}={value}" if not re.search(r"\s", value) else f'{name}="{value}"'
        offset, inserted = self._after_assignments(use.container.statement, text)
        self._edit(offset, offset, inserted, Change(self._line(offset), "", text,
                   f"runs `{value}` once: the {self.target} line needs its value in several places, and each copy would run it again"))
        return name

    def _fill(self, given: dict[str, str | bool]) -> list[str]:
        """Options the target needs that the script leaves to defaults; returns their dests (no use in the script)."""
        filled = []
        if self.target == MSRUN:
            for dest, (value, devices) in MSRUN_EXTRAS.items():
                if self.options.device in devices and dest not in given:
                    given[dest] = value
                    filled.append(dest)
        else:
            # msrun's own defaults (8 and 8), which the shared translation does not assume for msrun input.
            for dest in ("local_worker_num", "worker_num"):
                if dest not in given:
                    given[dest] = str(BY_LAUNCHER[MSRUN][dest].default)
                    filled.append(dest)
        return filled

    def _attribute(self, given, full: Translation, translate, spelled, values) -> dict[str, str]:
        """target dest -> the given option that produced it (leave each one out and see what changes)."""
        affects: dict[str, set[str]] = {}
        for source in given:
            rest = {k: v for k, v in given.items() if k != source}
            try:
                without = translate(rest, spelled=spelled, values=values)
            except ValueError:
                continue
            affects[source] = {option.dest for option, value in full.options if option.dest not in full.defaulted
                               and (option.dest in without.defaulted or without.value(option.dest) != value)}
        source_of: dict[str, str] = {}
        for option, _ in full.options:
            dest = option.dest
            if dest in full.defaulted:
                continue
            if dest in given:
                source_of[dest] = dest  # spelled alike in both launchers (--master_addr)
                continue
            # A documented rename first (--local_worker_num 8 -> --nproc_per_node 8 even where 8 is msrun's
            # default, so leaving it out changes nothing); else the most specific source: --nnodes changes
            # only --worker_num, --nproc_per_node changes both.
            candidates = [s for s in given if (s, dest) in WHY_RENAMED] or [s for s in given if dest in affects.get(s, ())]
            if candidates:
                source_of[dest] = min(candidates, key=lambda s: len(affects.get(s, ())))
        return source_of

    def _flag(self, option: LauncherOption) -> str:
        # torchrun accepts both spellings; scripts (and the MindSpeed guides) mostly use underscores, which msrun shares.
        return "--" + option.dest if option.launcher == TORCHRUN else option.canonical_flag

    def _rewrite_use(self, use: OptionUse, dest: str, full: Translation, note: str | None) -> None:
        option = BY_LAUNCHER[self.target][dest]
        value = full.value(dest)
        flag = use.flag if use.flag in option.flags else self._flag(option)
        if option.takes_value and use.value_span is None:
            self._replace_use(use, [dest], full)
            return
        edits = []
        if flag != use.flag:
            edits.append(Edit(*use.flag_span, encode(flag)))
        new_value = None
        if option.takes_value and str(value) != str(use.value):
            new_value = self._render_value(str(value), use)
            edits.append(Edit(*use.value_span, encode(new_value)))
        if not edits:
            return
        before = self._use_text(use)
        if use.inline:
            after = flag + "=" + (new_value if new_value is not None else str(use.value))
        elif option.takes_value:
            after = flag + " " + (new_value if new_value is not None else use.value_word.raw)
        else:
            after = flag
        why = WHY_RENAMED.get((use.dest, dest)) or note or (f"{self.target} spells it {flag}" if flag != use.flag else f"{self.target} needs {after}")
        for edit in edits:
            self.edits.append(edit)
        self.report.add_change(Change(self._line(use.start), before, after, why))

    def _replace_use(self, use: OptionUse, dests: list[str], full: Translation) -> None:
        texts = [self._option_text(BY_LAUNCHER[self.target][d], full.value(d), use.container, inline=use.inline) for d in dests]
        after = self._sep_around(use.words[0], use.words[-1]).join(texts)
        why = WHY_RENAMED.get((use.dest, dests[0]), f"{self.target} expresses {use.flag} as {' '.join(texts)}")
        self._edit(use.start, use.end, after, Change(self._line(use.start), self._use_text(use), after, why))

    def _remove_use(self, use: OptionUse, why: str) -> None:
        self._remove_words(use.words)
        self.report.add_change(Change(self._line(use.start), self._use_text(use), "", why))

    def _add_options(self, launch: Launch, uses: list[OptionUse], dests: list[str], full: Translation) -> None:
        if not dests:
            return
        inline = bool(uses) and uses[-1].inline  # follow the script's style: --flag=value or --flag value
        container = uses[-1].container if uses else launch.container
        texts = [self._option_text(BY_LAUNCHER[self.target][d], full.value(d), container, inline=inline or d in INLINE_ADDED) for d in dests]
        if uses:
            anchor = uses[-1]
            offset, sep = anchor.end, self._sep_around(anchor.words[0], anchor.words[-1])
        else:
            offset = launch.name_span[1]
            words = launch.container.words
            index = launch.container.index(launch.name_word)
            following = next((w for w in words[index + 1:] if w.start >= offset), None)
            sep = self._valid_sep(self.script.text(offset, following.start), launch.container) if following else " "
        self.edits.append(Edit(offset, offset, encode("".join(sep + t for t in texts))))
        for dest, text in zip(dests, texts):
            self.report.add_change(Change(self._line(offset), "", text, WHY_ADDED.get(dest, f"{self.target} needs it")))

    def _option_text(self, option: LauncherOption, value, container: Container, inline: bool = False) -> str:
        flag = self._flag(option)
        if not option.takes_value:
            return flag
        text = str(value)
        if _NEEDS_QUOTES.search(text) or (container.kind != "string" and _splits(text)):
            text = '"' + text.replace('"', '\\"') + '"'
        return f"{flag}={text}" if inline else f"{flag} {text}"

    def _render_value(self, value: str, use: OptionUse) -> str:
        word = use.value_word
        if word is None or (word.container.kind == "string" and not word.quote):
            return value  # inside a quoted definition: its quotes cover the value
        if use.inline:
            return f'"{value}"' if not word.quote and _splits(value) else value
        if word.quote == "'" and "$" not in value:
            return f"'{value}'"
        if word.quote or _NEEDS_QUOTES.search(value) or _splits(value):
            return f'"{value}"'
        return value

    def _use_text(self, use: OptionUse) -> str:
        return " ".join(w.raw for w in use.words)

    # ---------------------------------------------------------------- LOCAL_WORLD_SIZE

    def _export_local_world_size(self, launch: Launch, uses: list[OptionUse], outputs, full: Translation) -> None:
        value = full.env.get("LOCAL_WORLD_SIZE")
        if value is None:
            return
        line = self._line(launch.command.start_byte)
        if self.defs.is_set("LOCAL_WORLD_SIZE"):
            self.report.add_note(line, "LOCAL_WORLD_SIZE is already set in the script; msrun does not set it, so check it equals --local_worker_num")
            return
        holder = next((u for u in uses if "local_worker_num" in outputs.get(u.dest, [])), uses[-1] if uses else None)
        statement = holder.container.statement if holder is not None else launch.statement
        text = f"export LOCAL_WORLD_SIZE={value}"
        offset, inserted = self._after_assignments(statement, text)
        if self.exports.get(offset, value) != value:
            self.report.refuse(line, "launch lines sharing one place for `export LOCAL_WORLD_SIZE` need different values; give each its own definitions")
            return
        if offset in self.exports:
            return
        self.exports[offset] = value
        self._edit(offset, offset, inserted, Change(self._line(offset), "", text, "msrun does not set LOCAL_WORLD_SIZE for its workers; Megatron reads it"))

    def _after_assignments(self, statement: Node, text: str) -> tuple[int, str]:
        """Where a new statement goes: after the assignments just above `statement` (the layout of MindSpeed-MM's MindSpore backend migration guide), else above it."""
        indent = self.script.indent_of(statement.start_byte)
        previous = self.script.previous_named_sibling(statement)
        while previous is not None and previous.type == "comment":
            previous = self.script.previous_named_sibling(previous)
        if previous is not None and previous.type in ("variable_assignment", "variable_assignments", "declaration_command") \
                and self._line(previous.end_byte - 1) < self._line(statement.start_byte):
            return self.script.line_end(previous.end_byte - 1), f"{indent}{text}{self.eol}"
        return self._above(statement, text)

    def _above(self, statement: Node, text: str) -> tuple[int, str]:
        start = statement.start_byte
        line_start = self.script.line_start(start)
        if self.script.text(line_start, start).strip():
            return start, f"{text}; "  # the statement shares its line with another
        return line_start, f"{self.script.indent_of(start)}{text}{self.eol}"

    def _drop_local_world_size(self) -> None:
        """torchrun sets LOCAL_WORLD_SIZE for every worker, so the export msrun needed is dead code."""
        for node in self.script.walk():
            if node.type != "declaration_command" or self.script.node_text(node.children[0]) != "export":
                continue
            named = node.named_children
            if len(named) != 1 or named[0].type != "variable_assignment":
                continue
            name = named[0].child_by_field_name("name")
            if name is None or self.script.node_text(name) != "LOCAL_WORLD_SIZE":
                continue
            span = self._own_lines(node)
            if span is None:
                self.report.add_note(self._line(node.start_byte), "export LOCAL_WORLD_SIZE shares its line with other commands; left in place (torchrun overrides it)")
                continue
            self._edit(*span, "", Change(self._line(node.start_byte), self.script.node_text(node), "", "torchrun sets LOCAL_WORLD_SIZE for every worker itself"))

    def _drop_marker_lines(self) -> None:
        for node in self.script.walk():
            if node.type == "comment" and self.script.node_text(node).startswith(MARKER_PREFIX):
                span = self._own_lines(node)
                if span is not None:
                    self.edits.append(Edit(span[0], span[1], b""))

    def _own_lines(self, node: Node) -> tuple[int, int] | None:
        start = self.script.line_start(node.start_byte)
        end = self.script.line_end(max(node.end_byte - 1, node.start_byte))
        if self.script.text(start, node.start_byte).strip() or self.script.text(node.end_byte, end).strip():
            return None
        return start, end

    # ---------------------------------------------------------------- training arguments

    def _framework_flag(self, launch: Launch, training: list[Word]) -> None:
        framework = FRAMEWORK_OF[self.target]
        found = []
        for index, word in enumerate(training):
            flag, eq, value = word.text.partition("=")
            if flag not in FRAMEWORK_FLAGS:
                continue
            if eq:
                found.append(([word], value, (word.end - len(encode(value)) - (1 if word.quote else 0), word.end - (1 if word.quote else 0))))
            elif index + 1 < len(training):
                following = training[index + 1]
                found.append(([word, following], following.text, (following.start, following.end)))
        if self.target == MSRUN:
            for words, value, span in found:
                if value != framework:
                    self._edit(*span, framework, Change(self._line(span[0]), value, framework, "the training script runs on the MindSpore backend"))
            if not found:
                last = launch.container.words[-1]
                sep = self._line_sep(launch.container)
                text = f"--ai-framework {framework}"
                self._edit(last.end, last.end, sep + text, Change(self._line(last.end), "", text,
                           "selects the MindSpore backend in the training script (MindSpeed-MM's MindSpore backend migration guide)"))
        else:
            for words, value, _ in found:
                if value == FRAMEWORK_OF[MSRUN]:
                    self._remove_words(words)
                    self.report.add_change(Change(self._line(words[0].start), " ".join(w.raw for w in words), "",
                                                  "PyTorch is the training script's default backend"))

    def _gate(self, training: list[Word], scripts: list[str]) -> None:
        """Check the training flags against the feature table (mmrun.features).

        Every script is judged by the framework stack of the target; mmrun's own trainer is added only
        when the launch line starts it (`models/pretrain_gpt.py`): a user's MindSpeed script is not
        bound by what mmrun's GPT implements. Each reported line names its layer.
        """
        if not self.options.gate or not training:
            return
        from mmrun.features import check_flags, entry_features, layers_for_scripts  # framework-free; YAML tables

        framework, device = FRAMEWORK_OF[self.target], self.options.device
        decisions = check_flags([w.text for w in training], framework, device, layers=layers_for_scripts(scripts),
                                entry_features=entry_features(scripts))
        unknown: dict[str, int] = {}
        taken_out: dict[tuple[int, int], list] = {}
        for decision in decisions:
            if decision.status == "supported" or decision.span is None:
                continue
            words = training[decision.span[0]:decision.span[1]]
            line = self._line(words[0].start)
            if decision.status == "unknown":
                unknown.setdefault(decision.received, line)
            elif decision.automatic:
                if decision.flag == "--distributed-backend":
                    self.backend_findings.append(lints.Finding(line, self.script.column_of(words[0].start), "MT003", decision.line()))
                else:
                    self.report.add_note(line, decision.line())
            elif not decision.value_known:
                self.report.warn(line, decision.summary(" Its value is set when the script runs, so it is not checked here."))
            elif self.options.on_unsupported != "error":
                taken_out.setdefault(decision.span, []).append(decision)
            elif decision.status == "unsupported":
                self.report.refuse(line, decision.summary(" Or pass --on-unsupported comment|remove to take it out of the script."))
            else:
                self.report.warn(line, decision.summary(_fallback_advice(decision)))
        for found in taken_out.values():
            self._take_out(training, found)
        if unknown:
            self.report.add_note(min(unknown.values()), f"[stack] not checked: no public source says whether these work with the "
                                                        f"{framework} backend on {device}: {', '.join(unknown)} (see docs/features.md)")

    def _take_out(self, training: list[Word], found: list[Decision]) -> None:
        """--on-unsupported comment|remove: drop the flag (and its companions), or put the value that works in its place."""
        decision = found[0]
        words = training[decision.span[0]:decision.span[1]]
        message = " ".join(d.summary() for d in found)
        replacement = decision.replacement
        if isinstance(replacement, str) and decision.value_known and words[-1].static:
            # A choice among values (--moe-token-dispatcher-type allgather): removing the flag would fall back
            # to the script's default, which may be the very value refused; the working value replaces it.
            value_word = words[-1]
            inline = len(words) == 1
            end = value_word.end - (1 if value_word.quote else 0)
            start = end - len(str(decision.value).encode()) if inline else value_word.start + (1 if value_word.quote else 0)
            before = " ".join(w.raw for w in words)
            self._edit(start, end, replacement, Change(self._line(words[0].start), before,
                                                       " ".join(decision.replacement_tokens()), message))
            comment = f"{MARKER_PREFIX}: changed `{before}` to `{' '.join(decision.replacement_tokens())}`: {message}"
        else:
            spans = [decision.span, *decision.companion_spans]
            removed = [w for a, b in spans for w in training[a:b]]
            self._remove_words(removed)
            before = " ".join(w.raw for w in removed)
            self.report.add_change(Change(self._line(words[0].start), before, "", message))
            comment = f"{MARKER_PREFIX}: removed `{before}`: {message}"
        if self.options.on_unsupported == "comment":
            offset, text = self._above(words[0].container.statement, comment)
            self.edits.append(Edit(offset, offset, encode(text)))

    # ---------------------------------------------------------------- edit helpers

    def _edit(self, start: int, end: int, new: str, change: Change) -> None:
        self.edits.append(Edit(start, end, encode(new)))
        self.report.add_change(change)

    def _remove_words(self, words: list[Word]) -> None:
        for word in words:
            removal = self.removals.setdefault(id(word.container), _Removal(word.container))
            removal.indices.add(word.container.index(word))

    def _removal_edits(self) -> list[Edit]:
        """Removed words with the whitespace before them (or after, for a container's first word), run by run."""
        edits = []
        for removal in self.removals.values():
            words = removal.container.words
            indices = sorted(removal.indices)
            runs = [list(group) for _, group in itertools.groupby(indices, key=lambda i, c=itertools.count(): i - next(c))]
            for run in runs:
                first, last = run[0], run[-1]
                if first > 0:
                    edits.append(Edit(words[first - 1].end, words[last].end, b""))
                elif last + 1 < len(words):
                    edits.append(Edit(words[first].start, words[last + 1].start, b""))
                else:
                    edits.append(Edit(words[first].start, words[last].end, b""))
        return edits

    def _sep_around(self, first: Word, last: Word) -> str:
        """The separator the container uses before this option (or after it, if it comes first)."""
        container = first.container
        words = container.words
        index = container.index(first)
        if index > 0:
            gap = self.script.text(words[index - 1].end, first.start)
        else:
            end_index = container.index(last)
            gap = self.script.text(last.end, words[end_index + 1].start) if end_index + 1 < len(words) else " "
        return self._valid_sep(gap, container)

    def _line_sep(self, container: Container) -> str:
        """` \\<newline>    ` when the command ends with one argument (or flag and value) on its own line, else a space."""
        words = container.words
        first = len(words) - 1
        while first > 0 and "\n" not in self.script.text(words[first - 1].end, words[first].start):
            first -= 1
        last_line = words[first:]
        if first > 0 and (len(last_line) == 1 or (len(last_line) == 2 and last_line[0].text.startswith("-"))):
            return self._valid_sep(self.script.text(words[first - 1].end, words[first].start), container)
        return " "

    def _valid_sep(self, gap: str, container: Container) -> str:
        if gap and _GAP.fullmatch(gap) and (container.kind != "command" or "\n" not in gap.replace("\\\n", "").replace("\\\r\n", "")):
            return gap
        if "\n" in gap and container.kind in ("array", "string"):
            return "\n" + gap.rsplit("\n", 1)[1]  # after a comment: a new line at the next word's indentation
        return " "
