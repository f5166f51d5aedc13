"""The workspace's diff, computed by the harness with a git directory the agent cannot touch.

Pure standard library: the Docker backend runs this same module inside its containers, as root.

The agent owns its workspace, ``.git`` included: it can delete or chmod it, plant hooks, an
fsmonitor, filters or a ``.gitattributes`` that changes what git hashes, nested repositories that
git would record as submodules, FIFOs that block a reader, symlinks out of the tree. So git never
walks or reads the workspace here. Python walks it (without following a symlink, skipping every
``.git``), reads only regular files it has just checked (and checks again, by inode, once open),
and hashes them and their trees itself into one pack in a scratch git directory whose alternates
are the pristine checkout's objects; git then only diffs that tree against the base commit, with
no hooks, attributes, filters, external diff or configuration. The one git command that looks at
the tree is ``check-ignore`` (the repository's ``.gitignore`` rules decide which new files count;
git does not follow a symlinked ``.gitignore``), and the walk has already refused any
``.gitignore`` that is not a regular file or a symlink. Nothing of the agent's runs meanwhile:
both backends kill every process a command started when it ends.

Files whose ``lstat`` (inode, size, mode, mtime and ctime, which no one can set back) is what it
was in the pristine state keep their pristine blob without being read, so a diff costs a walk plus
the bytes actually changed.

Memory stays bounded whatever the workspace holds: changed files are never held whole (hashed,
then compressed into the pack file, a chunk at a time), git writes the diff to a file, and a diff
larger than ``limit`` bytes (or changed files adding up to more) is refused before it is read.
The caller's limit is :class:`ResourceLimits.diff_bytes`, far above any real patch.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .base import DIFF_BYTES, SandboxError, WorkspaceError  # relative: copied into sandboxes as the package pgrt

CHUNK = 1 << 20  # how much of a file is held at once
MAX_NAME_BYTES = 64 << 20  # the walk's names of every file, together: no repository has 1 % of it
MAX_CHANGED_FILES = 100_000  # no patch of a repository touches more; each costs time whatever its size
MAX_DEPTH = 256
# No repository has a path near this long; past it (the workspace's own path added) the kernel's
# PATH_MAX (4096) makes the path unusable, so such a workspace is the agent's failure on every backend.
MAX_PATH_BYTES = 2048
GIT_TIMEOUT = 300.0
# Written to the checkout's .git/info/exclude so bytecode and caches never show up in diffs.
EXCLUDES = "__pycache__/\n*.py[cod]\n.pytest_cache/\n.patchgym-*\n*.egg-info/\n"
# The highest-precedence attributes file: whatever an in-tree .gitattributes says, every path is
# diffed as plain bytes (binary detection by content, no conversion, no driver).
ATTRIBUTES = "* !text !eol !crlf !ident !filter !diff !merge !working-tree-encoding !binary\n"
SAFE_CONFIG = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "core.attributesFile=/dev/null",
               "-c", "core.excludesFile=/dev/null", "-c", "diff.external=", "-c", "core.pager=cat",
               "-c", "core.symlinks=true", "-c", "core.protectNTFS=false", "-c", "core.protectHFS=false")
GITLINK = b"160000"
TREE_MODE = b"40000"
TREE, BLOB = 2, 3  # pack object types
OBJECT_NAMES = {TREE: b"tree", BLOB: b"blob"}
# For git commands that callers run inside a sandbox (in the agent's reach, so without its hooks,
# fsmonitor or diff drivers).
SAFE_GIT = ("git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c diff.external= "
            "-c core.pager=cat")

StatKey = tuple[int, int, int, int, int]


class GitFailed(SandboxError):
    """git exited with an error: the harness's fault unless git works on the pristine base
    (:func:`workspace_diff` then blames the workspace)."""


def stat_key(st: os.stat_result) -> StatKey:
    return (st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass
class Pristine:
    """The base the diff is taken against: the pristine checkout's git directory (read, never
    written), the base commit, its index entries, and the ``lstat`` of each tracked file in a tree
    known to be pristine (the checkout itself under an overlay, or the workspace right after a
    fresh copy)."""

    git_dir: Path
    base: str
    entries: dict[bytes, tuple[bytes, bytes]] = field(default_factory=dict)  # path -> (mode, sha)
    stats: dict[bytes, StatKey] = field(default_factory=dict)

    @classmethod
    def load(cls, git_dir: Path) -> Pristine:
        """Read the pristine checkout's ``HEAD`` (the base commit) and index."""
        base = _git(["rev-parse", "--verify", "HEAD^{commit}"], git_dir=git_dir, index=git_dir / "index")
        out = _git(["ls-files", "-s", "-z"], git_dir=git_dir, index=git_dir / "index")
        entries = {}
        for record in out.split(b"\0"):
            if record:
                meta, _, path = record.partition(b"\t")
                mode, sha, _stage = meta.split(b" ")
                entries[path] = (mode, sha)
        return cls(git_dir, base.strip().decode(), entries)

    def snapshot(self, tree: Path) -> None:
        """Record the ``lstat`` of every tracked file as it is in ``tree`` (a pristine tree)."""
        root = os.fsencode(tree)
        self.stats = {}
        for path in self.entries:
            try:
                self.stats[path] = stat_key(os.lstat(os.path.join(root, path)))
            except OSError:
                pass


def workspace_diff(workspace: Path, pristine: Pristine, scratch_parent: Path, limit: int = DIFF_BYTES, *,
                   mounted_for: int | None = None) -> str:
    """The workspace's change against the base commit as a git diff (binary patches included).

    ``mounted_for``: the pid of a process in whose mount namespace (not this process's) the
    workspace is mounted at ``workspace``: the tree is read through ``/proc/<pid>/root``, and git,
    which must see it at its own path, runs in that namespace. Raises :class:`WorkspaceError` when
    the workspace cannot be expressed as a patch of at most ``limit`` bytes, :class:`SandboxError`
    when git itself fails on what the harness gave it.
    """
    return workspace_diff_bytes(workspace, pristine, scratch_parent, limit, mounted_for=mounted_for).decode(
        "utf-8", errors="replace")


def workspace_diff_bytes(workspace: Path, pristine: Pristine, scratch_parent: Path, limit: int = DIFF_BYTES, *,
                         mounted_for: int | None = None) -> bytes:
    """:func:`workspace_diff` as git wrote it (bytes: the text is not always UTF-8)."""
    work_tree = workspace
    if mounted_for is not None:
        workspace = Path(f"/proc/{mounted_for}/root") / workspace.relative_to("/")
    files, special = _walk(workspace, pristine)
    for path in special:
        if os.path.basename(path) == b".gitignore":
            raise WorkspaceError(f"{_show(path)} is not a regular file")
    keep: list[tuple[bytes, bytes, bytes]] = []  # (mode, sha, path) taken as they are
    changed: list[bytes] = []
    for path, (mode, sha) in pristine.entries.items():
        st = files.get(path)
        if mode == GITLINK:
            keep.append((mode, sha, path))
        elif st is not None and stat_key(st) == pristine.stats.get(path):
            keep.append((mode, sha, path))
        elif st is not None:
            changed.append(path)
        elif path in special:
            raise WorkspaceError(f"{_show(path)} is not a regular file, a symbolic link or a directory")
    new = [p for p in files if p not in pristine.entries]
    if not changed and not new and len(keep) == len(pristine.entries):
        return b""  # the hot path of an untouched workspace: a walk and no git at all
    try:
        return _diff_changes(workspace, pristine, scratch_parent, limit, files, keep, changed, new,
                             (work_tree, mounted_for))
    except GitFailed as exc:
        if not _git_sound(pristine, scratch_parent):
            raise SandboxError(str(exc)) from None
        # git works on the pristine base and not on this workspace: the workspace is the cause.
        raise WorkspaceError(f"git cannot diff the workspace: {exc}") from None


def _diff_changes(workspace: Path, pristine: Pristine, scratch_parent: Path, limit: int,
                  files: dict[bytes, os.stat_result], keep: list[tuple[bytes, bytes, bytes]],
                  changed: list[bytes], new: list[bytes], work_tree: tuple[Path, int | None]) -> bytes:
    """The diff of a workspace with ``changed`` and ``new`` files (the rest kept as ``keep``);
    ``work_tree``: where git sees it, and in whose mount namespace (see :func:`workspace_diff`)."""
    scratch = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-diff-", dir=scratch_parent))  # the reaper's naming
    try:
        git_dir = _scratch_git_dir(scratch, pristine.git_dir)
        changed += _not_ignored(new, *work_tree, git_dir)
        if len(changed) > MAX_CHANGED_FILES:
            raise WorkspaceError(f"the workspace diff has more than {MAX_CHANGED_FILES} new and changed files "
                                 f"({len(changed)})")
        total = sum(files[p].st_size for p in changed)
        if total > limit:
            raise WorkspaceError(f"the workspace diff is larger than {_size(limit)} "
                                 f"({total} bytes of new and changed files)")
        top = os.fsencode(workspace)
        blobs: dict[bytes, tuple[bytes, os.stat_result, bytes | None]] = {}  # sha -> (path, stat, link target)
        for path in changed:
            mode, sha, target = _hash_entry(top, path, files[path])
            blobs.setdefault(sha, (path, files[path], target))
            keep.append((mode, sha, path))
        trees: dict[bytes, tuple[int, bytes]] = {}  # sha -> (pack type, content)
        tree = _object_tree(trees, keep)
        pack = scratch / "objects.pack"
        _write_pack(pack, top, blobs, trees)
        _git(["index-pack", "--stdin"], git_dir=git_dir, index=git_dir / "index", stdin_file=pack)
        out = scratch / "diff"
        _git(["diff-tree", "-r", "-p", "--binary", "--no-color", "--no-ext-diff", "--no-textconv",
              pristine.base, tree.decode()], git_dir=git_dir, index=scratch / "index", stdout_file=out)
        if out.stat().st_size > limit:
            raise WorkspaceError(f"the workspace diff is larger than {_size(limit)}")
        return out.read_bytes()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _git_sound(pristine: Pristine, scratch_parent: Path) -> bool:
    """Whether git can diff the pristine base against itself in a fresh scratch directory: if it
    can, a git failure on the workspace's content was caused by that content."""
    scratch = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-diff-", dir=scratch_parent))
    try:
        git_dir = _scratch_git_dir(scratch, pristine.git_dir)
        _git(["diff-tree", "-r", "--no-color", pristine.base, pristine.base], git_dir=git_dir,
             index=scratch / "index")
        return True
    except (OSError, SandboxError):
        return False
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _walk(workspace: Path, pristine: Pristine) -> tuple[dict[bytes, os.stat_result], set[bytes]]:
    """Every regular file and symlink under ``workspace`` by relative path, and the other
    non-directories; never following a symlink, never entering a ``.git`` (no git path may
    contain one) or a submodule of the pristine tree."""
    gitlinks = {p for p, (mode, _) in pristine.entries.items() if mode == GITLINK}
    files: dict[bytes, os.stat_result] = {}
    special: set[bytes] = set()
    top = os.fsencode(workspace)
    try:
        if not stat.S_ISDIR(os.lstat(top).st_mode):
            raise WorkspaceError("the workspace is not a directory")
    except FileNotFoundError:
        raise WorkspaceError("the workspace is gone") from None
    stack: list[tuple[bytes, int]] = [(b"", 0)]
    names = 0
    while stack:
        rel, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise WorkspaceError(f"directories are nested more than {MAX_DEPTH} deep at {_show(rel)}")
        try:
            entries = list(os.scandir(os.path.join(top, rel) if rel else top))
        except OSError as exc:
            raise WorkspaceError(f"cannot list {_show(rel) or 'the workspace'}: {exc.strerror}") from None
        for entry in entries:
            if entry.name.lower() == b".git":
                continue
            path = os.path.join(rel, entry.name) if rel else entry.name
            if len(path) > MAX_PATH_BYTES:
                raise WorkspaceError(f"a path longer than {MAX_PATH_BYTES} bytes: {_show(path)}")
            names += len(path)
            if names > MAX_NAME_BYTES:
                raise WorkspaceError(f"the workspace's file names add up to more than {_size(MAX_NAME_BYTES)}")
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as exc:
                raise WorkspaceError(f"cannot read {_show(path)}: {exc.strerror}") from None
            if stat.S_ISDIR(st.st_mode):
                if path not in gitlinks:
                    stack.append((path, depth + 1))
            elif stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                files[path] = st
            else:
                special.add(path)
    return files, special


def _not_ignored(paths: list[bytes], workspace: Path, mounted_for: int | None, git_dir: Path) -> list[bytes]:
    """``paths`` less those the repository's ignore rules (``.gitignore``, info/exclude) exclude."""
    if not paths:
        return []
    out = _git(["check-ignore", "--no-index", "-z", "--stdin"], git_dir=git_dir, index=git_dir / "no-index",
               work_tree=workspace, stdin=b"\0".join(paths) + b"\0", ok_codes=(0, 1), mounted_for=mounted_for)
    ignored = set(out.split(b"\0"))
    return [p for p in paths if p not in ignored]


def _hash_entry(workspace: bytes, path: bytes, walked: os.stat_result) -> tuple[bytes, bytes, bytes | None]:
    """The git mode and blob sha of a file or symlink (and a symlink's target), checking it is
    still what the walk saw; a file is read a chunk at a time, never held whole."""
    full = workspace + b"/" + path
    if stat.S_ISLNK(walked.st_mode):
        try:
            target = os.readlink(full)
            again = os.lstat(full)
        except OSError as exc:
            raise WorkspaceError(f"cannot read {_show(path)}: {exc.strerror}") from None
        if stat_key(again) != stat_key(walked):
            raise WorkspaceError(f"{_show(path)} changed while the diff was taken")
        return b"120000", _blob_sha(len(target), [target]), target
    mode = b"100755" if walked.st_mode & stat.S_IXUSR else b"100644"
    return mode, _blob_sha(walked.st_size, _chunks(workspace, path, walked)), None


def _blob_sha(size: int, chunks: Iterator[bytes] | list[bytes]) -> bytes:
    digest = hashlib.sha1(b"blob %d\0" % size)
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest().encode()


def _chunks(workspace: bytes, path: bytes, walked: os.stat_result) -> Iterator[bytes]:
    """A regular file's content, a chunk at a time, checking it is the file the walk saw and
    that it neither grew nor shrank since."""
    if walked.st_size == 0:
        return
    full = workspace + b"/" + path
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise WorkspaceError(f"cannot read {_show(path)}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (walked.st_dev, walked.st_ino) or not stat.S_ISREG(st.st_mode):
            raise WorkspaceError(f"{_show(path)} changed while the diff was taken")
        remaining = walked.st_size + 1
        while remaining > 0 and (chunk := os.read(fd, min(remaining, CHUNK))):
            remaining -= len(chunk)
            if remaining <= 0:
                break
            yield chunk
    finally:
        os.close(fd)
    if remaining != 1:
        raise WorkspaceError(f"{_show(path)} changed while the diff was taken")


def _object(objects: dict[bytes, tuple[int, bytes]], kind: int, data: bytes) -> bytes:
    """Add a git object (hashed as is: no filter or conversion applies); its hex sha."""
    sha = hashlib.sha1(b"%s %d\0" % (OBJECT_NAMES[kind], len(data)) + data).hexdigest().encode()
    objects.setdefault(sha, (kind, data))
    return sha


def _object_tree(objects: dict[bytes, tuple[int, bytes]], entries: list[tuple[bytes, bytes, bytes]]) -> bytes:
    """Add the tree objects of ``entries`` (mode, sha, path); the root tree's sha."""
    dirs: dict[bytes, dict[bytes, tuple[bytes, bytes]]] = {b"": {}}  # directory -> name -> (mode, sha)
    for mode, sha, path in entries:
        parent, _, name = path.rpartition(b"/")
        dirs.setdefault(parent, {})[name] = (mode, sha)
    for directory in list(dirs):
        while directory:
            directory = directory.rpartition(b"/")[0]
            dirs.setdefault(directory, {})
    for directory in sorted(dirs, key=lambda d: d.count(b"/") + bool(d), reverse=True):  # children first
        items = dirs[directory]
        # git orders a tree by name, taking a directory's name with a trailing slash
        order = sorted(items, key=lambda n: n + b"/" if items[n][0] == TREE_MODE else n)
        sha = _object(objects, TREE, b"".join(b"%s %s\0%s" % (items[n][0], n, bytes.fromhex(items[n][1].decode()))
                                              for n in order))
        if not directory:
            return sha
        parent, _, name = directory.rpartition(b"/")
        dirs[parent][name] = (TREE_MODE, sha)
    raise AssertionError("unreachable: the root is always last")


def _write_pack(pack: Path, workspace: bytes, blobs: dict[bytes, tuple[bytes, os.stat_result, bytes | None]],
                trees: dict[bytes, tuple[int, bytes]]) -> None:
    """Write ``blobs`` (streamed from the workspace, their content checked against their sha
    again) and ``trees`` as one pack file for ``git index-pack``: one file however many objects,
    where loose objects would cost a file each."""
    digest = hashlib.sha1()
    with open(pack, "wb") as out:

        def put(data: bytes) -> None:
            digest.update(data)
            out.write(data)

        put(b"PACK" + (2).to_bytes(4, "big") + (len(blobs) + len(trees)).to_bytes(4, "big"))
        for sha, (path, walked, target) in blobs.items():
            size = len(target) if target is not None else walked.st_size
            put(_pack_header(BLOB, size))
            squeeze, check = zlib.compressobj(1), hashlib.sha1(b"blob %d\0" % size)
            for chunk in [target] if target is not None else _chunks(workspace, path, walked):
                check.update(chunk)
                put(squeeze.compress(chunk))
            put(squeeze.flush())
            if check.hexdigest().encode() != sha:
                raise WorkspaceError(f"{_show(path)} changed while the diff was taken")
        for kind, data in trees.values():
            put(_pack_header(kind, len(data)))
            put(zlib.compress(data, 1))
        out.write(digest.digest())


def _pack_header(kind: int, size: int) -> bytes:
    header = bytearray([(kind << 4) | (size & 0x0F)])
    size >>= 4
    while size:
        header[-1] |= 0x80
        header.append(size & 0x7F)
        size >>= 7
    return bytes(header)


def _scratch_git_dir(scratch: Path, pristine_git: Path) -> Path:
    """A throwaway bare git directory that reads the pristine objects and writes its own."""
    git_dir = scratch / "git"
    for sub in ("objects/info", "refs", "info"):
        (git_dir / sub).mkdir(parents=True)
    (git_dir / "HEAD").write_text("ref: refs/heads/main\n")
    (git_dir / "objects" / "info" / "alternates").write_text(f"{(pristine_git / 'objects').resolve()}\n")
    (git_dir / "info" / "exclude").write_text(EXCLUDES)
    (git_dir / "info" / "attributes").write_text(ATTRIBUTES)
    return git_dir


def _git(args: list[str], *, git_dir: Path, index: Path, work_tree: Path | None = None, stdin: bytes = b"",
         ok_codes: tuple[int, ...] = (0,), stdin_file: Path | None = None, stdout_file: Path | None = None,
         mounted_for: int | None = None) -> bytes:
    """Run git with no configuration but ours, on ``git_dir``; its stdout (none when it goes to
    ``stdout_file``). ``stdin_file``: read instead of ``stdin``. With ``mounted_for``, in that
    process's mount namespace (where ``work_tree`` is mounted)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_DIR": str(git_dir), "GIT_INDEX_FILE": str(index),
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_ATTR_NOSYSTEM": "1",
           "GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0", "HOME": str(git_dir), "LC_ALL": "C"}
    if work_tree is not None:
        env["GIT_WORK_TREE"] = str(work_tree)
    # Pipes or the caller's scratch files, never the default temporary directory: in a container it is
    # the agent's.
    argv, cwd = ["git", *SAFE_CONFIG, *args], work_tree or git_dir
    if mounted_for is not None:
        argv = ["nsenter", f"--mount=/proc/{mounted_for}/ns/mnt", f"--wd={cwd}", "--", *argv]
        cwd = git_dir  # a path of this namespace too (the same file system, no mount of its own)
    with contextlib.ExitStack() as files:
        streams: dict[str, object] = {"input": stdin, "stdout": subprocess.PIPE}
        if stdin_file is not None:
            streams = {**streams, "input": None, "stdin": files.enter_context(open(stdin_file, "rb"))}
        if stdout_file is not None:
            streams["stdout"] = files.enter_context(open(stdout_file, "wb"))
        try:
            proc = subprocess.run(argv, stderr=subprocess.PIPE, env=env, cwd=cwd, timeout=GIT_TIMEOUT,
                                  **streams)  # type: ignore[call-overload]
        except subprocess.TimeoutExpired:
            raise SandboxError(f"git {args[0]} timed out after {GIT_TIMEOUT:.0f}s") from None
    if proc.returncode not in ok_codes:
        raise GitFailed(f"git {args[0]} failed: {proc.stderr[-2000:].decode(errors='replace').strip()}")
    return proc.stdout or b""


def _size(limit: int) -> str:
    return f"{limit / (1 << 20):g} MiB" if limit >= 1 << 20 else f"{limit} bytes"


def _show(path: bytes) -> str:
    """A path for a message (its start and end only, when long)."""
    text = os.fsdecode(path)
    return text if len(text) <= 200 else f"{text[:100]}...{text[-100:]}"
