"""Procedural bug injection: small mutations of one function at a time, over Python's ``ast``.

Every kind is a pure function from a function's syntax tree to *sites*: one place it can change
and how. :func:`mutants` turns sites into :class:`Mutant` s, each the whole module's new source.

The new source is spliced, never regenerated: the mutated node alone is rewritten in the original
text (an operator token, a constant, two swapped argument texts, deleted lines...), so comments and
formatting survive and the diff is a line or two. Every splice is checked by parsing the result and
comparing its tree with the mutated tree; when no small splice reproduces it, the changed function
alone is regenerated with :func:`ast.unparse` and put back over its own line range (the rest of the
file keeps its formatting); when that fails too, the site is dropped.
"""

from __future__ import annotations

import ast
import copy
import difflib
import io
import re
import tokenize
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from patchgym.grading.pyast import parse as parse_python

KINDS = ("operator", "comparison", "off_by_one", "remove_statement", "remove_branch", "swap_operands",
         "swap_arguments", "invert_condition", "change_default", "break_return")
DESCRIPTIONS = {
    "operator": "an arithmetic, bitwise or boolean operator changed (+ to -, * to /, and to or ...)",
    "comparison": "a comparison flipped (< to <=, == to !=, in to not in ...)",
    "off_by_one": "an integer constant or a slice bound off by one",
    "remove_statement": "a statement removed (a whole loop or if-statement included; a sole one becomes pass)",
    "remove_branch": "an else/elif branch removed, or a conditional expression reduced to one branch",
    "swap_operands": "the operands of a non-commutative operator or comparison swapped",
    "swap_arguments": "two adjacent call arguments swapped",
    "invert_condition": "an if/while/conditional-expression/comprehension condition negated",
    "change_default": "a default argument value changed",
    "break_return": "a return value replaced by None or by another local variable",
}

Edit = tuple[int, int, str]  # replace source[start:end] (character offsets) with text


@dataclass(frozen=True)
class Mutant:
    """One mutation of one function: the module's whole new source and where it changed."""

    kind: str
    function: str  # qualified name, e.g. "Version.bump"
    site: int  # which site of this kind in this function (its order in the tree)
    description: str  # what changed, for logs; never shown to an agent
    source: str
    lines: tuple[int, int]  # the function's line range in the original source

    @property
    def key(self) -> tuple[int, int, int, str]:
        return (self.lines[0], KINDS.index(self.kind), self.site, self.description)


@dataclass(frozen=True)
class Function:
    qualname: str
    node: ast.FunctionDef | ast.AsyncFunctionDef

    @property
    def lines(self) -> tuple[int, int]:
        start = min([self.node.lineno, *(d.lineno for d in self.node.decorator_list)])
        return start, self.node.end_lineno or self.node.lineno


@dataclass
class _Entry:
    """A node of a function, where it hangs (to replace it) and whether it is in the signature."""

    node: ast.AST
    parent: ast.AST
    field: str
    index: int | None
    signature: bool = False


@dataclass
class _Change:
    """What one site does: to the copied tree (``apply``) and, preferably, to the text (``edits``)."""

    position: int  # index of the entry in the function's walk order
    apply: Callable[[_Entry], None]
    edits: list[list[Edit]] = field(default_factory=list)  # candidate text edits, most faithful first
    description: str = ""


# -- reading a function -----------------------------------------------------------------------------


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _walk(func: ast.FunctionDef | ast.AsyncFunctionDef) -> list[_Entry]:
    """Every node of ``func`` a mutation may touch, in a fixed order: the defaults of its signature,
    then its body. Decorators, annotations and docstrings are left out."""
    entries: list[_Entry] = []

    def visit(node: ast.AST, parent: ast.AST, name: str, index: int | None, signature: bool) -> None:
        entries.append(_Entry(node, parent, name, index, signature))
        children(node, signature)

    def children(node: ast.AST, signature: bool) -> None:
        for name, value in ast.iter_fields(node):
            if name in ("annotation", "returns", "decorator_list", "type_comment", "type_params"):
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and name == "args":
                signature_children(value, node is func or signature)
                continue
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if not isinstance(item, ast.AST):
                        continue
                    if name == "body" and i == 0 and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                       ast.ClassDef)) and _is_docstring(item):
                        continue
                    visit(item, node, name, i, signature)
            elif isinstance(value, ast.AST):
                visit(value, node, name, None, signature)

    def signature_children(args: ast.arguments, signature: bool) -> None:
        for i, default in enumerate(args.defaults):
            visit(default, args, "defaults", i, signature)
        for i, default in enumerate(args.kw_defaults):
            if default is not None:
                visit(default, args, "kw_defaults", i, signature)

    children(func, False)
    return entries


def functions(tree: ast.Module) -> list[Function]:
    """Module-level functions and methods of (nested) classes, in source order."""
    found: list[Function] = []

    def scan(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append(Function(prefix + node.name, node))
            elif isinstance(node, ast.ClassDef):
                scan(node.body, f"{prefix}{node.name}.")

    scan(tree.body, "")
    return found


def is_trivial(func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A stub: only a docstring, ``pass``, ``...`` or ``raise NotImplementedError``."""
    body = [s for s in func.body if not _is_docstring(s)]
    if not body:
        return True
    if len(body) > 1:
        return False
    stmt = body[0]
    if isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
        return True
    if isinstance(stmt, ast.Raise) and stmt.exc is not None:
        exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
        return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"
    return False


# -- the source text ------------------------------------------------------------------------------------


class _Text:
    """Character offsets of nodes in a source (``ast`` columns are UTF-8 byte offsets)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1] if lineno - 1 < len(self.lines) else ""
        return self.starts[lineno - 1] + len(line.encode("utf-8")[:col].decode("utf-8", errors="replace"))

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (self.offset(node.lineno, node.col_offset),  # type: ignore[attr-defined]
                self.offset(node.end_lineno, node.end_col_offset))  # type: ignore[attr-defined]

    def text(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.source[start:end]

    def line_start(self, lineno: int) -> int:
        return self.starts[lineno - 1]

    def own_lines(self, node: ast.AST) -> tuple[int, int] | None:
        """The offsets of the whole lines ``node`` occupies, when nothing else is on them (a
        trailing comment may be)."""
        start, end = self.span(node)
        first = self.line_start(node.lineno)  # type: ignore[attr-defined]
        if self.source[first:start].strip():
            return None
        last_end = self.starts[node.end_lineno]  # type: ignore[attr-defined]
        rest = self.source[end:last_end].strip()
        if rest and not rest.startswith("#"):
            return None
        return first, last_end


_OPERATOR_TOKEN = re.compile(r"\*\*=?|//=?|<<=?|>>=?|==|!=|<=|>=|[-+*/%@&|^<>]=?|\bnot\s+in\b|\bis\s+not\b"
                             r"|\bin\b|\bis\b|\band\b|\bor\b|\bnot\b")


def _gap_edit(text: _Text, left: ast.AST, right: ast.AST, old: str, new: str) -> list[Edit] | None:
    """Replace the operator token ``old`` between two nodes by ``new``; None if it is not the only
    operator token there."""
    start, end = text.span(left)[1], text.span(right)[0]
    gap = text.source[start:end]
    code = re.sub(r"#[^\n]*", lambda m: " " * len(m.group()), gap)
    tokens = [m for m in _OPERATOR_TOKEN.finditer(code)]
    if len(tokens) != 1 or re.sub(r"\s+", " ", tokens[0].group()) != old:
        return None
    m = tokens[0]
    return [(start + m.start(), start + m.end(), new)]


def _swap_edit(text: _Text, a: ast.AST, b: ast.AST) -> list[Edit]:
    (a0, a1), (b0, b1) = text.span(a), text.span(b)
    return [(a0, a1, text.source[b0:b1]), (b0, b1, text.source[a0:a1])]


def _replace_edit(text: _Text, node: ast.AST, new: str) -> list[Edit]:
    start, end = text.span(node)
    return [(start, end, new)]


def _apply_edits(source: str, edits: Iterable[Edit]) -> str:
    for start, end, new in sorted(edits, key=lambda e: e[0], reverse=True):
        source = source[:start] + new + source[end:]
    return source


def _indent(code: str, prefix: str) -> str:
    """Indent ``code`` by ``prefix``, except the continuation lines of multi-line strings."""
    inside: set[int] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
                inside.update(range(tok.start[0] + 1, tok.end[0] + 1))
    except (tokenize.TokenError, SyntaxError):
        pass
    return "".join(line if (n in inside or not line.strip()) else prefix + line
                   for n, line in enumerate(code.splitlines(keepends=True), 1))


# -- the kinds --------------------------------------------------------------------------------------

_BINOP = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
          ast.Pow: "**", ast.LShift: "<<", ast.RShift: ">>", ast.BitOr: "|", ast.BitAnd: "&", ast.BitXor: "^",
          ast.MatMult: "@"}
_BINOP_SWAP: dict[type, type] = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
                                 ast.FloorDiv: ast.Mult, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult,
                                 ast.LShift: ast.RShift, ast.RShift: ast.LShift, ast.BitOr: ast.BitAnd,
                                 ast.BitAnd: ast.BitOr, ast.BitXor: ast.BitOr}
_CMPOP = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
          ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}
_CMP_FLIP: dict[type, type] = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
                               ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In,
                               ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_NON_COMMUTATIVE = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift, ast.RShift, ast.MatMult)
_ORDERED_CMP = (ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn)
_ATOMS = (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant)

Kind = Callable[[list[_Entry], _Text], Iterator[_Change]]


def _set(entry: _Entry, new: ast.AST | list[ast.stmt]) -> None:
    if entry.index is None:
        setattr(entry.parent, entry.field, new)
    else:
        getattr(entry.parent, entry.field)[entry.index] = new


def _stringy(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)))


def _set_op(op: type) -> Callable[[_Entry], None]:
    def apply(entry: _Entry) -> None:
        entry.node.op = op()  # type: ignore[attr-defined]
    return apply


def _operator(entries: list[_Entry], text: _Text) -> Iterator[_Change]:
    for pos, e in enumerate(entries):
        n = e.node
        if e.signature:
            continue
        if isinstance(n, ast.BinOp) and type(n.op) in _BINOP_SWAP:
            if _stringy(n.left) or (isinstance(n.op, ast.Add) and _stringy(n.right)):
                continue  # "%s" % x, "a" + x: a TypeError, not a bug
            old, new = _BINOP[type(n.op)], _BINOP[_BINOP_SWAP[type(n.op)]]
            edits = [ed for ed in [_gap_edit(text, n.left, n.right, old, new)] if ed]
            yield _Change(pos, _set_op(_BINOP_SWAP[type(n.op)]), edits, f"{old} -> {new}")
        elif isinstance(n, ast.AugAssign) and type(n.op) in _BINOP_SWAP:
            old, new = _BINOP[type(n.op)] + "=", _BINOP[_BINOP_SWAP[type(n.op)]] + "="
            edits = [ed for ed in [_gap_edit(text, n.target, n.value, old, new)] if ed]
            yield _Change(pos, _set_op(_BINOP_SWAP[type(n.op)]), edits, f"{old} -> {new}")
        elif isinstance(n, ast.BoolOp):
            old, new = ("and", "or") if isinstance(n.op, ast.And) else ("or", "and")
            gaps = [_gap_edit(text, a, b, old, new) for a, b in zip(n.values, n.values[1:], strict=False)]
            edits = [[ed for g in gaps for ed in g]] if all(gaps) else []
            yield _Change(pos, _set_op(ast.Or if old == "and" else ast.And), edits, f"{old} -> {new}")


def _comparison(entries: list[_Entry], text: _Text) -> Iterator[_Change]:
    for pos, e in enumerate(entries):
        n = e.node
        if e.signature or not isinstance(n, ast.Compare):
            continue
        for i, op in enumerate(n.ops):
            if type(op) not in _CMP_FLIP:
                continue
            new_op = _CMP_FLIP[type(op)]
            old, new = _CMPOP[type(op)], _CMPOP[new_op]
            left = n.left if i == 0 else n.comparators[i - 1]
            edits = [ed for ed in [_gap_edit(text, left, n.comparators[i], old, new)] if ed]

            def apply(entry: _Entry, i: int = i, new_op: type = new_op) -> None:
                entry.node.ops[i] = new_op()  # type: ignore[attr-defined]

            yield _Change(pos, apply, edits, f"{old} -> {new}")


def _off_by_one(entries: list[_Entry], text: _Text) -> Iterator[_Change]:
    for pos, e in enumerate(entries):
        n = e.node
        if e.signature:
            continue
        if isinstance(n, ast.Constant) and type(n.value) is int:
            for delta in (-1, 1):
                value = n.value + delta
                if value < 0:
                    continue

                def apply(entry: _Entry, value: int = value) -> None:
                    entry.node.value = value  # type: ignore[attr-defined]

                yield _Change(pos, apply, [_replace_edit(text, n, str(value))], f"{n.value} -> {value}")
        elif isinstance(n, ast.Slice):
            for name in ("lower", "upper"):
                bound = getattr(n, name)
                if bound is None or isinstance(bound, ast.Constant) or (
                        isinstance(bound, ast.UnaryOp) and isinstance(bound.operand, ast.Constant)):
                    continue  # constants are covered above
                for op, sym in ((ast.Add, "+"), (ast.Sub, "-")):
                    def apply(entry: _Entry, name: str = name, op: type = op) -> None:
                        old = getattr(entry.node, name)
                        setattr(entry.node, name, ast.BinOp(old, op(), ast.Constant(1)))

                    source = text.text(bound)
                    yield _Change(pos, apply, [_replace_edit(text, bound, f"{source} {sym} 1"),
                                               _replace_edit(text, bound, f"({source}) {sym} 1")],
                                  f"slice {name} bound {sym} 1")


def _removable(stmt: ast.stmt) -> bool:
    return not isinstance(stmt, (ast.Pass, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Global,
                                 ast.Nonlocal, ast.Import, ast.ImportFrom)) and not (
        isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant))


def _is_elif(text: _Text, entry: _Entry) -> bool:
    node = entry.node
    return (entry.field == "orelse" and isinstance(node, ast.If) and isinstance(entry.parent, ast.If)
            and len(entry.parent.orelse) == 1 and text.lines[node.lineno - 1].lstrip().startswith("elif"))


def _remove_statement(entries: list[_Entry], text: _Text) -> Iterator[_Change]:
    for pos, e in enumerate(entries):
        n = e.node
        if e.signature or not isinstance(n, ast.stmt) or e.index is None or not _removable(n) or _is_elif(text, e):
            continue
        siblings = getattr(e.parent, e.field)
        body = [s for s in siblings if not _is_docstring(s)] if e.field == "body" else siblings
        if len(body) >= 2:
            def apply(entry: _Entry) -> None:
                del getattr(entry.parent, entry.field)[entry.index]

            lines = text.own_lines(n)
            edits = [[(lines[0], lines[1], "")]] if lines else []
            yield _Change(pos, apply, edits, f"removed line {n.lineno}")
        else:
            def apply(entry: _Entry) -> None:
                _set(entry, ast.Pass())

            yield _Change(pos, apply, [_replace_edit(text, n, "pass")], f"line {n.lineno} replaced by pass")


def _remove_branch(entries: list[_Entry], text: _Text) -> Iterator[_Change]:
    for pos, e in enumerate(entries):
        n = e.node
        if e.signature:
            continue
        if isinstance(n, ast.If) and n.orelse:
            first = n.orelse[0]
            edits = []
            if len(n.orelse) == 1 and isinstance(first, ast.If) and text.lines[first.lineno - 1].lstrip().startswith(
                    "elif"):
                start_line = first.lineno
            else:
                start_line = next((ln for ln in range(first.lineno, n.body[-1].end_lineno, -1)
                                   if text.lines[ln - 1].lstrip().startswith("else")), None)
            if start_line is not None:
                edits.append([(text.line_start(start_line), text.starts[n.orelse[-1].end_lineno], "")])

            def apply(entry: _Entry) -> None:
                entry.node.orelse = []  # type: ignore[attr-defined]

            yield _Change(pos, apply, edits, f"removed the else branch of line {n.lineno}")
        elif isinstance(n, ast.IfExp):
            for name in ("body", "orelse"):
                branch = getattr(n, name)
                source = text.text(branch)

                def apply(entry: _Entry, name: str = name) -> None:
                    _set(entry, getattr(entry.node, name))

                yield _Change(pos, apply, [_replace_edit(text, n, source), _replace_edit(text, n, f"({source})")],
                              f"conditional expression reduced to its {'if' if name == 'body' else 'else'} branch")


def _swap_operands(entries: list[_Entry], text: _Text) -> Iterator[_Change]:
    for pos, e in enumerate(entries):
        n = e.node
        if e.signature:
            continue
        if isinstance(n, ast.BinOp) and (isinstance(n.op, _NON_COMMUTATIVE) or (
                isinstance(n.op, ast.Add) and (_stringy(n.left) or _stringy(n.right)))):
            left, right = n.left, n.right
        elif isinstance(n, ast.Compare) and len(n.ops) == 1 and isinstance(n.ops[0], _ORDERED_CMP):
            left, right = n.left, n.comparators[0]
        else:
            continue
        if text.text(left) == text.text(right):
            continue

        def apply(entry: _Entry) -> None:
            node = entry.node
            if isinstance(node, ast.BinOp):
                node.left, node.right = node.right, node.left
            else:
                node.left, node.comparators[0] = node.comparators[0], node.left  # type: ignore[attr-defined]

        yield _Change(pos, apply, [_swap_edit(text, left, right)], f"operands of line {n.lineno} swapped")


def _swap_arguments(entries: list[_Entry], text: _Text) -> Iterator[_Change]:
    for pos, e in enumerate(entries):
        n = e.node
        if e.signature or not isinstance(n, ast.Call):
            continue
        for i in range(len(n.args) - 1):
            a, b = n.args[i], n.args[i + 1]
            if isinstance(a, ast.Starred) or isinstance(b, ast.Starred) or text.text(a) == text.text(b):
                continue

            def apply(entry: _Entry, i: int = i) -> None:
                args = entry.node.args  # type: ignore[attr-defined]
                args[i], args[i + 1] = args[i + 1], args[i]

            yield _Change(pos, apply, [_swap_edit(text, a, b)], f"arguments {i} and {i + 1} swapped")
        for i in range(len(n.keywords) - 1):
            a, b = n.keywords[i], n.keywords[i + 1]
            if a.arg is None or b.arg is None or text.text(a.value) == text.text(b.value):
                continue

            def apply(entry: _Entry, i: int = i) -> None:
                kws = entry.node.keywords  # type: ignore[attr-defined]
                kws[i].value, kws[i + 1].value = kws[i + 1].value, kws[i].value

            yield _Change(pos, apply, [_swap_edit(text, a.value, b.value)], f"values of {a.arg}= and {b.arg}= swapped")


def _invert_condition(entries: list[_Entry], text: _Text) -> Iterator[_Change]:
    for pos, e in enumerate(entries):
        if e.signature:
            continue
        conditional = (isinstance(e.parent, (ast.If, ast.While, ast.IfExp)) and e.field == "test") or (
            isinstance(e.parent, ast.comprehension) and e.field == "ifs")
        if not conditional:
            continue
        n = e.node
        source = text.text(n)
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not):
            inner = text.text(n.operand)
            edits = [_replace_edit(text, n, inner), _replace_edit(text, n, f"({inner})")]

            def apply(entry: _Entry) -> None:
                _set(entry, entry.node.operand)  # type: ignore[attr-defined]

            yield _Change(pos, apply, edits, f"condition of line {n.lineno}: 'not' dropped")
        else:
            edits = [_replace_edit(text, n, f"not {source}")] if isinstance(n, _ATOMS) else []
            edits.append(_replace_edit(text, n, f"not ({source})"))

            def apply(entry: _Entry) -> None:
                _set(entry, ast.UnaryOp(ast.Not(), entry.node))

            yield _Change(pos, apply, edits, f"condition of line {n.lineno} negated")


def _changed_default(value: object) -> object:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 1.0
    if isinstance(value, str):
        return "" if value else " "
    return None


def _change_default(entries: list[_Entry], text: _Text) -> Iterator[_Change]:
    for pos, e in enumerate(entries):
        n = e.node
        if not (e.signature and e.field in ("defaults", "kw_defaults") and isinstance(n, ast.Constant)):
            continue
        if n.value is None or isinstance(n.value, (bytes, complex)) or n.value is Ellipsis:
            continue
        value = _changed_default(n.value)

        def apply(entry: _Entry, value: object = value) -> None:
            entry.node.value = value  # type: ignore[attr-defined]

        yield _Change(pos, apply, [_replace_edit(text, n, repr(value))], f"default {n.value!r} -> {value!r}")


def _locals(func: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[int, str]]:
    """(line, name) of every parameter and local assignment of ``func``, in source order."""
    names = [(func.lineno, a.arg) for a in [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs]
             if a.arg not in ("self", "cls")]
    for node in ast.walk(func):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.append((node.lineno, node.id))
    return sorted(set(names))


def _break_return(entries: list[_Entry], text: _Text, func: ast.FunctionDef | ast.AsyncFunctionDef
                  ) -> Iterator[_Change]:
    local_names = _locals(func)
    for pos, e in enumerate(entries):
        n = e.node
        if e.signature or not isinstance(n, ast.Return) or n.value is None:
            continue
        if isinstance(n.value, ast.Constant) and n.value.value is None:
            continue
        value = n.value

        def to_none(entry: _Entry) -> None:
            entry.node.value = ast.Constant(None)  # type: ignore[attr-defined]

        yield _Change(pos, to_none, [_replace_edit(text, value, "None")], f"line {n.lineno} returns None")
        returned = text.text(value)
        before = [name for line, name in local_names if line <= n.lineno and name != returned]
        if before:
            other = before[-1]

            def to_other(entry: _Entry, other: str = other) -> None:
                entry.node.value = ast.Name(other, ast.Load())  # type: ignore[attr-defined]

            yield _Change(pos, to_other, [_replace_edit(text, value, other)], f"line {n.lineno} returns {other}")


_KINDS: dict[str, Kind] = {
    "operator": _operator, "comparison": _comparison, "off_by_one": _off_by_one,
    "remove_statement": _remove_statement, "remove_branch": _remove_branch, "swap_operands": _swap_operands,
    "swap_arguments": _swap_arguments, "invert_condition": _invert_condition, "change_default": _change_default,
}


# -- from sites to mutants ---------------------------------------------------------------------------


@dataclass
class Site:
    """A mutation that has not been made yet (making it costs a parse): :meth:`make` makes it."""

    kind: str
    function: Function
    number: int
    change: _Change
    module: _Module

    def make(self) -> Mutant | None:
        return self.module.make(self)

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.function.qualname, self.kind, self.number)


class _Module:
    def __init__(self, source: str) -> None:
        self.source = source
        self.tree = parse_python(source)
        self.text = _Text(source)
        self.dump = ast.dump(self.tree)
        self._dumps: dict[str, str] = {}

    def make(self, site: Site) -> Mutant | None:
        original = site.function
        func = copy.deepcopy(original.node)
        entries = _walk(func)
        site.change.apply(entries[site.change.position])
        if original.qualname not in self._dumps:
            self._dumps[original.qualname] = ast.dump(original.node)
        before, after = self._dumps[original.qualname], ast.dump(func)
        if before == after:
            return None
        # The module's tree with this function mutated (when an identical function comes first,
        # this mutates that one instead and the site is dropped: a false negative, never a wrong mutant).
        expected = self.dump.replace(before, after, 1)
        candidates = [_apply_edits(self.source, edits) for edits in site.change.edits]
        candidates.append(self._regenerate(original, func))
        for source in candidates:
            try:
                if ast.dump(parse_python(source)) == expected:
                    return Mutant(site.kind, original.qualname, site.number, site.change.description, source,
                                  original.lines)
            except (SyntaxError, ValueError):
                continue
        return None

    def _regenerate(self, original: Function, mutated: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
        """The source with ``original``'s lines replaced by ``mutated`` unparsed (same indentation)."""
        start, end = original.lines
        line = self.text.lines[start - 1]
        prefix = line[: len(line) - len(line.lstrip())]
        try:
            code = _indent(ast.unparse(mutated) + "\n", prefix)
        except (ValueError, RecursionError):
            return self.source
        return "".join(self.text.lines[: start - 1]) + code + "".join(self.text.lines[end:])


def chosen_kinds(kinds: Iterable[str] | None = None) -> tuple[str, ...]:
    """The mutation kinds asked for (none: all of them). Raises ValueError naming the unknown ones,
    for ``patchgym tasks synth --kinds`` to report before any work starts."""
    wanted = tuple(kinds or KINDS)
    unknown = [k for k in wanted if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown mutation kind(s) {', '.join(unknown)}; known: {', '.join(KINDS)}")
    return wanted


def sites(source: str, kinds: Iterable[str] | None = None, names: Callable[[str], bool] | None = None) -> list[Site]:
    """Every site of ``kinds`` (default: all) in the functions ``names`` accepts (by qualified
    name; default: all that are not stubs), in a fixed order. Raises SyntaxError."""
    wanted = chosen_kinds(kinds)
    module = _Module(source)
    found: list[Site] = []
    for function in functions(module.tree):
        if is_trivial(function.node) or (names is not None and not names(function.qualname)):
            continue
        entries = _walk(function.node)
        for kind in KINDS:
            if kind not in wanted:
                continue
            if kind == "break_return":
                changes = _break_return(entries, module.text, function.node)
            else:
                changes = _KINDS[kind](entries, module.text)
            for number, change in enumerate(changes):
                found.append(Site(kind, function, number, change, module))
    return found


def mutants(source: str, kinds: Iterable[str] | None = None,
            names: Callable[[str], bool] | None = None) -> list[Mutant]:
    """Every mutant of ``source`` (see :func:`sites`), in site order, without duplicates (two sites
    giving the same source count once: the first)."""
    seen = {source}
    made = []
    for site in sites(source, kinds, names):
        mutant = site.make()
        if mutant is not None and mutant.source not in seen:
            seen.add(mutant.source)
            made.append(mutant)
    return made


def changed_lines(old: str, new: str) -> list[str]:
    """The lines (stripped, non-empty) that differ between two versions of a source, both sides."""
    diff = difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
    return [line[1:].strip() for line in diff
            if line[:1] in "+-" and not line.startswith(("+++", "---")) and line[1:].strip()]
