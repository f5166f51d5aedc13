"""Compiled code from the agent, and binary data that inflates without bound (issue 21).

The attacks, written before the defenses:

* a PEP 552 unchecked-hash ``<pkg>/__pycache__/<module>.cpython-XY.pyc`` holding the *fixed* module
  (the interpreter uses it whatever the ``.py`` says, and ``-B`` stops writing bytecode, not reading
  it): reward 1.0 on the local backend before the defense, with the graded source unchanged;
* a sourceless ``<module>.pyc`` next to a deleted ``<module>.py`` (SourcelessFileLoader imports it);
* a native extension name (``<module>.cpython-XY-<platform>.so``), which is imported before the
  ``.py`` of the same name;
* a binary modify section replacing a pyc already in the tree, and renames/copies onto such names.

Each gives reward 0, ``resolved: false``, not masked, the compiled paths in ``ignored_paths``; gold
with each payload still resolves (the payload is dropped). Apart from the filter, the test run
itself never reads a bytecode cache from the tree (``sys.pycache_prefix``/``PYTHONPYCACHEPREFIX``
under ``/dev/null``): shown by applying the pyc without the filter (:func:`testrun.probe`).
"""

from __future__ import annotations

import base64
import os
import shlex
import struct
import tracemalloc
import zlib
from pathlib import Path

import pytest

from patchgym.grading.patch_apply import apply_patch
from patchgym.grading.patches import (
    COMPILED,
    MAX_BINARY_BLOCK,
    PatchError,
    drop_reason,
    filter_agent_patch,
    parse_patch,
    read_agent_patch,
)
from patchgym.grading.pytest_runtime import bootstrap
from patchgym.grading.testrun import TestRun, run_tests
from patchgym.grading.verifier import Verifier
from patchgym.tasks.backends import sandbox_factory
from patchgym.tasks.model import Task
from tests.test_reward_forgery import (
    Ignored,
    NoEffect,
    Repo,
    _git,
    assert_refused,
    describe,
    report_dict,
)

TASK_ID = "patchgym__semverkit-1"


# -- building the payloads ------------------------------------------------------------------------

def _fixed_module(task: Task, repo: Repo) -> tuple[str, str]:
    """The module the gold patch fixes, and its source after the fix."""
    section = parse_patch(task.patch)[0]
    path = section.new_path
    assert path and path.endswith(".py")
    repo_root = repo.root
    (repo_root / ".pg-gold.diff").write_text(task.patch)
    try:
        _git(repo_root, "apply", ".pg-gold.diff")
        fixed = (repo_root / path).read_text()
    finally:
        _git(repo_root, "reset", "-q", "--hard", task.base_commit)
        _git(repo_root, "clean", "-q", "-fdx")
    return path, fixed


def _compile_in_sandbox(task: Task, backend: str, source: str, cached_name: str) -> tuple[bytes, str, str, bytes | None]:
    """``source`` as an unchecked-hash pyc made by the task's own interpreter, its cache tag
    (``cpython-311``) and extension suffix (``.cpython-311-x86_64-linux-gnu.so``), and the bytes of
    the image's own ``<dir>/__pycache__/<cached_name>.<tag>.pyc`` if it has one (Docker images do)."""
    sandbox = sandbox_factory(backend)(task)
    try:
        sandbox.write_file("pg_fixed.py", source)
        script = ("import importlib.machinery as m, py_compile, sys; "
                  "py_compile.compile('pg_fixed.py', cfile='pg_fixed.pyc', doraise=True, "
                  "invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH); "
                  "print(sys.implementation.cache_tag); print(m.EXTENSION_SUFFIXES[0])")
        result = sandbox.exec(f"python -c {shlex.quote(script)}", timeout=120)
        assert result.ok, result.output
        tag, suffix = result.output.split()[-2:]
        try:
            existing: bytes | None = sandbox.read_file(cached_name.replace("{tag}", tag))
        except FileNotFoundError:
            existing = None
        return sandbox.read_file("pg_fixed.pyc"), tag, suffix, existing
    finally:
        sandbox.close()


def modify_diff(path: str, old: bytes, new: bytes, scratch: Path) -> str:
    """A binary modify section turning ``old`` into ``new`` at ``path`` (made in a scratch repository:
    the file is the image's, not the repository's)."""
    scratch.mkdir(parents=True, exist_ok=True)
    _git(scratch, "init", "-q")
    (scratch / path).parent.mkdir(parents=True, exist_ok=True)
    (scratch / path).write_bytes(old)
    _git(scratch, "add", "-f", path)
    _git(scratch, "commit", "-qm", "image")
    (scratch / path).write_bytes(new)
    return _git(scratch, "diff", "--binary", "--no-color", "HEAD")


class Payloads:
    """The bytecode payloads for one task on one backend."""

    def __init__(self, task: Task, repo: Repo, backend: str) -> None:
        self.module, fixed = _fixed_module(task, repo)
        head, _, name = self.module.rpartition("/")
        self.pyc, self.tag, self.suffix, self.image_pyc = _compile_in_sandbox(
            task, backend, fixed, f"{head}/__pycache__/{name[:-3]}.{{tag}}.pyc")
        self.stem = f"{head}/{name[:-3]}" if head else name[:-3]
        self.cached = f"{head}/__pycache__/{name[:-3]}.{self.tag}.pyc"
        self.sourceless = f"{self.stem}.pyc"
        self.native = f"{self.stem}{self.suffix}"
        self.repo = repo

    def unchecked_pycache(self) -> tuple[str, list[str]]:
        return self.repo.diff({self.cached: self.pyc}), [self.cached]

    def sourceless_module(self) -> tuple[str, list[str]]:
        """The .py deleted and the fixed module as a sourceless .pyc in its place."""
        return self.repo.diff({self.module: None, self.sourceless: self.pyc}), [self.sourceless]

    def sourceless_beside_gold(self) -> tuple[str, list[str]]:
        """Only the .pyc (with gold, which changes the .py, the deletion would not apply)."""
        return self.repo.diff({self.sourceless: self.pyc}), [self.sourceless]

    def image_pyc_replaced(self, scratch: Path) -> tuple[str, list[str]]:
        """A binary modify section of the image's own pyc (its blob is readable in the workspace)."""
        assert self.image_pyc is not None, "the image has no bytecode of its own"
        return modify_diff(self.cached, self.image_pyc, self.pyc, scratch), [self.cached]

    def native_name(self) -> tuple[str, list[str]]:
        return self.repo.diff({self.native: b"\x7fELF not really a shared object\n"}), [self.native]


PAYLOADS = ("unchecked_pycache", "sourceless_module", "native_name")
BESIDE_GOLD = ("unchecked_pycache", "sourceless_beside_gold", "native_name")


@pytest.fixture(scope="module")
def task() -> Task:
    from patchgym import load_task_set

    return load_task_set(None).get(TASK_ID)


@pytest.fixture(scope="module")
def repo(task, tmp_path_factory) -> Repo:
    return Repo(task, tmp_path_factory.mktemp("bytecode-repo") / task.instance_id)


@pytest.fixture(scope="module")
def local_payloads(task, repo) -> Payloads:
    return Payloads(task, repo, "local")


# -- the attacks, through the verifier ------------------------------------------------------------

@pytest.mark.parametrize("payload", PAYLOADS)
def test_compiled_payload_gets_no_reward(payload, task, local_payloads):
    patch, dropped = getattr(local_payloads, payload)()
    report = Verifier(sandbox_factory("local")).verify(task, patch)
    expect = Ignored(*dropped)
    assert_refused(report_dict(report), task, expect, report.test_output)
    assert all(report.ignored_paths and p in report.ignored_paths for p in dropped)


@pytest.mark.parametrize("payload", BESIDE_GOLD)
def test_gold_with_compiled_payload_still_resolves(payload, task, local_payloads):
    patch, dropped = getattr(local_payloads, payload)()
    report = Verifier(sandbox_factory("local")).verify(task, task.patch + patch)
    d = report_dict(report)
    assert report.resolved and report.reward == 1.0, describe(d, report.test_output)
    assert not report.infrastructure_failure and not report.tampering_detected, describe(d)
    assert report.ignored_paths == dropped


def _run_with_pyc_in_tree(task: Task, backend: str, payloads: Payloads) -> TestRun:
    """The hidden tests run with the forged pyc written straight into the grading sandbox's tree
    (past the filter: as an image's own bytecode is there, or one the filter missed)."""
    sandbox = sandbox_factory(backend)(task)
    try:
        assert apply_patch(sandbox, parse_patch(task.test_patch), fuzzy=False)
        sandbox.write_file(payloads.cached, payloads.pyc)
        return run_tests(sandbox, task.test_spec, task.FAIL_TO_PASS + task.PASS_TO_PASS)
    finally:
        sandbox.close()


def test_bytecode_in_the_tree_is_not_read_by_the_test_run(task, local_payloads):
    """The second line: the hidden tests still run the source, which is not fixed."""
    run = _run_with_pyc_in_tree(task, "local", local_payloads)
    assert run.statuses and not (set(task.FAIL_TO_PASS) & run.passed), run.output[-3000:]


def test_bytecode_in_the_tree_is_not_read_by_a_command_the_runtime_does_not_take_over(task, local_payloads):
    """A test command run as written (not ``python -m pytest``/``pytest``) gets PYTHONPYCACHEPREFIX."""
    spec = task.test_spec.model_copy(update={"command": "python -c 'import sys, pytest; sys.exit(pytest.main())'"})
    own = task.model_copy(update={"test_spec": spec})
    run = _run_with_pyc_in_tree(own, "local", local_payloads)
    assert run.statuses and not (set(task.FAIL_TO_PASS) & run.passed), run.output[-3000:]


def test_the_prefix_is_left_alone_only_where_pytest_is_the_repository(monkeypatch, tmp_path):
    """pytest-dev/pytest rows test pytest's own pyc writing in process: no prefix there."""
    import _pytest

    # Not the directory the suite runs in: a venv made inside the checkout holds this pytest.
    monkeypatch.setattr(bootstrap, "WORKSPACE", str(tmp_path))
    assert not bootstrap.runner_is_the_repository()
    monkeypatch.setattr(bootstrap, "WORKSPACE", os.path.dirname(os.path.dirname(_pytest.__file__)))
    assert bootstrap.runner_is_the_repository()


_IMPORTS = """
import sys
sys.path.insert(0, {runtime!r})
import bootstrap
if {keep!r}:
    bootstrap.read_installed_bytecode({dirs!r}, {workspace!r})
sys.pycache_prefix = bootstrap.NO_BYTECODE
sys.path[:0] = {path!r}
names = []
for name in ("forged", "in_tree_venv", "linked_in", "legacy"):
    try:
        names.append(__import__(name).VALUE)
    except SyntaxError as exc:
        names.append(type(exc).__name__)
print(" ".join(names))
"""


def _cached(directory: Path, name: str, source: str, cache: str | None = None) -> None:
    """``name.py`` holding ``source`` and its ``__pycache__`` entry compiled from ``cache``
    (unchecked-hash: read whatever the source says) or, without one, from ``source`` itself."""
    import importlib.util
    import py_compile
    import warnings

    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.py").write_text(source)
    compiled = directory / f"_{name}_cache.py"
    compiled.write_text(cache if cache is not None else source)
    mode = py_compile.PycInvalidationMode.UNCHECKED_HASH if cache is not None else py_compile.PycInvalidationMode.TIMESTAMP
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # as pip compiles an installed distribution
        target = importlib.util.cache_from_source(str(directory / f"{name}.py"))
        py_compile.compile(str(compiled), cfile=target, doraise=True, invalidation_mode=mode)
    if cache is None:  # a timestamp pyc checks the source's mtime and size: make them the source's
        os.utime(directory / f"{name}.py", (compiled.stat().st_atime, compiled.stat().st_mtime))
    compiled.unlink()


@pytest.mark.parametrize("keep", [True, False])
def test_installed_code_reads_its_own_bytecode_and_the_tree_still_does_not(keep, tmp_path):
    """flask-4045 (SWE-bench Lite): flask's ``filterwarnings = error`` turned blinker's ``invalid
    escape sequence`` into a SyntaxError when the pycache prefix made every installed module
    compile from source; installed modules read their own cache again (``keep``; without it, the
    control, the SyntaxError comes back). A forged cache in the tree, in a venv inside the tree, or
    under an installed directory's link into the tree is still never read."""
    import subprocess
    import sys

    from patchgym.grading.pytest_runtime import RUNTIME_DIR

    workspace, installed = tmp_path / "testbed", tmp_path / "venv" / "site-packages"
    forged = 'VALUE = "forged cache"\n'
    _cached(workspace, "forged", 'VALUE = "source"\n', forged)
    _cached(workspace / "venv" / "site-packages", "in_tree_venv", 'VALUE = "source"\n', forged)
    _cached(workspace / "pkg", "linked_in", 'VALUE = "source"\n', forged)
    _cached(installed, "legacy", 'PATTERN = "\\*"\nVALUE = "installed"\n')
    (installed / "linked").symlink_to(workspace / "pkg")
    script = _IMPORTS.format(runtime=str(RUNTIME_DIR), keep=keep, workspace=str(workspace),
                             dirs=[str(installed), str(workspace / "venv" / "site-packages")],
                             path=[str(workspace), str(workspace / "venv" / "site-packages"),
                                   str(installed / "linked"), str(installed)])
    run = subprocess.run([sys.executable, "-B", "-W", "error", "-c", script], capture_output=True, text=True,
                         cwd=workspace, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["source", "source", "source", "installed" if keep else "SyntaxError"]


def test_a_task_may_allow_compiled_files(task, local_payloads):
    """The opt-in keeps them (the pyc is applied; the run still reads the source, so no reward)."""
    patch, dropped = local_payloads.unchecked_pycache()
    spec = task.test_spec.model_copy(update={"allow_compiled_files": True})
    allowed = task.model_copy(update={"test_spec": spec})
    report = Verifier(sandbox_factory("local")).verify(allowed, patch)
    assert report.ignored_paths == [] and report.patch_successfully_applied, describe(report_dict(report))
    assert_refused(report_dict(report), allowed, NoEffect(), report.test_output)


def test_bytecode_on_docker_is_neither_applied_nor_read(task, repo, docker_base, tmp_path):
    """Docker: the image has its own pycs under the repository; a binary modify section replacing
    one with the fixed module is dropped, gold beside it still resolves, and a pyc written into
    the image's tree is not read by the run."""
    payloads = Payloads(task, repo, "docker")
    patch, dropped = payloads.image_pyc_replaced(tmp_path / "scratch")
    verifier = Verifier(sandbox_factory("docker"))
    report = verifier.verify(task, patch)
    assert_refused(report_dict(report), task, Ignored(*dropped), report.test_output)
    gold = verifier.verify(task, task.patch + patch)
    assert gold.resolved and gold.ignored_paths == dropped, describe(report_dict(gold), gold.test_output)
    run = _run_with_pyc_in_tree(task, "docker", payloads)
    assert run.statuses and not (set(task.FAIL_TO_PASS) & run.passed), run.output[-3000:]
    run = _run_with_pyc_in_tree(task, "docker", payloads)
    assert run.statuses and not (set(task.FAIL_TO_PASS) & run.passed), run.output[-3000:]


# -- the filter, section by section -----------------------------------------------------------------

def _literal(data: bytes) -> list[str]:
    """A ``literal`` block of git's binary patch format."""
    packed = zlib.compress(data)
    rows = [f"literal {len(data)}"]
    for k in range(0, len(packed), 52):
        row = packed[k:k + 52]
        size = len(row)
        letter = chr(ord("A") + size - 1) if size <= 26 else chr(ord("a") + size - 27)
        rows.append(letter + base64.b85encode(row.ljust((size + 3) // 4 * 4, b"\0")).decode())
    return rows


def _binary_section(header: str, forward: bytes, reverse: bytes, index: str) -> str:
    return (header + f"index {index}\nGIT binary patch\n" + "\n".join(_literal(forward)) + "\n\n"
            + "\n".join(_literal(reverse)) + "\n\n")


@pytest.mark.parametrize("section", [
    _binary_section("diff --git a/pkg/__pycache__/m.cpython-311.pyc b/pkg/__pycache__/m.cpython-311.pyc\n",
                    b"\xa7\r\r\n" + b"\x03" * 12 + b"forged", b"\xa7\r\r\n" + b"\0" * 12 + b"image",
                    "0123456789abcdef0123456789abcdef01234567..89abcdef0123456789abcdef0123456789abcdef 100644"),
    _binary_section("diff --git a/pkg/m.pyc b/pkg/m.pyc\n", b"forged", b"image",
                    "0123456789abcdef0123456789abcdef01234567..89abcdef0123456789abcdef0123456789abcdef 100644"),
    "diff --git a/notes.txt b/pkg/m.pyc\nsimilarity index 100%\nrename from notes.txt\nrename to pkg/m.pyc\n",
    "diff --git a/notes.txt b/pkg/__pycache__/m.cpython-311.pyc\nsimilarity index 100%\ncopy from notes.txt\n"
    "copy to pkg/__pycache__/m.cpython-311.pyc\n",
    "diff --git a/pkg/m.pyo b/pkg/m.pyo\ndeleted file mode 100644\n--- a/pkg/m.pyo\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n",
    "diff --git a/pkg/m.abi3.so b/pkg/m.abi3.so\nnew file mode 100755\n--- /dev/null\n+++ b/pkg/m.abi3.so\n"
    "@@ -0,0 +1 @@\n+x\n",
    "diff --git a/pkg/M.PYD b/pkg/M.PYD\nnew file mode 100644\n--- /dev/null\n+++ b/pkg/M.PYD\n@@ -0,0 +1 @@\n+x\n",
    "diff --git a/pkg/__pycache__/notes b/pkg/__pycache__/notes\nnew file mode 100644\n--- /dev/null\n"
    "+++ b/pkg/__pycache__/notes\n@@ -0,0 +1 @@\n+x\n",
], ids=["binary modify of a pycache pyc", "binary modify of a sourceless pyc", "rename onto a pyc",
        "copy onto a pycache pyc", "delete a pyo", "add an abi3 .so", "add a .PYD", "anything in __pycache__"])
def test_every_way_to_write_compiled_code_is_dropped(section):
    files = parse_patch(section)
    assert [drop_reason(f, set()) for f in files] == [COMPILED]
    filtered = filter_agent_patch(read_agent_patch(section), set())
    assert filtered.text == "" and filtered.dropped and set(filtered.reasons.values()) == {COMPILED}
    assert drop_reason(files[0], set(), allow_compiled=True) is None
    assert filter_agent_patch(read_agent_patch(section), set(), allow_compiled=True).dropped == []


def test_source_files_with_compiled_looking_names_elsewhere_are_kept():
    for path in ("pkg/pyc.py", "pkg/so_utils.py", "docs/pycache.md", "pkg/extension.c"):
        section = f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+x\n"
        assert filter_agent_patch(read_agent_patch(section), set()).dropped == [], path


# -- bounded inflation ----------------------------------------------------------------------------

def _zero_bomb(size: int) -> bytes:
    """A zlib stream of ``size`` zero bytes, built without ever holding them: 1 MiB of zeros
    deflated once and repeated (full flushes make each copy stand alone), then a final empty block
    and the Adler-32 of the zeros (a = 1, b = size mod 65521)."""
    mib = 1 << 20
    assert size % mib == 0
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    segment = deflate.compress(bytes(mib)) + deflate.flush(zlib.Z_FULL_FLUSH)
    final = zlib.compressobj(9, zlib.DEFLATED, -15).flush()
    adler = ((size % 65521) << 16) | 1
    return b"\x78\xda" + segment * (size // mib) + final + struct.pack(">I", adler)


def _bomb_patch(packed: bytes, declared: int) -> str:
    rows = []
    for k in range(0, len(packed), 52):
        row = packed[k:k + 52]
        letter = chr(ord("A") + len(row) - 1) if len(row) <= 26 else chr(ord("a") + len(row) - 27)
        rows.append(letter + base64.b85encode(row.ljust((len(row) + 3) // 4 * 4, b"\0")).decode())
    return ("diff --git a/blob.bin b/blob.bin\nnew file mode 100644\nindex 0000000..1111111\nGIT binary patch\n"
            f"literal {declared}\n" + "\n".join(rows) + "\n\nliteral 0\nHcmV?d00001\n\n")


def test_the_zero_bomb_is_what_it_says():
    assert zlib.decompress(_zero_bomb(3 << 20)) == bytes(3 << 20)


@pytest.mark.parametrize("declared", [1 << 30, 10], ids=["declared 1 GiB", "declared 10 bytes"])
def test_a_small_patch_inflating_to_a_gibibyte_is_refused_in_bounded_memory(declared):
    packed = _zero_bomb(1 << 30)  # ~1 MiB of zlib, 1 GiB inflated
    patch = _bomb_patch(packed, declared)
    assert len(patch) < 4 << 20
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        with pytest.raises(PatchError, match="binary") as raised:
            filter_agent_patch(read_agent_patch(patch), set())
        peak = tracemalloc.get_traced_memory()[1] - baseline
    finally:
        tracemalloc.stop()
    assert peak < 16 * len(patch) + (8 << 20), f"parsing took {peak >> 20} MiB"
    assert str(MAX_BINARY_BLOCK) in str(raised.value) or "more than 10 bytes" in str(raised.value)


def test_an_inflating_patch_is_the_agents_failure(task):
    patch = _bomb_patch(_zero_bomb(64 << 20), 10)
    report = Verifier(sandbox_factory("local")).verify(task, patch)
    assert_refused(report_dict(report), task, NoEffect(), report.test_output)
    assert "binary patch data holds more than 10 bytes" in report.error


# -- the environment's bytecode prefix (read-only, checked-hash) -----------------------------------

def _checked_pyc(source: str, imported_as: str, prefix: Path, mode) -> Path:
    """``source`` compiled as the pyc that ``sys.pycache_prefix = prefix`` finds for ``imported_as``."""
    import importlib.util
    import py_compile
    import sys

    src = prefix.parent / "pg-src.py"
    src.write_text(source)
    before, sys.pycache_prefix = sys.pycache_prefix, str(prefix)
    try:
        cfile = importlib.util.cache_from_source(imported_as)
    finally:
        sys.pycache_prefix = before
    py_compile.compile(str(src), cfile=cfile, dfile=imported_as, doraise=True, invalidation_mode=mode)
    return Path(cfile)


def _import_with_prefix(tree: Path, prefix: Path) -> str:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-I", "-X", f"pycache_prefix={prefix}", "-c",
                           f"import sys; sys.path.insert(0, {str(tree)!r}); import m; print(m.VALUE)"], cwd=tree, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_a_stale_or_forged_checked_hash_pyc_in_the_prefix_is_not_used(tmp_path):
    """What the prefix holds is checked-hash: a pyc of other source (stale after a patch changed the
    file, or forged from the fixed module) is not used, the source is. An unchecked-hash pyc would
    be (the control): which is why the prefix holds only what the environment build compiled, and
    nothing the agent runs can write to it (the tests below)."""
    from py_compile import PycInvalidationMode

    tree, prefix = tmp_path / "tree", tmp_path / "prefix"
    tree.mkdir()
    (tree / "m.py").write_text("VALUE = 'source'\n")
    cfile = _checked_pyc("VALUE = 'forged'\n", str(tree / "m.py"), prefix, PycInvalidationMode.CHECKED_HASH)
    assert _import_with_prefix(tree, prefix) == "source"
    _checked_pyc("VALUE = 'forged'\n", str(tree / "m.py"), prefix, PycInvalidationMode.UNCHECKED_HASH)
    assert _import_with_prefix(tree, prefix) == "forged"  # the control: unchecked is trusted blindly
    _checked_pyc("VALUE = 'source'\n", str(tree / "m.py"), prefix, PycInvalidationMode.CHECKED_HASH)
    assert _import_with_prefix(tree, prefix) == "source" and cfile.exists()


def test_the_compile_script_writes_only_checked_hash_pycs_at_the_imported_paths(tmp_path):
    import subprocess
    import sys

    from patchgym.sandboxes.bytecode import COMPILER

    tree, prefix = tmp_path / "checkout", tmp_path / "prefix"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "__init__.py").write_text("")
    (tree / "pkg" / "m.py").write_text("VALUE = 1\n")
    (tree / "pkg" / "data.py").write_text("def broken(:\n")
    proc = subprocess.run([sys.executable, "-I", str(COMPILER), str(prefix), f"{tree}=/testbed"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    tag = sys.implementation.cache_tag
    pycs = sorted(p.relative_to(prefix).as_posix() for p in prefix.rglob("*.pyc"))
    assert pycs == [f"testbed/pkg/__init__.{tag}.pyc", f"testbed/pkg/m.{tag}.pyc"]
    for pyc in prefix.rglob("*.pyc"):
        assert int.from_bytes(pyc.read_bytes()[4:8], "little") == 0b11, pyc  # PEP 552: hash-based, checked
    again = subprocess.run([sys.executable, "-I", str(COMPILER), str(prefix), f"{tree}=/testbed"],
                           capture_output=True, text=True, timeout=120)
    assert again.stdout.startswith("0 pycs written"), again.stdout  # up to date: nothing rewritten


def test_the_runtime_takes_a_prefix_only_outside_the_repository_and_not_writable(tmp_path, monkeypatch):
    monkeypatch.setattr(bootstrap, "WORKSPACE", str(tmp_path / "testbed"))
    (tmp_path / "testbed" / "pkg").mkdir(parents=True)
    readonly = tmp_path / "prefix"
    readonly.mkdir()
    assert bootstrap.bytecode_prefix(None) == bootstrap.NO_BYTECODE
    assert bootstrap.bytecode_prefix("relative/prefix") == bootstrap.NO_BYTECODE
    assert bootstrap.bytecode_prefix(str(tmp_path / "missing")) == bootstrap.NO_BYTECODE
    for inside in (tmp_path / "testbed", tmp_path / "testbed" / "pkg", tmp_path):  # in it, or holding it
        monkeypatch.setattr(os, "access", lambda path, mode: False)
        assert bootstrap.bytecode_prefix(str(inside)) == bootstrap.NO_BYTECODE, inside
    assert bootstrap.bytecode_prefix(str(readonly)) == str(readonly.resolve())
    monkeypatch.setattr(os, "access", lambda path, mode: True)  # writable by the test process
    assert bootstrap.bytecode_prefix(str(readonly)) == bootstrap.NO_BYTECODE


@pytest.fixture(scope="module")
def local_sandbox(task):
    sandbox = sandbox_factory("local")(task)
    yield sandbox
    sandbox.close()


def test_the_local_prefix_is_read_only_to_everything_the_agent_runs(local_sandbox):
    """A forged pyc cannot be put in the prefix: the agent's patch applies inside the workspace
    (paths leaving it are refused by the parser), and no command in the sandbox (the agent's, or the
    code under test at grading) can write to it: it is bound read-only."""
    from patchgym.sandboxes.bytecode import PREFIX_ENV

    if not local_sandbox.isolated:
        pytest.skip("the local backend without bubblewrap contains nothing (and names no prefix)")
    prefix = local_sandbox.env.bytecode
    assert prefix is not None and prefix.is_dir() and local_sandbox.env.bytecode in local_sandbox.env.mounts
    named = local_sandbox.exec(f"printf %s \"${PREFIX_ENV}\"", timeout=30).output
    assert named == str(prefix)
    attempt = local_sandbox.exec(
        f'mkdir -p "${PREFIX_ENV}/testbed" ; echo forged > "${PREFIX_ENV}/testbed/x.cpython-311.pyc" ; '
        f'touch "${PREFIX_ENV}/x"; python -c "import os; print(os.access(os.environ[\'{PREFIX_ENV}\'], os.W_OK))"',
        timeout=60)
    assert "Read-only file system" in attempt.output and attempt.output.strip().endswith("False"), attempt.output
    assert not (prefix / "x").exists() and not (prefix / "testbed" / "x.cpython-311.pyc").exists()


def _compile_into_prefix(env, source: str, imported_as: str, tmp_path: Path) -> None:
    """What the environment build does for one file (by the environment's own interpreter)."""
    import subprocess

    src = tmp_path / "pg-source.py"
    src.write_text(source)
    script = ("import importlib.util as u, py_compile as c, sys; sys.pycache_prefix = sys.argv[1]; "
              "c.compile(sys.argv[2], cfile=u.cache_from_source(sys.argv[3]), dfile=sys.argv[3], doraise=True, "
              "invalidation_mode=c.PycInvalidationMode.CHECKED_HASH)")
    subprocess.run([str(env.venv / "bin" / "python"), "-I", "-c", script, str(env.bytecode), str(src), imported_as],
                   check=True, timeout=60)


def test_the_graded_run_reads_the_prefix_and_a_stale_or_forged_pyc_there_is_not_used(task, repo, local_sandbox,
                                                                                     tmp_path):
    """The hidden tests run with the environment's prefix (not /dev/null). With the base's pyc of
    the module gold fixes there (stale once gold is applied), gold resolves; with a checked-hash
    pyc of the *fixed* module there instead (as if one could be put there), the unchanged base
    still fails. (Written here by the host, standing in for the environment build: nothing in a
    sandbox can write there, above.)"""
    if not local_sandbox.isolated:
        pytest.skip("the local backend without bubblewrap names no prefix")
    import sys

    env = local_sandbox.env
    local_sandbox.write_file("test_pg_prefix.py", "import sys\n\ndef test_prefix():\n"
                             f"    assert sys.pycache_prefix == {str(env.bytecode)!r}\n")
    run = run_tests(local_sandbox, task.test_spec, ["test_pg_prefix.py::test_prefix"])
    assert run.passed == {"test_pg_prefix.py::test_prefix"}, run.output[-3000:]

    module, fixed = _fixed_module(task, repo)
    imported_as = f"/testbed/{module}"
    cfile = env.bytecode / "testbed" / module.replace(".py", f".{sys.implementation.cache_tag}.pyc")
    original = cfile.read_bytes() if cfile.exists() else None  # the environment may be another repo's
    base = (repo.root / module).read_text()
    verifier = Verifier(sandbox_factory("local"))
    try:
        _compile_into_prefix(env, base, imported_as, tmp_path)
        report = verifier.verify(task, task.patch)
        assert report.resolved, describe(report_dict(report), report.test_output)
        _compile_into_prefix(env, fixed, imported_as, tmp_path)
        report = verifier.verify(task, repo.diff({"PG_NOTES.txt": b"nothing fixed\n"}))
        assert_refused(report_dict(report), task, NoEffect(), report.test_output)
    finally:
        if original is None:
            cfile.unlink(missing_ok=True)
        else:
            cfile.write_bytes(original)


def test_the_docker_prefix_is_in_the_image_root_owned_and_read_by_the_graded_run(task, docker_base):
    """Docker: the instance image holds the prefix outside /testbed, root's, named in the image's
    environment; commands (uid 1000, the agent's and the code under test's) cannot write to it, and
    the graded run uses it."""
    from patchgym.sandboxes.bytecode import PREFIX_ENV

    sandbox = sandbox_factory("docker")(task)
    try:
        out = sandbox.exec(f'printf "%s\\n" "${PREFIX_ENV}"; touch "${PREFIX_ENV}/x" 2>/dev/null || echo denied; '
                           f'ls "${PREFIX_ENV}/testbed" >/dev/null && echo listed', timeout=60).output.split()
        assert out[0] == "/opt/patchgym-bytecode" and out[1:] == ["denied", "listed"], out
        sandbox.write_file("test_pg_prefix.py", "import sys\n\ndef test_prefix():\n"
                           "    assert sys.pycache_prefix == '/opt/patchgym-bytecode'\n")
        run = run_tests(sandbox, task.test_spec, ["test_pg_prefix.py::test_prefix"])
        assert run.passed == {"test_pg_prefix.py::test_prefix"}, run.output[-3000:]
    finally:
        sandbox.close()
