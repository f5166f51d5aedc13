"""The scratch repository of ``tasks synth``: a bare clone where the mutants' commits are made and
from which the task bundles are written."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

IDENTITY = {"GIT_AUTHOR_NAME": "patchgym", "GIT_AUTHOR_EMAIL": "synth@patchgym.invalid",
            "GIT_COMMITTER_NAME": "patchgym", "GIT_COMMITTER_EMAIL": "synth@patchgym.invalid"}


class SynthError(RuntimeError):
    """Tasks cannot be made: the repository, the revision or its test suite is unusable."""


class Scratch:
    """A bare clone of the repository, where mutant commits are made."""

    def __init__(self, source: str, workdir: Path) -> None:
        self.workdir = workdir
        self.path = workdir / "scratch.git"
        self.git("clone", "--bare", "--quiet", source, str(self.path), cwd=workdir)

    def git(self, *args: str, input: bytes | None = None, env: dict[str, str] | None = None,
            cwd: Path | None = None, check: bool = True) -> str:
        full = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1", **IDENTITY, **(env or {})}
        proc = subprocess.run(["git", *args], cwd=cwd or self.path, input=input, capture_output=True, env=full,
                              timeout=600)
        if check and proc.returncode != 0:
            raise SynthError(f"git {' '.join(args[:2])} failed: {proc.stderr.decode(errors='replace').strip()}")
        return proc.stdout.decode("utf-8", errors="surrogateescape") if proc.returncode == 0 else ""

    def resolve(self, rev: str | None, fallback: str | None = None) -> str:
        """The commit ``rev`` names; by default HEAD, else ``fallback``, main, master, any branch."""
        tries = [rev] if rev else ["HEAD", *([fallback] if fallback else []), "refs/heads/main", "refs/heads/master"]
        if not rev:
            tries += self.git("for-each-ref", "--format=%(refname)", "refs/heads").split()
        for name in tries:
            sha = self.git("rev-parse", "--verify", "--quiet", f"{name}^{{commit}}", check=False).strip()
            if sha:
                return sha
        raise SynthError(f"no commit {rev!r} in the repository" if rev else "the repository has no commits")

    def files(self, rev: str) -> dict[str, str]:
        """path → mode of every file at ``rev``."""
        found = {}
        for entry in self.git("ls-tree", "-r", "-z", "--full-tree", rev).split("\0"):
            if entry and "\t" in entry:
                meta, path = entry.split("\t", 1)
                mode, kind, _ = meta.split()
                if kind == "blob":
                    found[path] = mode
        return found

    def read(self, rev: str, path: str) -> str | None:
        proc = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=self.path, capture_output=True, timeout=60)
        try:
            return proc.stdout.decode("utf-8") if proc.returncode == 0 else None
        except UnicodeDecodeError:
            return None

    def date(self, rev: str) -> str:
        return self.git("show", "-s", "--format=%cI", rev).strip()

    def commit(self, rev: str, path: str, mode: str, content: str, message: str, date: str) -> str:
        """A commit with no parent whose tree is ``rev``'s with ``path`` replaced by ``content``."""
        blob = self.git("hash-object", "-w", "--stdin", input=content.encode("utf-8")).strip()
        index = {"GIT_INDEX_FILE": str(self.workdir / f"index-{uuid.uuid4().hex}")}
        try:
            self.git("read-tree", rev, env=index)
            self.git("update-index", "--cacheinfo", f"{mode},{blob},{path}", env=index)
            tree = self.git("write-tree", env=index).strip()
        finally:
            Path(index["GIT_INDEX_FILE"]).unlink(missing_ok=True)
        dates = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
        return self.git("commit-tree", tree, "-m", message, env=dates).strip()

    def diff(self, old: str, new: str) -> str:
        return self.git("-c", "diff.noprefix=false", "diff", "--no-color", "--no-ext-diff", "--no-renames",
                        "--src-prefix=a/", "--dst-prefix=b/", old, new)

    def bundle(self, dest: Path, refs: dict[str, str]) -> None:
        """Write ``dest``: a bundle with these refs (name → commit), replacing any earlier one."""
        for name, commit in refs.items():
            self.git("update-ref", name, commit)
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}")
        try:
            self.git("bundle", "create", "--quiet", str(tmp), "--stdin", input="".join(f"{r}\n" for r in refs).encode())
            tmp.replace(dest)
        finally:
            tmp.unlink(missing_ok=True)

    def fetch_bundle(self, bundle: Path, pattern: str) -> None:
        """Take the refs matching ``pattern`` (and their commits) from an earlier run's bundle."""
        self.git("fetch", "--quiet", "--no-tags", str(bundle), f"+{pattern}:{pattern}")
