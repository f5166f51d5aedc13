"""Where git reads a repository being registered: a path, a bundle or a URL (:func:`open_source`),
its revisions (:func:`resolve_rev`) and the files of one commit (:class:`RepoFiles`).

GitPython, because the repository is the user's own and only read: commits and blobs come straight
from git's object database (no checkout, nothing written, no hook or filter run), so what
``repos add`` detects is exactly what sandboxes will check out. A URL or a bundle is mirrored into
the very cache sandboxes fetch from (``patchgym.sandboxes.repos``), under its lock. The harness's git work on
trees an agent touched stays hardened subprocess calls (``patchgym.sandboxes.gitops``, docs/architecture.md).

``RepoSetupError`` lives here because reading the source is the first thing registering does that
can fail; :mod:`.repo_setup` raises it too.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from git import Repo
from git.exc import GitError
from gitdb.exc import BadName, BadObject

from patchgym.sandboxes import SandboxError
from patchgym.sandboxes.locks import file_lock
from patchgym.sandboxes.paths import cache_dir
from patchgym.sandboxes.repos import _source_id, git

SCP_URL_RE = re.compile(r"^[\w.-]+@[\w.-]+:")


class RepoSetupError(ValueError):
    """The input cannot be registered as given (the message says why and what to pass instead)."""


@dataclass(frozen=True)
class GitSource:
    """A repository as ``repos add`` was given it: ``source`` is what the record stores (and git
    fetches for every sandbox), ``git_dir`` is where detection reads commits from."""

    source: str
    git_dir: Path
    is_url: bool
    notes: tuple[str, ...] = ()

    def default_repo(self, name: str) -> str:
        """``owner/name`` for task rows: the URL's, or ``local/<name>`` for a path or a bundle."""
        local = not self.is_url or self.source.startswith("file://")
        return f"local/{name}" if local else repo_from_url(self.source)


def is_url(text: str) -> bool:
    return "://" in text or bool(SCP_URL_RE.match(text))


def repo_from_url(url: str) -> str:
    """``owner/name`` of a git URL (https, ssh or scp-like), as task rows spell it."""
    path = url.split("://", 1)[1] if "://" in url else url.split(":", 1)[-1]
    parts = [p for p in path.rstrip("/").split("/") if p]
    if "://" in url and not url.startswith("file://"):
        parts = parts[1:]  # the host (and user, port)
    parts = [p.removesuffix(".git") for p in parts]
    parts = [p for p in parts if p]
    if not parts:
        raise RepoSetupError(f"cannot tell the repository name from URL {url!r}")
    return "/".join(parts[-2:]) if len(parts) >= 2 else f"remote/{parts[-1]}"


def _mirror(url: str) -> Path:
    """The cached bare mirror of ``url``, cloned or brought up to date. It is the very mirror
    sandboxes fetch from (same cache path), so registering does not clone a repository twice."""
    mirror = cache_dir("mirrors") / f"{_source_id(url)}.git"
    try:
        with file_lock(mirror.with_suffix(".lock")):
            if mirror.exists():
                git("fetch", "--quiet", "--prune", url, "+refs/*:refs/*", cwd=mirror)
            else:
                tmp = mirror.with_name(f".{mirror.name}.registering")
                if tmp.exists():  # left by an interrupted registration
                    shutil.rmtree(tmp)
                git("clone", "--quiet", "--mirror", url, str(tmp))
                tmp.rename(mirror)
    except SandboxError as exc:
        raise RepoSetupError(f"cannot fetch {url}: {str(exc).split(' failed: ', 1)[-1]}") from None
    return mirror


def open_source(path_or_url: str) -> GitSource:
    """Where to read ``path_or_url`` from: a working tree or bare repository is read in place (its
    top level, when given a subdirectory); a URL or a bundle is mirrored into the cache first."""
    if is_url(path_or_url):
        repo_from_url(path_or_url)  # fails early on a URL with no name
        return GitSource(path_or_url, _mirror(path_or_url), True)
    path = Path(path_or_url).expanduser().resolve()
    if not path.exists():
        raise RepoSetupError(f"no such path: {path_or_url} (give a local git repository or a git URL)")
    if path.is_file():
        if path.suffix != ".bundle":
            raise RepoSetupError(f"{path} is a file, not a git repository (or a .bundle)")
        return GitSource(str(path), _mirror(str(path)), False)
    try:
        with Repo(path, search_parent_directories=True) as repo:
            top = None if repo.bare else Path(repo.working_tree_dir or path).resolve()
    except (GitError, ValueError):
        raise RepoSetupError(f"{path} is not a git repository (run `git init` and commit, or give a git URL)") from None
    if top is None:
        return GitSource(str(path), path, False)
    notes = (f"{path} is inside the repository {top}; registering {top}",) if top != path else ()
    return GitSource(str(top), top, False, notes)


def resolve_rev(git_dir: Path, rev: str) -> str:
    """The full sha of ``rev`` (a branch, tag, short sha, ``HEAD~2``...)."""
    if not rev.strip() or rev.startswith("-"):
        raise RepoSetupError(f"invalid revision {rev!r}")
    with Repo(git_dir) as repo:
        try:
            return repo.commit(rev).hexsha
        except (BadName, BadObject, GitError, ValueError):
            hint = "" if repo.head.is_valid() else " (the repository has no commits yet)"
            raise RepoSetupError(f"unknown revision {rev!r} in {git_dir}{hint}") from None


def uncommitted_changes(git_dir: Path) -> bool:
    """Whether a working tree has changes a checkout at a commit will not see."""
    with Repo(git_dir) as repo:
        return not repo.bare and repo.is_dirty(index=True, working_tree=True, untracked_files=False)


class RepoFiles:
    """The files of one commit, read from git's object database (no checkout: nothing is written or
    run). It holds the repository open for its reads: close it (or use it in a ``with``)."""

    def __init__(self, git_dir: Path, commit: str) -> None:
        self.git_dir = git_dir
        self.commit = commit
        self._repo = Repo(git_dir)
        try:
            tree = self._repo.commit(commit).tree
            self._blobs = {item.path: item.binsha for item in tree.traverse() if item.type == "blob"}
        except (BadName, BadObject, GitError, ValueError) as exc:
            self._repo.close()
            raise RepoSetupError(f"cannot read commit {commit} of {git_dir}: {exc}") from None
        self.paths: frozenset[str] = frozenset(self._blobs)
        self._cache: dict[str, str | None] = {}

    def __enter__(self) -> RepoFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._repo.close()

    def exists(self, path: str) -> bool:
        return path in self.paths

    def has_dir(self, path: str) -> bool:
        prefix = path.rstrip("/") + "/"
        return any(p.startswith(prefix) for p in self.paths)

    def read(self, path: str) -> str | None:
        if path not in self._cache:
            binsha = self._blobs.get(path)
            try:
                data = None if binsha is None else self._repo.odb.stream(binsha).read()
            except (BadObject, GitError, ValueError):
                data = None
            self._cache[path] = None if data is None else data.decode("utf-8", errors="replace")
        return self._cache[path]
