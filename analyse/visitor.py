"""One pass over a file's syntax tree: collect what the rules can match, then resolve names.

The walk is a plain iterative traversal of LibCST's nodes (no metadata, no node copies): it records
imports, dotted-name chains, bindings, method uses and string literals with their context.
Resolution comes after it, only for chains that could match a rule: a base name bound only by
module-level imports that agree resolves from the file's import table (what ScopeProvider would
say for it); any other name is resolved with LibCST's ScopeProvider, the scope analysis behind
QualifiedNameProvider (aliases such as `import torch as t`, `from torch import cuda`, shadowing).
Positions are computed only for files with findings. The analysed code is never imported or run.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider, QualifiedNameSource, ScopeProvider

from .positions import node_ranges
from .rules import Rule, RuleIndex

# Fields that never hold code the rules look at (whitespace, punctuation, comments).
_SKIP_FIELDS = frozenset({
    "lpar", "rpar", "leading_lines", "lines_after_decorators", "trailing_whitespace", "header",
    "footer", "comma", "semicolon", "equal", "colon", "dot", "star", "operator", "relative",
    "asynchronous", "newline", "indent", "default_indent", "default_newline", "encoding",
    "has_trailing_newline", "whitespace_between", "start", "end", "whitespace", "lbrace",
    "rbrace", "lbracket", "rbracket", "trailing_comma",
})
# Fields to walk for types whose other fields hold no code (Arg.keyword is a name, not a use).
_ONLY_FIELDS: dict[type, tuple[str, ...]] = {
    cst.Arg: ("value",),
    cst.Param: ("name", "annotation", "default"),
    cst.FunctionDef: ("decorators", "name", "params", "returns", "body"),
    cst.ClassDef: ("decorators", "name", "bases", "keywords", "body"),
    cst.ExceptHandler: ("type", "name", "body"),
    cst.Decorator: ("decorator",),
    cst.AsName: ("name",),
    cst.Global: (),
    cst.Nonlocal: (),
    cst.Import: (),
    cst.ImportFrom: (),
    cst.Name: (),
    cst.SimpleString: (),
    cst.FormattedStringText: (),
    cst.Integer: (),
    cst.Float: (),
    cst.Imaginary: (),
    cst.Ellipsis: (),
}
# Fields whose names are bound (assigned) rather than read: a name bound anywhere other than by
# a module-level import is resolved with ScopeProvider instead of the import table.
_STORE_FIELDS: dict[type, frozenset[str]] = {
    cst.AssignTarget: frozenset({"target"}),
    cst.AnnAssign: frozenset({"target"}),
    cst.AugAssign: frozenset({"target"}),
    cst.For: frozenset({"target"}),
    cst.CompFor: frozenset({"target"}),
    cst.NamedExpr: frozenset({"target"}),
    cst.Del: frozenset({"target"}),
    cst.AsName: frozenset({"name"}),
    cst.Param: frozenset({"name"}),
    cst.FunctionDef: frozenset({"name"}),
    cst.ClassDef: frozenset({"name"}),
    cst.MatchAs: frozenset({"name"}),
    cst.MatchStar: frozenset({"name"}),
    cst.MatchMapping: frozenset({"rest"}),
    cst.TypeVar: frozenset({"name"}),
    cst.ParamSpec: frozenset({"name"}),
    cst.TypeVarTuple: frozenset({"name"}),
}
# Store context passes through unpacking targets (`a, (b, *c) = ...`) but not into `x.y = ...`.
_STORE_THROUGH = frozenset({cst.Tuple, cst.List, cst.StarredElement, cst.Element})
_NEW_SCOPES = frozenset({cst.FunctionDef, cst.ClassDef, cst.Lambda})
_FIELD_CACHE: dict[type, tuple[str, ...]] = {}

_STATEMENTS = (cst.SimpleStatementLine, cst.BaseCompoundStatement)
_IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})
_STRINGS = (cst.SimpleString, cst.FormattedString)
_CONTAINERS = (cst.List, cst.Tuple, cst.Set)


def _fields(tp: type) -> tuple[str, ...]:
    names = _FIELD_CACHE.get(tp)
    if names is None:
        names = _ONLY_FIELDS.get(tp)
        if names is None:
            names = tuple(f.name for f in dataclasses.fields(tp)
                          if f.name not in _SKIP_FIELDS and not f.name.startswith("whitespace"))
        _FIELD_CACHE[tp] = names
    return names


def dotted(node: cst.BaseExpression) -> str | None:
    """'a.b.c' for a pure Name/Attribute chain, else None."""
    parts = []
    while type(node) is cst.Attribute:
        parts.append(node.attr.value)
        node = node.value
    if type(node) is not cst.Name:
        return None
    parts.append(node.value)
    return ".".join(reversed(parts))


@dataclass
class Edit:
    """One rewrite: replace `node` by `new`, or add `comment` above statement `node`."""
    code: str
    node: cst.CSTNode
    new: cst.CSTNode | None = None
    comment: str | None = None
    before: str = ""
    after: str = ""
    add_import: str | None = None
    anchor: cst.CSTNode | None = None   # node whose line the change list reports


@dataclass
class Hit:
    """A rule match before positions are known."""
    rule: Rule
    node: cst.CSTNode
    name: str
    confidence: str
    fixable: bool = False
    guarded: bool = False
    key: str = ""   # the rule-table entry that matched, when it differs from `name`
    edits: list[Edit] = field(default_factory=list)


@dataclass(slots=True)
class _Chain:
    node: cst.BaseExpression
    parent: cst.CSTNode | None
    stmt: cst.CSTNode | None
    names: list[cst.Name]          # base first, then each attribute
    receiver: cst.BaseExpression | None = None  # for `f().cuda()`: the non-name receiver


@dataclass
class _ImportRecord:
    node: cst.Import | cst.ImportFrom
    module: str | None             # absolute module of a from-import; None for `import x`
    relative: bool
    aliases: list[tuple[str, str, bool]]  # (imported dotted name, bound local name, has `as`)
    guarded: bool
    star: bool = False
    nested: bool = False            # inside a def, class or lambda


class FileAnalysis:
    """Analyse one parsed module against a RuleIndex: `walk()`, then `resolve()`, then `hits`."""

    def __init__(self, module: cst.Module, index: RuleIndex, *, force_scope: bool = False) -> None:
        self.module = module
        self.index = index
        self.chains: list[_Chain] = []
        self.bindings: set[str] = set()   # names bound other than by an import
        self.imports: list[_ImportRecord] = []
        self.hits: list[Hit] = []
        self._compare_ids: set[int] = set()
        self._skip_string_ids: set[int] = set()
        self._literals = index.literals
        self._wrapper: MetadataWrapper | None = None
        self._scopes = None
        self.import_fix_edits: list[Edit] = []
        self.force_scope = force_scope   # tests: resolve every name with ScopeProvider
        self.used_scope = False

    # ------------------------------------------------------------------ the walk
    def walk(self) -> None:
        """Collect imports, name chains, bindings and string matches in one traversal."""
        # Stack entries: node, parent, enclosing statement, inside a try that catches ImportError,
        # inside an annotation, in a binding position, inside a def/class/lambda.
        stack: list[tuple] = [(self.module, None, None, False, False, False, False)]
        pop, push = stack.pop, stack.append
        chains, bindings = self.chains, self.bindings
        for_strings = bool(self._literals)
        while stack:
            node, parent, stmt, guarded, annot, store, nested = pop()
            tp = type(node)
            if tp is cst.Name:
                if store:
                    bindings.add(node.value)
                else:
                    chains.append(_Chain(node, parent, stmt, [node]))
                continue
            if tp is cst.Attribute:
                names = []
                cur = node
                while type(cur) is cst.Attribute:
                    names.append(cur.attr)
                    cur = cur.value
                if type(cur) is cst.Name:
                    names.append(cur)
                    names.reverse()
                    chains.append(_Chain(node, parent, stmt, names))
                else:
                    # `f(x).cuda()`: the method part is a candidate; walk into the receiver.
                    chains.append(_Chain(node, parent, stmt, [node.attr], receiver=node.value))
                    push((node.value, node, stmt, guarded, annot, False, nested))
                continue
            if tp is cst.SimpleString or tp is cst.FormattedString:
                if for_strings and not annot and id(node) not in self._skip_string_ids:
                    self._check_string(node, stmt)
                if tp is cst.SimpleString:
                    continue
            elif tp is cst.Import or tp is cst.ImportFrom:
                self._record_import(node, guarded, nested)
                continue
            elif tp is cst.Global or tp is cst.Nonlocal:
                bindings.update(item.name.value for item in node.names)
                continue
            elif tp is cst.Comparison:
                self._mark_compared(node)
            elif tp is cst.Expr:
                if isinstance(node.value, _STRINGS) or type(node.value) is cst.ConcatenatedString:
                    self._skip_string_ids.add(id(node.value))   # docstrings, bare strings
            elif tp is cst.Annotation:
                annot = True
            elif tp is cst.Try or tp is cst.TryStar:
                # Imports inside a try that catches ImportError are optional dependencies.
                catches = any(_catches_import_error(h) for h in node.handlers)
                children = [(node.body, node, node, guarded or catches, annot, False, nested)]
                children += [(h, node, node, guarded, annot, False, nested) for h in node.handlers]
                if node.orelse is not None:
                    children.append((node.orelse, node, node, guarded, annot, False, nested))
                if node.finalbody is not None:
                    children.append((node.finalbody, node, node, guarded, annot, False, nested))
                for child in reversed(children):
                    push(child)
                continue
            if isinstance(node, _STATEMENTS):
                stmt = node
            store_fields = _STORE_FIELDS.get(tp)
            keep_store = store and tp in _STORE_THROUGH
            inner = nested or tp in _NEW_SCOPES
            kids = []
            for name in _fields(tp):
                value = getattr(node, name)
                child_store = keep_store or (store_fields is not None and name in store_fields)
                # A def's decorators, defaults and annotations run in the enclosing scope.
                child_nested = inner if name in ("body", "params") else nested
                if isinstance(value, cst.CSTNode):
                    kids.append((value, node, stmt, guarded, annot, child_store, child_nested))
                elif type(value) is tuple or type(value) is list:
                    kids.extend((v, node, stmt, guarded, annot, child_store, child_nested)
                                for v in value if isinstance(v, cst.CSTNode))
            for kid in reversed(kids):
                push(kid)

    def _record_import(self, node: cst.Import | cst.ImportFrom, guarded: bool, nested: bool) -> None:
        if type(node) is cst.Import:
            aliases = []
            for alias in node.names:
                full = dotted(alias.name) or ""
                if alias.asname is not None and type(alias.asname.name) is cst.Name:
                    aliases.append((full, alias.asname.name.value, True))
                else:
                    aliases.append((full, full.split(".")[0], False))
            self.imports.append(_ImportRecord(node, None, False, aliases, guarded, nested=nested))
            return
        module = dotted(node.module) if node.module is not None else None
        relative = bool(node.relative)
        if isinstance(node.names, cst.ImportStar):
            self.imports.append(_ImportRecord(node, module, relative, [], guarded, star=True, nested=nested))
            return
        aliases = []
        for alias in node.names:
            name = dotted(alias.name) or ""
            if alias.asname is not None and type(alias.asname.name) is cst.Name:
                aliases.append((name, alias.asname.name.value, True))
            else:
                aliases.append((name, name, False))
        self.imports.append(_ImportRecord(node, module, relative, aliases, guarded, nested=nested))

    def _mark_compared(self, node: cst.Comparison) -> None:
        operands = [node.left] + [target.comparator for target in node.comparisons]
        for operand in operands:
            if isinstance(operand, _CONTAINERS):
                operands.extend(element.value for element in operand.elements)
            elif isinstance(operand, _STRINGS):
                self._compare_ids.add(id(operand))

    def _check_string(self, node: cst.SimpleString | cst.FormattedString, stmt: cst.CSTNode | None) -> None:
        if type(node) is cst.SimpleString:
            raw = node.value
            if not any(lit in raw for lit in self._literals):
                return
            try:
                value = node.evaluated_value
            except Exception:  # malformed escapes: nothing a rule can match
                return
            if not isinstance(value, str):
                return
            target, text = node, raw
        else:
            first = node.parts[0] if node.parts else None
            if type(first) is not cst.FormattedStringText:
                return
            value = first.value
            if not any(lit in value for lit in self._literals):
                return
            target, text = first, first.value
        table = self.index.compares if id(node) in self._compare_ids else self.index.strings
        for rule, regex in table:
            if regex.fullmatch(value):
                hit = Hit(rule, node, repr(value) if type(node) is cst.SimpleString else f"f'{value}...'",
                          rule.confidence)
                fix = rule.fix
                if fix is not None and fix.old in text and self.index.fixes_enabled:
                    new_text = text.replace(fix.old, fix.new, 1)
                    hit.fixable = True
                    hit.edits.append(Edit(rule.code, target, new=target.with_changes(value=new_text),
                                          before=text, after=new_text, add_import=fix.add_import,
                                          anchor=node))
                self.hits.append(hit)
                return

    # ------------------------------------------------------------------ resolution
    def _alias_paths(self) -> tuple[dict[str, list[str]], set[str], set[str]]:
        """Import table: local name -> absolute import paths; names any import binds; and the
        names the table alone resolves exactly as ScopeProvider would."""
        paths: dict[str, list[str]] = {}
        bound: set[str] = set()
        unsure: set[str] = set(self.bindings)
        for rec in self.imports:
            for full, local, has_as in rec.aliases:
                bound.add(local)
                if rec.relative or rec.nested:
                    unsure.add(local)
                if rec.relative:
                    continue
                if rec.module is None:
                    # `import a.b.c` binds `a` (to package a); `import a.b as c` binds c to a.b.
                    paths.setdefault(local, []).append(full if has_as else local)
                else:
                    paths.setdefault(local, []).append(f"{rec.module}.{full}")
        # A name bound only by module-level imports that all agree resolves to that path in every
        # scope of the file; anything else (shadowing, function-level imports, try/except
        # alternatives) goes to ScopeProvider.
        exact = {name for name, found in paths.items() if name not in unsure and len(set(found)) == 1}
        return paths, bound, exact

    def _could_match(self, paths: list[str], rest: list[str]) -> bool:
        index = self.index
        for path in paths:
            qualified = ".".join([path] + rest)
            if qualified in index.keyword_args or index.lookup_name(qualified) is not None:
                return True
        return False

    def _scope_names(self, node: cst.CSTNode) -> list[str]:
        """Qualified names through imports, from ScopeProvider (resolved once per file)."""
        if self._scopes is None:
            self._scopes = self._metadata().resolve(ScopeProvider)
            self.used_scope = True
        scope = self._scopes.get(node)
        if scope is None:
            return []
        return sorted({q.name for q in scope.get_qualified_names_for(node)
                       if q.source is QualifiedNameSource.IMPORT})

    def _metadata(self) -> MetadataWrapper:
        if self._wrapper is None:
            self._wrapper = MetadataWrapper(self.module, unsafe_skip_copy=True)
        return self._wrapper

    def resolve(self) -> None:
        index = self.index
        paths, bound, exact = self._alias_paths()
        if self.force_scope:
            exact = set()
        self._import_hits()
        fixed_locals = self._import_rewrites() if index.fixes_enabled else set()
        methods_call, methods_attr = index.methods_call, index.methods_attr
        for chain in self.chains:
            names = chain.names
            last = names[-1].value
            is_call = type(chain.parent) is cst.Call and chain.parent.func is chain.node
            method_rule = None
            if len(names) > 1 or chain.receiver is not None:
                method_rule = (methods_call if is_call else methods_attr).get(last)
            if chain.receiver is not None:
                if method_rule is not None:
                    self._method_hit(method_rule, chain, paths)
                continue
            base = names[0].value
            if base not in bound:
                # No import binds the base name: it cannot resolve to a library name.
                if method_rule is not None:
                    self._method_hit(method_rule, chain, paths)
                continue
            rest = [n.value for n in names[1:]]
            maybe_rule = base in paths and self._could_match(paths[base], rest)
            if not maybe_rule and method_rule is None:
                continue
            if base in exact:
                qualified_names = [".".join([paths[base][0]] + rest)]
            else:
                qualified_names = self._scope_names(chain.node)
            if not qualified_names:
                if method_rule is not None:
                    self._method_hit(method_rule, chain, paths)
                continue
            if maybe_rule:
                for qualified in qualified_names:
                    rule = index.keyword_args.get(qualified)
                    if rule is not None:
                        if is_call:
                            self._keyword_hit(rule, qualified, chain)
                        break
                    found = index.lookup_name(qualified)
                    if found is not None:
                        self._name_hit(found[0], qualified, found[1], chain, base in fixed_locals)
                        break
        # Which rule a name belongs to was decided on the whole table; report the selected ones.
        self.hits = [hit for hit in self.hits if hit.rule.code in index.selected]

    def _import_hits(self) -> None:
        index = self.index
        if not index.imports:
            return
        for rec in self.imports:
            if rec.relative:
                continue
            modules = [full for full, _, _ in rec.aliases] if rec.module is None else \
                [f"{rec.module}.{name}" for name, _, _ in rec.aliases] or [rec.module or ""]
            seen: set[str] = set()
            for module in modules:
                rule = index.lookup_import(module)
                if rule is None or rule.code in seen:
                    continue
                seen.add(rule.code)
                # `from apex.optimizers import X` is reported as apex.optimizers, `from numba import
                # cuda` as numba.cuda: the module that matched.
                if rec.module is not None and index.lookup_import(rec.module) is rule:
                    name = rec.module
                else:
                    name = module
                self.hits.append(Hit(rule, rec.node, name, rule.confidence, guarded=rec.guarded))

    def _import_rewrites(self) -> set[str]:
        """Rewrite `from torch.cuda.amp import autocast` when every imported name has a rename."""
        fixed: set[str] = set()
        for rec in self.imports:
            if rec.relative or rec.star or rec.module is None or not rec.aliases:
                continue
            node = rec.node
            new_modules, new_aliases, rule = set(), [], None
            for alias, (name, local, _) in zip(node.names, rec.aliases):
                old = f"{rec.module}.{name}"
                rule = self.index.exact.get(old)
                if (rule is None or rule.fix is None or rule.fix.kind != "rename" or old not in rule.renames
                        or rule.code not in self.index.selected):
                    break
                new_module, _, new_name = rule.renames[old].rpartition(".")
                new_modules.add(new_module)
                if new_name != name and alias.asname is None:
                    alias = alias.with_changes(name=cst.Name(new_name),
                                               asname=cst.AsName(name=cst.Name(name)))
                elif new_name != name:
                    alias = alias.with_changes(name=cst.Name(new_name))
                new_aliases.append(alias)
            else:
                if len(new_modules) != 1 or rule is None:
                    continue
                new_node = node.with_changes(module=cst.parse_expression(new_modules.pop()),
                                             names=new_aliases)
                before = self.module.code_for_node(node)
                after = self.module.code_for_node(new_node)
                self.import_fix_edits.append(Edit(rule.code, node, new=new_node, before=before,
                                                  after=after, add_import=rule.fix.add_import, anchor=node))
                fixed.update(local for _, local, _ in rec.aliases)
        return fixed

    def _method_hit(self, rule: Rule, chain: _Chain, paths: dict[str, list[str]]) -> None:
        confidence = rule.confidence
        receiver = chain.receiver
        if type(receiver) is cst.Call:
            # `torch.zeros(2).cuda()`: the receiver is built by a torch function, so it is a tensor
            # or module for certain.
            func = dotted(receiver.func)
            if func is not None:
                base, _, rest = func.partition(".")
                if any(p.split(".")[0] == "torch" for p in paths.get(base, ())):
                    confidence = "certain"
        attr = chain.names[-1]
        hit = Hit(rule, attr, attr.value, confidence)
        fix = rule.fix
        if fix is not None and fix.kind == "rename-method" and self.index.fixes_enabled:
            hit.fixable = True
            hit.edits.append(Edit(rule.code, attr, new=attr.with_changes(value=fix.to),
                                  before=f".{attr.value}", after=f".{fix.to}",
                                  add_import=fix.add_import, anchor=attr))
        self.hits.append(hit)

    def _name_hit(self, rule: Rule, qualified: str, key: str, chain: _Chain, import_fixed: bool) -> None:
        # `torch.cuda.Stream.wait_stream` is reported as torch.cuda.Stream; a pattern match
        # (`torch.cuda.*`) by its full name.
        shown = key if key in rule.names else qualified
        hit = Hit(rule, chain.node, shown, rule.confidence, key=key)
        fix = rule.fix
        if not self.index.fixes_enabled or fix is None:
            pass
        elif fix.kind == "rename" and key in rule.renames:
            old_parts = key.split(".")
            new_parts = rule.renames[key].split(".")
            # `torch.cuda.Stream.wait_stream` matched `torch.cuda.Stream`: rename within that part.
            extra = len(qualified.split(".")) - len(old_parts)
            written = chain.names[:len(chain.names) - extra]
            offset = len(old_parts) - len(written)   # parts the base name stands for, minus one
            changed = [i for i, (a, b) in enumerate(zip(old_parts, new_parts)) if a != b]
            if written and changed and offset >= 0 and all(i > offset for i in changed):
                hit.fixable = True
                before = ".".join(n.value for n in written)
                after_parts = [n.value for n in written]
                for i in changed:
                    after_parts[i - offset] = new_parts[i]
                for i in changed:
                    name_node = written[i - offset]
                    hit.edits.append(Edit(rule.code, name_node,
                                          new=name_node.with_changes(value=new_parts[i]),
                                          add_import=fix.add_import, anchor=chain.node))
                # One change-list row per chain, not per renamed part.
                hit.edits[0].before, hit.edits[0].after = before, ".".join(after_parts)
            elif import_fixed:
                hit.fixable = True   # the from-import that binds it is rewritten instead
        elif fix.kind == "todo" and chain.stmt is not None:
            if not _has_comment(chain.stmt, fix.comment or ""):
                hit.edits.append(Edit(rule.code, chain.stmt, comment=fix.comment,
                                      after=f"# {fix.comment}", anchor=chain.node))
        self.hits.append(hit)

    def _keyword_hit(self, rule: Rule, qualified: str, chain: _Chain) -> None:
        call = chain.parent
        confidence = rule.confidence
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value == rule.keyword:
                if self.module.code_for_node(arg.value).strip() in rule.safe_values:
                    return
                break
            if arg.star == "**":
                confidence = "possible"   # the keyword may come through **kwargs
        self.hits.append(Hit(rule, chain.node, qualified, confidence))

    # ------------------------------------------------------------------ positions
    def positions(self, nodes: list[cst.CSTNode]) -> dict[int, CodeRange]:
        """id(node) -> range for `nodes` (PositionProvider's numbers; see positions.py)."""
        if not self.force_scope:
            try:
                return node_ranges(self.module, nodes)
            except (AttributeError, TypeError, KeyError):
                pass  # LibCST's code generator changed under positions.py: use the reference
        computed = self._metadata().resolve(PositionProvider)
        return {id(n): computed[n] for n in nodes}

    def imports_module(self, prefix: str) -> bool:
        for rec in self.imports:
            names = [full for full, _, _ in rec.aliases] if rec.module is None else [rec.module]
            if any(n == prefix or n.startswith(prefix + ".") for n in names if n):
                return True
        return False


def _catches_import_error(handler: cst.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    types = handler.type.elements if isinstance(handler.type, cst.Tuple) else [handler.type]
    for item in types:
        expr = item.value if isinstance(item, cst.Element) else item
        name = dotted(expr)
        if name is not None and name.rsplit(".", 1)[-1] in _IMPORT_ERRORS:
            return True
    return False


def _has_comment(stmt: cst.CSTNode, text: str) -> bool:
    for line in getattr(stmt, "leading_lines", ()):
        if line.comment is not None and text in line.comment.value:
            return True
    return False
