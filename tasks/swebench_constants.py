"""SWE-bench's harness constants, read without running them: the specs, requirement paths and rewrites.

``--specs`` accepts ``swebench/harness/constants`` as SWE-bench publishes it: the package
directory, one of its files, or JSON of the same tables. The Python source is never executed
(it is model-adjacent data from the internet): :class:`_Reader` walks its syntax tree and
evaluates only what the constants are written with — literals, names assigned earlier (also in
a sibling module a star import names), ``{**A, **B}``, comprehensions and ``for`` loops over
what it already knows, ``if k in [...]``, ``+`` of lists and strings, subscript assignment,
the methods ``update``/``extend``/``append``/``keys``/``values``/``items``/``copy``/``get`` of
dicts and lists and ``replace``/``split``/``strip``/``join`` and the like of strings (not
``format``, which reads attributes), and ``int``/``str``/``float``/``list``/``dict``; strings and
containers are capped in size (a loop that doubles one stops there). A statement written with
anything else (an import of another package, a class, a function call) is skipped, with the
names it would have defined left undefined.

Three tables matter to patchgym: ``MAP_REPO_VERSION_TO_SPECS`` (per repository and version),
``MAP_REPO_TO_REQS_PATHS`` (where a spec whose ``packages`` is ``"requirements.txt"`` finds its
requirement file) and ``REPLACE_REQ_PACKAGES`` (packages SWE-bench's harness renames in those
files: ``types-pkg_resources`` was removed from PyPI). SWE-bench keeps the last in
``swebench/harness/test_spec/python.py``, so when the constants do not define it, the harness's
own list (:data:`HARNESS_REPLACE_REQ_PACKAGES`) applies, as it would in SWE-bench.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SPECS_NAME = "MAP_REPO_VERSION_TO_SPECS"
REQS_NAME = "MAP_REPO_TO_REQS_PATHS"
REPLACE_NAME = "REPLACE_REQ_PACKAGES"
#: ``REPLACE_REQ_PACKAGES`` of SWE-bench's harness (swebench/harness/test_spec/python.py).
HARNESS_REPLACE_REQ_PACKAGES: tuple[tuple[str, str | None], ...] = (("types-pkg_resources", "types-setuptools"),)
_METHODS = {dict: {"update", "keys", "values", "items", "copy", "get"},
            list: {"extend", "append", "copy"},
            str: {"replace", "split", "strip", "lower", "upper", "startswith", "endswith", "join"}}
_CALLS: dict[str, Callable[..., Any]] = {"int": int, "str": str, "float": float, "list": list, "dict": dict}
_MAX_ITEMS = 100_000  # no loop, comprehension, list or string of the constants comes near this
_MAX_CHARS = 1_000_000


class ConstantsError(ValueError):
    """The file is not SWE-bench's constants (nor JSON of them)."""


@dataclass
class HarnessConstants:
    """The tables of SWE-bench's constants patchgym uses."""

    specs: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    reqs_paths: dict[str, list[str]] = field(default_factory=dict)
    replace_req_packages: tuple[tuple[str, str | None], ...] = HARNESS_REPLACE_REQ_PACKAGES


class _Unsupported(Exception):
    pass


class _Reader:
    """Evaluates the module-level statements of constants files over one namespace."""

    def __init__(self, namespace: dict[str, Any] | None = None) -> None:
        self.ns: dict[str, Any] = namespace if namespace is not None else {}
        self.skipped = 0

    def run(self, tree: ast.Module) -> None:
        for statement in tree.body:
            try:
                self.statement(statement, self.ns)
            except (_Unsupported, LookupError, TypeError, ValueError, AttributeError):
                self.skipped += 1

    def statement(self, node: ast.stmt, scope: dict[str, Any]) -> None:
        if isinstance(node, ast.Assign):
            value = self.expr(node.value, scope)
            for target in node.targets:
                self.assign(target, value, scope)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            self.assign(node.target, self.expr(node.value, scope), scope)
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
            self.assign(node.target, self.expr(node.target, scope) + self.expr(node.value, scope), scope)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            self.expr(node.value, scope)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            pass  # a docstring
        elif isinstance(node, ast.For) and isinstance(node.target, ast.Name) and not node.orelse:
            for item in self.bounded(self.expr(node.iter, scope)):
                scope[node.target.id] = item
                for inner in node.body:
                    self.statement(inner, scope)
        elif isinstance(node, ast.If):
            for inner in node.body if self.expr(node.test, scope) else node.orelse:
                self.statement(inner, scope)
        else:
            raise _Unsupported(type(node).__name__)

    def assign(self, target: ast.expr, value: Any, scope: dict[str, Any]) -> None:
        if isinstance(target, ast.Name):
            scope[target.id] = value
        elif isinstance(target, ast.Subscript):
            container = self.expr(target.value, scope)
            if not isinstance(container, (dict, list)):
                raise _Unsupported("subscript assignment")
            container[self.expr(target.slice, scope)] = value
        else:
            raise _Unsupported(type(target).__name__)

    @staticmethod
    def sized(value: Any) -> Any:
        """``value``, unless it is a string or container past the limits (doubling in a loop)."""
        limit = _MAX_CHARS if isinstance(value, str) else _MAX_ITEMS
        if isinstance(value, (str, list, tuple, dict, set)) and len(value) > limit:
            raise _Unsupported("too large")
        return value

    @staticmethod
    def bounded(items: Any) -> list[Any]:
        if not isinstance(items, (list, tuple, dict, set, str, type({}.keys()), type({}.values()),
                                  type({}.items()))):
            raise _Unsupported("iteration")
        items = list(items)
        if len(items) > _MAX_ITEMS:
            raise _Unsupported("too many items")
        return items

    def expr(self, node: ast.expr, scope: dict[str, Any]) -> Any:  # noqa: C901 - one case per node type
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in scope:
                return scope[node.id]
            if node.id in ("True", "False", "None"):
                return {"True": True, "False": False, "None": None}[node.id]
            raise LookupError(node.id)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items: list[Any] = []
            for element in node.elts:
                if isinstance(element, ast.Starred):
                    items += self.bounded(self.expr(element.value, scope))
                else:
                    items.append(self.expr(element, scope))
            return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](items)
        if isinstance(node, ast.Dict):
            out: dict[Any, Any] = {}
            for key, value in zip(node.keys, node.values, strict=True):
                if key is None:  # {**other}
                    merged = self.expr(value, scope)
                    if not isinstance(merged, dict):
                        raise _Unsupported("** of a non-dict")
                    out.update(merged)
                else:
                    out[self.expr(key, scope)] = self.expr(value, scope)
            return out
        if isinstance(node, (ast.DictComp, ast.ListComp, ast.SetComp)):
            return self.comprehension(node, scope)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.expr(node.left, scope), self.expr(node.right, scope)
            if type(left) is not type(right) or not isinstance(left, (list, tuple, str)):
                raise _Unsupported("+")
            return self.sized(left + right)
        if isinstance(node, ast.Subscript):
            return self.expr(node.value, scope)[self.expr(node.slice, scope)]
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            left, right = self.expr(node.left, scope), self.expr(node.comparators[0], scope)
            op = node.ops[0]
            checks = {ast.In: lambda: left in right, ast.NotIn: lambda: left not in right,
                      ast.Eq: lambda: left == right, ast.NotEq: lambda: left != right}
            if type(op) not in checks:
                raise _Unsupported("comparison")
            return checks[type(op)]()
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
            value = self.expr(node.operand, scope)
            return -value if isinstance(node.op, ast.USub) else not value
        if isinstance(node, ast.JoinedStr):
            return "".join(str(self.expr(v.value, scope)) if isinstance(v, ast.FormattedValue) else str(v.value)
                           for v in node.values)
        if isinstance(node, ast.Call) and not node.keywords:
            args = [self.expr(a, scope) for a in node.args]
            if isinstance(node.func, ast.Name) and node.func.id in _CALLS and node.func.id not in scope:
                return _CALLS[node.func.id](*args)
            if isinstance(node.func, ast.Attribute):
                receiver = self.expr(node.func.value, scope)
                if node.func.attr in _METHODS.get(type(receiver), ()):
                    result = getattr(receiver, node.func.attr)(*args)
                    self.sized(receiver)  # extend(itself) in a loop must not grow without bound
                    return self.sized(result)
        raise _Unsupported(type(node).__name__)

    def comprehension(self, node: ast.DictComp | ast.ListComp | ast.SetComp, scope: dict[str, Any]) -> Any:
        if len(node.generators) != 1 or node.generators[0].is_async:
            raise _Unsupported("comprehension")
        generator = node.generators[0]
        if not isinstance(generator.target, ast.Name):
            raise _Unsupported("comprehension target")
        results: list[Any] = []
        for item in self.bounded(self.expr(generator.iter, scope)):
            inner = {**scope, generator.target.id: item}
            if all(self.expr(test, inner) for test in generator.ifs):
                if isinstance(node, ast.DictComp):
                    results.append((self.expr(node.key, inner), self.expr(node.value, inner)))
                else:
                    results.append(self.expr(node.elt, inner))
        if isinstance(node, ast.DictComp):
            return dict(results)
        return results if isinstance(node, ast.ListComp) else set(results)


def _parse(path: Path) -> ast.Module:
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as exc:
        raise ConstantsError(f"{path}: cannot read it as Python source: {exc}") from None


def _star_imports(tree: ast.Module) -> list[str]:
    """The modules ``from x.y.name import *`` names, by their last part."""
    return [node.module.rsplit(".", 1)[-1] for node in tree.body
            if isinstance(node, ast.ImportFrom) and node.module and any(a.name == "*" for a in node.names)]


def read_python_constants(path: Path) -> dict[str, Any]:
    """The names SWE-bench's constants define, read from ``path`` (a file, or the package
    directory: each sibling module a star import of ``__init__.py`` names is read first)."""
    directory = path if path.is_dir() else path.parent
    main = directory / "__init__.py" if path.is_dir() else path
    if not main.is_file():
        raise ConstantsError(f"{path}: no __init__.py in this directory")
    namespace: dict[str, Any] = {}
    tree = _parse(main)
    for name in _star_imports(tree):
        sibling = directory / f"{name}.py"
        if sibling.is_file() and sibling != main:
            module: dict[str, Any] = {}
            _Reader(module).run(_parse(sibling))
            namespace.update({k: v for k, v in module.items() if not k.startswith("_")})
    _Reader(namespace).run(tree)
    return namespace


def _tables(values: dict[str, Any], where: Path) -> HarnessConstants:
    specs = values.get(SPECS_NAME)
    if specs is None:  # one language's file: MAP_REPO_VERSION_TO_SPECS_PY and the like
        parts = [v for k, v in values.items() if k.startswith(SPECS_NAME + "_") and isinstance(v, dict)]
        specs = {repo: versions for part in parts for repo, versions in part.items()} if parts else None
    if not isinstance(specs, dict):
        raise ConstantsError(f"{where}: no {SPECS_NAME} (nor {SPECS_NAME}_*) in it")
    out = HarnessConstants()
    for repo, versions in specs.items():
        if isinstance(versions, dict):
            out.specs[str(repo)] = {str(v): dict(c) for v, c in versions.items() if isinstance(c, dict)}
    reqs = values.get(REQS_NAME) or {}
    if isinstance(reqs, dict):
        out.reqs_paths = {str(r): [str(p) for p in (ps if isinstance(ps, (list, tuple)) else [ps])]
                          for r, ps in reqs.items()}
    replace = values.get(REPLACE_NAME)
    if isinstance(replace, (list, tuple)):
        out.replace_req_packages = tuple((str(old), None if new is None else str(new))
                                         for old, new in replace)
    return out


def read_constants(path: Path) -> HarnessConstants:
    """SWE-bench's constants from ``path``: the ``constants`` package directory or a Python file
    of it, or JSON with the same names (``{"MAP_REPO_VERSION_TO_SPECS": ..., ...}``)."""
    if path.suffix == ".json":
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConstantsError(f"{path}: cannot read JSON: {exc}") from None
        if not isinstance(values, dict):
            raise ConstantsError(f"{path}: expected an object")
        return _tables(values, path)
    return _tables(read_python_constants(path), path)


def is_constants_json(data: Any) -> bool:
    """Whether a JSON specs document holds the constants' tables rather than the spec map alone."""
    return isinstance(data, dict) and SPECS_NAME in data


def clean_requirements(text: str, replacements: tuple[tuple[str, str | None], ...]) -> str:
    """``REPLACE_REQ_PACKAGES`` applied as SWE-bench's ``clean_requirements`` does: a line naming a
    replaced package (with any version specifier) becomes the replacement, without one; a
    replacement of None removes the line."""
    for old, new in replacements:
        if new is None:
            text = re.sub(rf"^{re.escape(old)}([<>=!~]=?.*|$)\n?", "", text, flags=re.MULTILINE)
        else:
            text = re.sub(rf"^{re.escape(old)}([<>=!~]=?.*|$)", new.replace("\\", "\\\\"), text, flags=re.MULTILINE)
    return text


def _excluded(line: str) -> bool:
    return any(line.strip().startswith(x) for x in ("-e .", "#", ".[test"))


def requirements_at(read: Callable[[str], str | None], paths: list[str]) -> tuple[str, str] | None:
    """The requirements SWE-bench's ``get_requirements_by_commit`` installs: the first of ``paths``
    that ``read`` (a file at the environment's commit, None when absent) finds, its ``-r`` files
    read from beside it and put first, ``-e .``, comments and ``.[test`` lines left out. Returns
    (the path found, the text), or None when no path exists."""
    for req_path in paths:
        text = read(req_path)
        if text is not None:
            break
    else:
        return None
    req_dir = "/".join(req_path.split("/")[:-1])
    original, additional = [], []
    for line in text.split("\n"):
        if line.strip().startswith("-r"):
            name = line[len("-r"):].strip()
            extra = read(f"{req_dir}/{name}" if req_dir else name)
            if extra is not None:
                additional += [x for x in extra.split("\n") if not _excluded(x)]
        elif not _excluded(line):
            original.append(line)
    additional.append("\n".join(original))
    return req_path, "\n".join(additional)
