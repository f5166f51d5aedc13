"""Applying a parsed patch in a sandbox: ``git apply``, then (if allowed) GNU ``patch --fuzz``.

Both appliers only ever read :func:`.patches.render_patch`'s canonical text of the parsed files,
never the text an agent wrote, so what is applied is exactly what the policy judged. ``patch`` is
not tried for what it handles differently from git (binary data, renames, copies, mode changes)
nor for paths inside ``.git`` (git refuses them, so patch would be the one writing them).
Git runs with hooks, fsmonitor, the global attributes file and CRLF conversion off, and with
symlinks taken literally, so that applying runs no code configured outside the repository.
"""

from __future__ import annotations

from collections.abc import Sequence

from gym_envs.grading.patches import FilePatch, PatchError, parse_patch, render_patch
from sandboxes import Sandbox, SandboxError
from sandboxes.gitops import SAFE_GIT

PATCH_FILE = ".patchgym-patch.diff"
APPLY_MARK = "patchgym-applied-with:"
GIT_APPLY = (f"{SAFE_GIT} -c core.attributesFile=/dev/null -c core.autocrlf=false -c core.symlinks=true "
             "apply --whitespace=nowarn")
# --forward: with --batch, patch would otherwise reverse-apply a hunk that looks already applied.
FUZZY_PATCH = "patch --batch --forward --fuzz=5 -p1 --no-backup-if-mismatch"


def apply_patch(sandbox: Sandbox, files_or_text: str | Sequence[FilePatch], *, fuzzy: bool = True) -> str | None:
    """Apply the files (text is parsed first, raising :class:`PatchError`); return the method that
    worked (``"git apply"`` or ``"patch --fuzz"``), or None if neither did.

    A failed ``git apply`` changes nothing, and ``patch`` runs only after its dry run succeeded, so
    every attempt starts from the same tree. All attempts run in one command (each command costs a
    sandbox start); the last output line names the method that worked. Raises SandboxError when that
    line is missing: the script itself did not run.
    """
    files = parse_patch(files_or_text) if isinstance(files_or_text, str) else list(files_or_text)
    if not files:
        raise PatchError("the patch changes no file")
    sandbox.write_file(PATCH_FILE, render_patch(files).encode("utf-8", "surrogateescape"))
    fuzz = f"{FUZZY_PATCH} -i {PATCH_FILE}"
    fallback = (f"elif {fuzz} --dry-run >/dev/null && {fuzz}; then m='patch --fuzz'; "
                if fuzzy and all(_patch_reads_like_git(f) for f in files) else "")
    script = (f"if {GIT_APPLY} {PATCH_FILE}; then m='git apply'; {fallback}"
              f"else m=''; fi; rm -f {PATCH_FILE}; echo; echo \"{APPLY_MARK}$m\"")
    result = sandbox.exec(script, timeout=120)
    last = result.output.rstrip("\n").rsplit("\n", 1)[-1]
    if not last.startswith(APPLY_MARK):
        raise SandboxError(f"patch application did not run: {result.output[-1000:]}")
    return last[len(APPLY_MARK):] or None


def _patch_reads_like_git(f: FilePatch) -> bool:
    """GNU patch cannot apply binary data, treats renames, copies and mode changes its own way, and
    writes inside ``.git``, which git refuses to."""
    mode_change = f.status == "modify" and f.old_mode != f.new_mode
    in_git_dir = any(part.lower() == ".git" for path in f.paths for part in path.split("/"))
    return not (f.binary or f.status in ("rename", "copy") or mode_change or in_git_dir)
