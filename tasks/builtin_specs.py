"""patchgym's built-in specs (``tasks/specs/swebench.json``), derived from SWE-bench's harness.

The file is generated, never edited by hand: SWE-bench's tables for its Python repositories
(``MAP_REPO_VERSION_TO_SPECS_PY`` and ``MAP_REPO_TO_REQS_PATHS`` of
``swebench/harness/constants/python.py``, ``REPLACE_REQ_PACKAGES`` of
``swebench/harness/test_spec/python.py``, read by :mod:`patchgym.tasks.swebench_constants` without running
them), each spec given its ``log_parser`` (``MAP_REPO_TO_PARSER_PY``), then patchgym's
:data:`CHANGES` applied. A changed spec says why under ``_note`` and keeps SWE-bench's values of
the keys it changed under ``_swebench`` (null: SWE-bench had no such key), so the file shows what
SWE-bench says and what patchgym runs instead, and :func:`original` recovers SWE-bench's tables
from it (the test that the file is what :func:`derive` makes of them). The document has the
names of SWE-bench's constants, so it is read by the same code as ``--specs``
(:func:`patchgym.tasks.swebench_io.load_spec_tables`) and its requirement files are read and rewritten
exactly as theirs.

Regenerate (a SWE-bench checkout, or the ``swebench/harness`` directory of one)::

    python -m patchgym.tasks.builtin_specs SWEBENCH_DIR --source "SWE-bench/SWE-bench @ COMMIT"
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchgym.tasks.swebench_constants import (
    REPLACE_NAME,
    REQS_NAME,
    SPECS_NAME,
    HarnessConstants,
    read_constants,
    read_python_constants,
)

BUILTIN_SPECS = Path(__file__).with_name("specs") / "swebench.json"
PARSERS_NAME = "MAP_REPO_TO_PARSER_PY"
NOTE, ORIGINAL = "_note", "_swebench"


@dataclass(frozen=True)
class Change:
    """One change patchgym makes to SWE-bench's specs of a repository: keys set (``{version}`` in
    a string is the spec's version), list items added or removed; ``versions`` None is every one."""

    repo: str
    note: str
    versions: tuple[str, ...] | None = None
    set: Mapping[str, Any] = field(default_factory=dict)
    append: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    remove: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def apply(self, version: str, spec: dict[str, Any]) -> None:
        before = {key: copy.deepcopy(spec.get(key)) for key in (*self.set, *self.append, *self.remove)}
        for key, value in self.set.items():
            spec[key] = value.replace("{version}", version) if isinstance(value, str) else copy.deepcopy(value)
        for key, items in self.append.items():
            spec[key] = [*_items(spec.get(key)), *items]
        for key, items in self.remove.items():
            if key in spec:
                spec[key] = [item for item in _items(spec[key]) if item not in items]
        spec.setdefault(ORIGINAL, {}).update({k: v for k, v in before.items() if k not in spec[ORIGINAL]})
        spec[NOTE] = f"{spec[NOTE]}; {self.note}" if NOTE in spec else f"patchgym: {self.note}"


def _items(value: Any) -> list[Any]:
    return [] if value is None else [value] if isinstance(value, str) else list(value)


# What patchgym runs differently from SWE-bench, and why (each found on real checkouts in venvs).
CHANGES: tuple[Change, ...] = (
    Change("pallets/flask", versions=("2.0",), set={"reqs_path": ["requirements/tests.txt"]},
           note="requirements/tests.txt, not SWE-bench's requirements/dev.txt, whose docs part installs sphinx "
                "from a git URL (git+https://github.com/...): the tests need only tests.txt"),
    Change("psf/requests", append={"pip_packages": ("httpbin==0.10.4", "pytest-httpbin==2.1.0")},
           set={"test_cmd": ["(python -m httpbin.core --port 5081 >/dev/null 2>&1 &)",
                             "for i in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/5081) 2>/dev/null && break; "
                             "sleep 0.05; done",
                             "HTTPBIN_URL=http://127.0.0.1:5081/ pytest -rA"]},
           note="requests' tests talk to httpbin (HTTPBIN_URL, else httpbin.org; 2.10+ through pytest-httpbin's "
                "fixture), and a sandbox has no network: httpbin is served on the sandbox's loopback for the "
                "test run"),
    Change("pylint-dev/pylint", set={"install": "python -m pip install -e . --config-settings editable_mode=compat"},
           note="editable_mode=compat: pylint finds its own checkers through astroid's modutils, which maps files "
                "to modules along sys.path; setuptools' PEP 660 editable finder keeps the checkout off sys.path, "
                "so no checker loaded in a subprocess run (UnknownMessageError in tests/test_self.py)"),
    Change("pytest-dev/pytest",
           set={"install": "SETUPTOOLS_SCM_PRETEND_VERSION={version}.0 python -m pip install -e ."},
           note="the version is given to setuptools_scm, which derives it from tags; a task's checkout has none, "
                "so pytest called itself 0.1.devN and refused its own pyproject's minversion"),
    Change("sphinx-doc/sphinx", set={"test_cmd": "pytest -rA --durations 25"},
           remove={"pre_install": ("sed -i 's/pytest/pytest -rA/' tox.ini",)},
           append={"pip_packages": ("docutils<0.21", "sphinxcontrib-jsmath<2")},
           note="pytest as tox.ini's testenv runs it (python -X dev -m pytest --durations 25), not SWE-bench's "
                "'tox --current-env -epy39 -v --': tox-current-env links .tox/py39/bin/python to the running "
                "interpreter, and a venv's interpreter run from that link does not find its pyvenv.cfg (No module "
                "named pytest) (the pre_install step that added -rA to tox.ini is dropped with it); docutils<0.21 "
                "and sphinxcontrib-jsmath<2: sphinx 3.x bounds neither, docutils 0.22 removed "
                "docutils.utils.roman (which every Sphinx app imports through the LaTeX builder), 0.21 changed "
                "the man page writer's code blocks that SWE-bench's PASS_TO_PASS expects, and jsmath 2 needs "
                "Sphinx 5"),
)


def derive(constants: HarnessConstants, parsers: Mapping[str, str], source: str,
           changes: tuple[Change, ...] = CHANGES) -> dict[str, Any]:
    """The built-in specs document: SWE-bench's tables with each spec's ``log_parser`` and
    ``changes`` applied, under the names of SWE-bench's constants."""
    specs = copy.deepcopy(constants.specs)
    for repo, versions in specs.items():
        for spec in versions.values():
            if repo in parsers:
                spec["log_parser"] = parsers[repo]
    for change in changes:
        if change.repo not in specs:
            raise ValueError(f"a change for {change.repo}, which SWE-bench's specs do not list")
        for version in change.versions or tuple(specs[change.repo]):
            if version not in specs[change.repo]:
                raise ValueError(f"a change for {change.repo} {version}, which SWE-bench's specs do not list")
            change.apply(version, specs[change.repo][version])
    return {"_source": source, SPECS_NAME: specs, REQS_NAME: copy.deepcopy(constants.reqs_paths),
            REPLACE_NAME: [list(pair) for pair in constants.replace_req_packages]}


def original(document: Mapping[str, Any]) -> tuple[HarnessConstants, dict[str, str]]:
    """SWE-bench's tables as :func:`derive` found them, recovered from its document."""
    specs: dict[str, dict[str, dict[str, Any]]] = {}
    parsers: dict[str, str] = {}
    for repo, versions in document[SPECS_NAME].items():
        specs[repo] = {}
        for version, spec in versions.items():
            spec = copy.deepcopy(spec)
            for key, value in spec.pop(ORIGINAL, {}).items():
                if value is None:
                    spec.pop(key, None)
                else:
                    spec[key] = value
            spec.pop(NOTE, None)
            if "log_parser" in spec:
                parsers[repo] = spec.pop("log_parser")
            specs[repo][version] = spec
    replace = tuple((old, new) for old, new in document[REPLACE_NAME])
    return HarnessConstants(specs=specs, reqs_paths=copy.deepcopy(document[REQS_NAME]),
                            replace_req_packages=replace), parsers


def read_parsers(path: Path) -> dict[str, str]:
    """``MAP_REPO_TO_PARSER_PY`` of SWE-bench's ``log_parsers/python.py``: repository → the name of
    its parser function (read from the syntax tree: the values are functions, not data)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == PARSERS_NAME for t in node.targets)
                and isinstance(node.value, ast.Dict)):
            return {key.value: value.id for key, value in zip(node.value.keys, node.value.values, strict=True)
                    if isinstance(key, ast.Constant) and isinstance(value, ast.Name)}
    raise ValueError(f"{path}: no {PARSERS_NAME} in it")


def read_harness(root: Path) -> tuple[HarnessConstants, dict[str, str]]:
    """SWE-bench's Python tables from a checkout (or its ``swebench/harness`` directory)."""
    harness = root / "swebench" / "harness" if (root / "swebench").is_dir() else root
    constants = read_constants(harness / "constants" / "python.py")
    replace = read_python_constants(harness / "test_spec" / "python.py").get(REPLACE_NAME)
    if isinstance(replace, (list, tuple)):
        constants.replace_req_packages = tuple((str(old), None if new is None else str(new)) for old, new in replace)
    return constants, read_parsers(harness / "log_parsers" / "python.py")


def render(document: Mapping[str, Any]) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m patchgym.tasks.builtin_specs",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("swebench", type=Path, help="a SWE-bench checkout, or its swebench/harness directory")
    parser.add_argument("--source", required=True, help='where it came from: "SWE-bench/SWE-bench @ COMMIT"')
    parser.add_argument("--output", type=Path, default=BUILTIN_SPECS)
    args = parser.parse_args(argv)
    constants, parsers = read_harness(args.swebench)
    args.output.write_text(render(derive(constants, parsers, args.source)), encoding="utf-8")
    print(f"{args.output}: {len(constants.specs)} repositories, "
          f"{sum(len(v) for v in constants.specs.values())} specs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
