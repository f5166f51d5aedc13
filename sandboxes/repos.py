"""Pristine checkouts of a repository at a commit, with no history after that commit.

Agents have read fix commits with ``git log --all`` (SWE-bench #465), so a checkout is not a clone:
a new repository fetches exactly the objects reachable from the base commit out of a cached mirror,
and keeps one branch, no remote, no tags, no reflog, no FETCH_HEAD. Sandboxes mount the cached
checkout read-only under an overlay (or copy it where they cannot mount): it is never modified.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from patchgym.sandboxes.base import SandboxError
from patchgym.sandboxes.gitops import EXCLUDES
from patchgym.sandboxes.lifetime import run_checked
from patchgym.sandboxes.locks import file_lock
from patchgym.sandboxes.paths import cache_dir
from patchgym.sandboxes.reaper import staging_path

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "patchgym", "GIT_AUTHOR_EMAIL": "agent@patchgym.invalid",
    "GIT_COMMITTER_NAME": "patchgym", "GIT_COMMITTER_EMAIL": "agent@patchgym.invalid",
}


def git(*args: str, cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run a trusted git command (never on an agent-controlled repository)."""
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1", **GIT_IDENTITY}
    # A clone or fetch dies with this process (never an orphan writing into a mirror).
    proc = run_checked(["git", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                       stdin=subprocess.DEVNULL, timeout=600)
    if check and proc.returncode != 0:
        raise SandboxError(f"git {' '.join(args)} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _source_id(source: str) -> str:
    resolved = source
    if "://" not in source and not source.startswith("git@"):
        path = Path(source).expanduser().resolve()
        if not path.exists():
            raise SandboxError(f"repository source not found: {source}")
        resolved = str(path)
    return hashlib.sha256(resolved.encode()).hexdigest()[:16]


def _remove_leftovers(mirror: Path) -> None:
    """What a killed clone or fetch of ``mirror`` left: its half-made clone and git's lock files
    (the caller holds the mirror's lock, and git dies with whoever started it, so no git that
    could own them is running)."""
    for stale in mirror.parent.glob(f".{mirror.name}.*"):
        shutil.rmtree(stale, ignore_errors=True)
    if mirror.is_dir():
        for name in ("HEAD.lock", "config.lock", "packed-refs.lock", "shallow.lock", "index.lock", "FETCH_HEAD.lock"):
            (mirror / name).unlink(missing_ok=True)
        for lock in (mirror / "refs").rglob("*.lock"):
            lock.unlink(missing_ok=True)


def _mirror(source: str, commit: str) -> Path:
    """A bare mirror of ``source`` that contains ``commit`` (cloned once, fetched when stale)."""
    mirror = cache_dir("mirrors") / f"{_source_id(source)}.git"
    with file_lock(mirror.with_suffix(".lock")):
        _remove_leftovers(mirror)
        if not mirror.exists():
            tmp = staging_path(mirror)
            git("clone", "--quiet", "--mirror", str(source), str(tmp))
            tmp.rename(mirror)
        if git("cat-file", "-e", f"{commit}^{{commit}}", cwd=mirror, check=False).returncode != 0:
            git("fetch", "--quiet", "--prune", str(source), "+refs/*:refs/*", cwd=mirror)
        if git("cat-file", "-e", f"{commit}^{{commit}}", cwd=mirror, check=False).returncode != 0:
            raise SandboxError(f"commit {commit} is not in repository {source}")
    return mirror


def pristine_checkout(source: str, commit: str) -> Path:
    """The cached checkout of ``source`` at ``commit``; build it once (under a lock) if missing."""
    if not COMMIT_RE.match(commit):
        raise SandboxError(f"base commit must be a full 40-character sha, got {commit!r}")
    target = cache_dir("checkouts") / f"{_source_id(source)}-{commit[:16]}"
    if (target / ".git").is_dir():
        return target
    with file_lock(target.with_suffix(".lock")):
        if (target / ".git").is_dir():
            return target
        for stale in target.parent.glob(f".{target.name}.*"):  # of a killed build (we hold its lock)
            shutil.rmtree(stale, ignore_errors=True)
        mirror = _mirror(source, commit)
        tmp = staging_path(target)
        try:
            git("init", "--quiet", "--template=", "-b", "main", str(tmp))
            git("config", "core.logAllRefUpdates", "false", cwd=tmp)
            git("fetch", "--quiet", "--no-tags", "--no-write-fetch-head", str(mirror), commit, cwd=tmp)
            git("update-ref", "refs/heads/main", commit, cwd=tmp)
            git("reset", "--quiet", "--hard", "main", cwd=tmp)
            git("config", "user.name", GIT_IDENTITY["GIT_AUTHOR_NAME"], cwd=tmp)
            git("config", "user.email", GIT_IDENTITY["GIT_AUTHOR_EMAIL"], cwd=tmp)
            info = tmp / ".git" / "info"
            info.mkdir(exist_ok=True)
            (info / "exclude").write_text(EXCLUDES)
            for leftover in ("FETCH_HEAD", "ORIG_HEAD", "logs"):
                p = tmp / ".git" / leftover
                shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
            git("gc", "--quiet", "--prune=now", cwd=tmp)
            tmp.rename(target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def copy_checkout(template: Path, dest: Path) -> None:
    """Copy a pristine checkout to ``dest`` (a real copy: hard links would let writes leak back)."""
    shutil.copytree(template, dest, symlinks=True)
