"""Shell words with their byte spans: what a launcher receives, traced back to where the script wrote it.

A launch line's options often live elsewhere: `torchrun $DISTRIBUTED_ARGS train.py` takes its
options from a string split into words, `"${ARGS[@]}"` from an array. This module splits variable
definitions into words the way bash will at the unquoted use (whitespace separates, `\\<newline>`
vanishes inside double quotes, `\\ ` stays a literal backslash), keeping each word's bytes so that a
rewrite can change the definition in place. Expansions (`$GPUS_PER_NODE`, `$((...))`) stay shell
text: they are evaluated when the script runs, never by us.
"""
from __future__ import annotations

import itertools
import re
from bisect import bisect_right
from dataclasses import dataclass, field

from mmrun.launchers.translate.parse import Node, Script, decode

# Node types that are one opaque piece of a word (their value is known only when the script runs).
EXPANSIONS = frozenset({
    "simple_expansion", "expansion", "command_substitution", "arithmetic_expansion", "process_substitution",
    "ansi_c_string", "translated_string", "brace_expression",
})
_IFS = b" \t\n"
_DQUOTE_ESCAPABLE = b'$`"\\'
MAX_ALTERNATIVES = 16  # combinations of if/else definitions translated one by one before we give up
# Words the launch lines of one script may expand to, in all: at least this many, and one per byte of the script
# beyond. Variables nested in variables multiply (`A="$B $B"`, `B="$C $C"`, ...: 2^depth words); the bound keeps the
# work linear in the script's size, far above any real launch line (a few hundred words).
MIN_EXPANSION_BUDGET = 100_000


class ExpansionRefused(ValueError):
    """Launcher options come from a variable whose words cannot be known without running the script."""


@dataclass(frozen=True)
class Ref:
    """A word that is one variable expansion: `$V` (kind "split"), `"${V[@]}"` ("array") or `"$V"` ("quoted")."""

    kind: str
    name: str
    node: Node


@dataclass(eq=False)
class Container:
    """Where words are written: a command line, or one variable definition's value (string or array)."""

    kind: str  # "command", "string", "array", "scalar"
    node: Node
    statement: Node  # the statement holding it: comments and exports go on a line above it
    variable: str | None = None
    words: list["Word"] = field(default_factory=list)
    _positions: dict[int, int] = field(default_factory=dict, repr=False)

    def index(self, word: "Word") -> int:
        if len(self._positions) != len(self.words):  # built once the words are in (a launch line can hold thousands)
            self._positions = {id(w): i for i, w in enumerate(self.words)}
        return self._positions[id(word)]


@dataclass(eq=False)
class Word:
    start: int
    end: int
    raw: str  # the source text of the word
    text: str  # the word as the program receives it when static; otherwise shell text without wrapper quotes
    static: bool
    quote: str  # '"' or "'" when the whole word is one quoted string, else ""
    container: Container
    ref: Ref | None = None
    opaque: bool = False  # an expansion of a variable the script does not define: zero or more unknown words
    problem: str | None = None  # why an expansion was not followed (array used as $ARR, ...)

    def __repr__(self) -> str:
        return f"Word({self.raw!r}@{self.start})"


@dataclass(frozen=True)
class Definition:
    name: str
    node: Node  # variable_assignment
    value: Node | None
    append: bool  # X+=...
    is_array: bool
    statement: Node
    unconditional: bool  # a top-level statement: it replaces every earlier value


class Definitions:
    """Every assignment in the script, by variable name, plus every name the script sets some other way."""

    def __init__(self, script: Script):
        self.script = script
        self.by_name: dict[str, list[Definition]] = {}
        self.other_setters: set[str] = set()  # for/read/declare/export without value/getopts/mapfile
        self._position_cache: dict[str, tuple[list[int] | None, list[int]]] = {}
        for node in script.walk():
            if node.type == "variable_assignment":
                self._add_assignment(node)
            elif node.type == "for_statement":
                variable = node.child_by_field_name("variable")
                if variable is not None:
                    self.other_setters.add(script.node_text(variable))
            elif node.type == "declaration_command":
                for child in node.named_children:
                    if child.type == "variable_name":
                        self.other_setters.add(script.node_text(child))
            elif node.type == "command":
                self._add_command_setters(node)

    def _add_assignment(self, node: Node) -> None:
        parent = self.script.parent_of(node)
        if parent is not None and parent.type == "command":
            return  # `PYTHONPATH=x torchrun ...`: set for that one command only
        name_node = node.child_by_field_name("name")
        if name_node is None:
            return
        name = self.script.node_text(name_node)
        if name_node.type == "subscript":  # A[0]=x: an element, treat as appended to A
            inner = name_node.child_by_field_name("name")
            name = self.script.node_text(inner) if inner is not None else name
        value = node.child_by_field_name("value")
        operator = next((c.type for c in node.children if c.type in ("=", "+=")), "=")
        statement = self.script.statement_of(node)
        self.by_name.setdefault(name, []).append(Definition(
            name=name, node=node, value=value, append=operator == "+=" or name_node.type == "subscript",
            is_array=value is not None and value.type == "array", statement=statement,
            unconditional=self.script.is_top_level(statement),
        ))

    def _add_command_setters(self, node: Node) -> None:
        name_node = node.child_by_field_name("name")
        if name_node is None:
            return
        name = self.script.node_text(name_node)
        if name not in ("read", "mapfile", "readarray", "getopts", "printf"):
            return
        args = [self.script.node_text(a) for a in node.children_by_field_name("argument")]
        if name == "printf":  # printf -v NAME ...
            names = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-v"]
        elif name == "read":
            names = [a for a in args if a.isidentifier()]
        else:  # mapfile/readarray/getopts: the last name
            names = [a for a in args if a.isidentifier()][-1:]
        self.other_setters.update(n for n in names if n.isidentifier())

    def get(self, name: str) -> list[Definition]:
        return self.by_name.get(name, [])

    def is_set(self, name: str) -> bool:
        return name in self.by_name or name in self.other_setters

    def is_array(self, name: str) -> bool:
        definitions = self.get(name)
        return bool(definitions) and any(d.is_array for d in definitions)

    def _positions(self, name: str) -> tuple[list[int] | None, list[int]]:
        """(end offsets of the name's definitions, or None when out of order; for each definition, the index of the
        last one up to it that replaces every earlier value), computed once per name."""
        if name not in self._position_cache:
            found = self.get(name)
            ends = [d.node.end_byte for d in found]
            resets, last = [], 0
            for i, definition in enumerate(found):
                if definition.unconditional and not definition.append:
                    last = i
                resets.append(last)
            ordered = all(a <= b for a, b in zip(ends, ends[1:]))
            self._position_cache[name] = (ends if ordered else None, resets)
        return self._position_cache[name]

    def reaching(self, name: str, offset: int) -> list[list[Definition]]:
        """The definitions a use at `offset` may see, as alternatives (if/else), each a chain (X=...; X+=...).

        Straight-line approximation: the last top-level assignment before the use replaces every earlier one;
        assignments after it (inside if/else, functions) are alternatives; `+=` extends the chain.
        """
        found = self.get(name)
        if not found:
            return [[]]
        ends, resets = self._positions(name)
        if ends is not None:
            before = found[:bisect_right(ends, offset)] or found
            cut = resets[len(before) - 1]
        else:  # an assignment nested in another's value (`A=$(A=1)`): end offsets out of order
            before = [d for d in found if d.node.end_byte <= offset] or found
            cut = max((i for i, d in enumerate(before) if d.unconditional and not d.append), default=0)
        chain = before[cut:]
        plains = [d for d in chain if not d.append]
        if len(plains) <= 1:
            return [chain]
        appends = [d for d in chain if d.append]
        if appends:
            return [chain]  # several plain values and appends: the caller decides (union or refuse)
        return [[d] for d in plains]


class Words:
    """Splits commands and definitions into Words (cached) and follows variables to the words they hold."""

    def __init__(self, script: Script, definitions: Definitions):
        self.script = script
        self.defs = definitions
        self._containers: dict[tuple[int, int, str], Container] = {}
        self.expansion_budget = max(MIN_EXPANSION_BUDGET, len(script.source))  # words left to expand (see above)

    # ------------------------------------------------------------------ containers

    def command(self, node: Node) -> Container:
        """The words of a command: its name, then each argument (one node, one word)."""
        key = (node.start_byte, node.end_byte, "command")
        if key not in self._containers:
            container = Container("command", node, self.script.statement_of(node))
            name = node.child_by_field_name("name")
            parts = ([name] if name is not None else []) + [
                c for i, c in enumerate(node.children) if c.is_named and c.type not in ("variable_assignment", "command_name", "comment", "file_redirect", "herestring_redirect")
                and node.field_name_for_child(i) == "argument"
            ]
            for part in parts:
                target = part.named_children[0] if part.type == "command_name" and part.named_children else part
                container.words.append(self._node_word(target, container, in_string=False))
            self._containers[key] = container
        return self._containers[key]

    def definition(self, definition: Definition) -> Container:
        value = definition.value
        key = (definition.node.start_byte, definition.node.end_byte, "definition")
        if key not in self._containers:
            if value is None:
                container = Container("string", definition.node, definition.statement, definition.name)
            elif value.type == "array":
                container = Container("array", value, definition.statement, definition.name)
                for element in value.named_children:
                    if element.type != "comment":
                        container.words.append(self._node_word(element, container, in_string=False))
            else:
                container = Container("string" if value.type in ("string", "raw_string", "concatenation") else "scalar", value, definition.statement, definition.name)
                container.words.extend(self._split(value, container))
            self._containers[key] = container
        return self._containers[key]

    # ------------------------------------------------------------------ expansion

    def expand(self, word: Word, *, union: bool, depth: int = 0) -> list[list[Word]]:
        """The words a word becomes when the script runs, as alternatives (one per if/else definition).

        union=True merges alternatives into one list (enough for checking training flags); union=False
        keeps them apart (launcher options are translated once per alternative) and raises
        ExpansionRefused when a definition is built in steps that cannot be told apart.
        """
        ref = word.ref
        if ref is None or ref.kind == "quoted" or depth > 8:
            return [[word]]
        chains = self.defs.reaching(ref.name, word.start)
        if not chains or not chains[0]:
            word.opaque = True
            return [[word]]
        if len(chains) > MAX_ALTERNATIVES:
            raise ExpansionRefused(f"${ref.name} has more than {MAX_ALTERNATIVES} possible values (if/else definitions); simplify it")
        all_defs = [d for chain in chains for d in chain]
        self._spend(len(all_defs), ref.name)
        if ref.kind == "split" and any(d.is_array for d in all_defs):
            word.problem = "array"
            return [[word]]
        if ref.kind == "array" and not all(d.is_array for d in all_defs):
            return [[word]]  # "${S[@]}" of a string: one word
        if len(chains) == 1 and sum(not d.append for d in chains[0]) > 1 and not union:
            lines = ", ".join(str(self.script.line_of(d.node.start_byte)) for d in chains[0][:8]) + (", ..." if len(chains[0]) > 8 else "")
            raise ExpansionRefused(f"${ref.name} is assigned several times with += between (lines {lines}); give it one definition per case")
        alternatives: list[list[Word]] = []
        for chain in chains:
            per_definition: list[list[list[Word]]] = []
            for definition in chain:
                inner = [self.expand(w, union=union, depth=depth + 1) for w in self.definition(definition).words]
                per_definition.extend(inner)
            for combination in itertools.islice(itertools.product(*per_definition), MAX_ALTERNATIVES + 1):
                self._spend(sum(len(part) for part in combination), ref.name)
                alternatives.append([w for part in combination for w in part])
        if all(len(a) == 1 and not a[0].text.startswith("-") for a in alternatives):
            return [[word]]  # one plain value (`$GPUS_PER_NODE`): it stays shell text, evaluated when the script runs
        if len(alternatives) > MAX_ALTERNATIVES and not union:
            raise ExpansionRefused(f"${ref.name} has more than {MAX_ALTERNATIVES} possible values (if/else definitions); simplify it")
        if union:
            return [[w for alternative in alternatives for w in alternative]]
        return alternatives

    def _spend(self, words: int, name: str) -> None:
        self.expansion_budget -= words
        if self.expansion_budget < 0:
            raise ExpansionRefused(f"the launch lines' variables (${name} among them) expand to more than "
                                   f"{max(MIN_EXPANSION_BUDGET, len(self.script.source))} words in all (variables nested in "
                                   f"variables, or used over and over); write the launcher options out")

    # ------------------------------------------------------------------ splitting

    def _node_word(self, node: Node, container: Container, in_string: bool) -> Word:
        """One node as one word (command arguments and array elements are not split further)."""
        pieces = list(self._pieces(node))
        raw = self.script.node_text(node)
        static = all(kind == "lit" for kind, *_ in pieces)
        quote = ""
        text = raw
        if node.type == "string":
            quote, text = '"', raw[1:-1]
        elif node.type == "raw_string":
            quote, text = "'", raw[1:-1]
        if static:
            text = "".join(piece[3] for piece in pieces)
        word = Word(node.start_byte, node.end_byte, raw, text, static, quote, container)
        word.ref = self._ref(node, in_string)
        return word

    def _ref(self, node: Node, in_string: bool) -> Ref | None:
        if node.type in ("simple_expansion", "expansion"):
            name = _plain_variable(node, self.script)
            if name:
                return Ref("quoted" if in_string else "split", name, node)
            array = _array_all(node, self.script)
            if array:
                return Ref("array", array, node)
            return None
        if node.type == "string":
            inner = [c for c in node.named_children if c.type != "string_content" or self.script.node_text(c)]
            if len(inner) == 1 and inner[0].type in ("simple_expansion", "expansion") and _exact_string(node, inner[0], self.script):
                array = _array_all(inner[0], self.script)
                if array:
                    return Ref("array", array, inner[0])
                name = _plain_variable(inner[0], self.script)
                if name:
                    return Ref("quoted", name, inner[0])
        return None

    def _split(self, value: Node, container: Container) -> list[Word]:
        """Split a definition's value into the words an unquoted use yields."""
        words: list[Word] = []
        current: list[tuple] = []

        def flush() -> None:
            if not current:
                return
            start, end = current[0][1], current[-1][2]
            raw = self.script.text(start, end)
            static = all(p[0] == "lit" for p in current)
            text = "".join(p[3] for p in current) if static else raw
            word = Word(start, end, raw, text, static, "", container)
            if len(current) == 1 and current[0][0] == "exp":
                word.ref = self._ref(current[0][4], in_string=False)
                if word.ref is not None and word.ref.kind == "quoted":
                    word.ref = Ref("split", word.ref.name, word.ref.node)
            words.append(word)
            current.clear()

        for piece in self._pieces(value):
            if piece[0] == "sep":
                flush()
            else:
                current.append(piece)
        flush()
        return words

    def _pieces(self, node: Node):
        """(kind, start, end, literal, node): kind "lit" (known text), "exp" (run-time value) or "sep" (splits words)."""
        source = self.script.source
        if node.type == "string":
            yield from self._quoted_pieces(node, node.start_byte + 1, node.end_byte - 1)
        elif node.type == "raw_string":
            yield from _scan(source, node.start_byte + 1, node.end_byte - 1, escapes=None)
        elif node.type in ("word", "number"):
            yield from _scan(source, node.start_byte, node.end_byte, escapes=b"any", split=False)
        elif node.type == "concatenation":
            for child in node.children:
                yield from self._pieces(child)
        else:
            start = _skip_space(source, node.start_byte, node.end_byte)
            yield ("exp", start, node.end_byte, "", node)

    def _quoted_pieces(self, node: Node, start: int, end: int):
        source = self.script.source
        position = start
        for child in node.named_children:
            if child.type == "string_content":
                continue
            child_start = _skip_space(source, child.start_byte, child.end_byte)
            if child_start < position:
                continue
            yield from _scan(source, position, child_start, escapes=_DQUOTE_ESCAPABLE)
            yield ("exp", child_start, child.end_byte, "", child)
            position = child.end_byte
        yield from _scan(source, position, end, escapes=_DQUOTE_ESCAPABLE)


def _skip_space(source: bytes, start: int, end: int) -> int:
    # tree-sitter-bash starts some expansion nodes at the whitespace before their `$`.
    while start < end and source[start] in b" \t\n":
        start += 1
    return start


_PLAIN = {True: re.compile(rb"[^ \t\n\\]+"), False: re.compile(rb"[^\\]+")}  # runs without separators or escapes


def _scan(source: bytes, start: int, end: int, escapes, split: bool = True):
    """Literal text: whitespace separates words (when split), backslash escapes as bash reads them."""
    position = start
    plain = _PLAIN[split]
    while position < end:
        run = plain.match(source, position, end)
        if run is not None:
            yield ("lit", position, run.end(), decode(run.group()), None)
            position = run.end()
            continue
        byte = source[position]
        if split and byte in _IFS:
            run = position
            while run < end and source[run] in _IFS:
                run += 1
            yield ("sep", position, run, "", None)
            position = run
            continue
        if byte == 0x5C and escapes is not None and position + 1 < end:  # backslash
            following = source[position + 1]
            if following == 0x0A:  # line continuation: both bytes vanish
                yield ("sep" if split else "lit", position, position + 2, "", None)
                position += 2
                continue
            if escapes == b"any" or following in escapes:
                length = _character_length(source, position + 1, end)
                yield ("lit", position, position + 1 + length, decode(source[position + 1:position + 1 + length]), None)
                position += 1 + length
                continue
        length = _character_length(source, position, end)
        yield ("lit", position, position + length, decode(source[position:position + length]), None)
        position += length


def _character_length(source: bytes, position: int, end: int) -> int:
    """Bytes of the UTF-8 character at `position` (its lead byte and the continuation bytes after it)."""
    length = 1
    while position + length < end and (source[position + length] & 0xC0) == 0x80:
        length += 1
    return length


def _plain_variable(node: Node, script: Script) -> str | None:
    """`$V` / `${V}` -> V; None for `${V:-x}`, `${#V}`, `${V[0]}`, `$1`, `$@`."""
    named = node.named_children
    if len(named) != 1 or named[0].type != "variable_name":
        return None
    if node.type == "expansion" and script.node_text(node).strip() != "${" + script.node_text(named[0]) + "}":
        return None
    name = script.node_text(named[0])
    return name if name.isidentifier() else None


def _array_all(node: Node, script: Script) -> str | None:
    """`${A[@]}` -> A."""
    if node.type != "expansion":
        return None
    named = node.named_children
    if len(named) != 1 or named[0].type != "subscript":
        return None
    index = named[0].child_by_field_name("index")
    name = named[0].child_by_field_name("name")
    if index is None or name is None or script.node_text(index) not in ("@", "*"):
        return None
    if script.node_text(node).strip() != "${" + script.node_text(named[0]) + "}":
        return None
    return script.node_text(name)


def _exact_string(string: Node, inner: Node, script: Script) -> bool:
    """The string is exactly `"` + inner + `"` (nothing else inside)."""
    start = _skip_space(script.source, inner.start_byte, inner.end_byte)
    return start == string.start_byte + 1 and inner.end_byte == string.end_byte - 1
