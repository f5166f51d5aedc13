"""Applying a parsed patch in a sandbox: ``git apply``, then (if allowed) GNU ``patch --fuzz``.

Both appliers only ever read :func:`.patches.render_patch`'s canonical text of the parsed files,
never the text an agent wrote, so what is applied is exactly what the policy judged. ``patch`` is
not tried for what it handles differently from git (binary data, renames, copies, mode changes)
nor for paths inside ``.git`` (git refuses them, so patch would be the one writing them).
Git runs with hooks, fsmonitor, the global attributes file and CRLF conversion off, and with
symlinks taken literally, so that applying runs no code configured outside the repository.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from patchgym.grading.patches import FilePatch, PatchError, render_patch
from patchgym.sandboxes import Sandbox, SandboxError
from patchgym.sandboxes.gitops import SAFE_GIT

PATCH_FILE = ".patchgym-patch.diff"  # the prefix of the copies' names (each has a random part)
APPLY_MARK = "patchgym-applied-with:"
GIT_APPLY = (f"{SAFE_GIT} -c core.attributesFile=/dev/null -c core.autocrlf=false -c core.symlinks=true "
             "apply --whitespace=nowarn")
# --forward: with --batch, patch would otherwise reverse-apply a hunk that looks already applied.
FUZZY_PATCH = "patch --batch --forward --fuzz=5 -p1 --no-backup-if-mismatch"


def _nonempty(files: Sequence[FilePatch]) -> Sequence[FilePatch]:
    if isinstance(files, str):  # text is a Sequence too: say so rather than render its characters
        raise TypeError("pass the parsed sections (patches.parse_patch), not the patch's text")
    if not files:
        raise PatchError("the patch changes no file")
    return files


def stage_patch(sandbox: Sandbox, files: Sequence[FilePatch]) -> str:
    """Write the patch's canonical text into the workspace under a random name, for
    :func:`apply_patch` (``staged=``) to apply later: the grader stages the test patch *before*
    the agent's patch is applied, so that nothing the agent's patch creates (a directory where the
    copy goes, a full quota) stands in the way of writing it."""
    path = f"{PATCH_FILE[:-5]}-{uuid.uuid4().hex}.diff"
    sandbox.write_file(path, render_patch(list(_nonempty(files))).encode("utf-8", "surrogateescape"))
    return path


def apply_patch(sandbox: Sandbox, files: Sequence[FilePatch], *, fuzzy: bool = True,
                staged: str | None = None) -> str | None:
    """Apply the parsed files (:func:`.patches.parse_patch`; none is a :class:`PatchError`); return the method that
    worked (``"git apply"`` or ``"patch --fuzz"``), or None if neither did. ``staged``: the path
    :func:`stage_patch` wrote the same patch to (otherwise a copy is written). The copy is removed
    in the same command, applied or not: what the tests run next must find no file that names the
    hidden tests (a child process of the code under test can read any file of the workspace).

    A failed ``git apply`` changes nothing, and ``patch`` runs only after its dry run succeeded, so
    every attempt starts from the same tree. All attempts run in one command (each command costs a
    sandbox start); the last output line names the method that worked. Raises SandboxError when that
    line is missing: the script itself did not run.
    """
    files = _nonempty(files)
    path = staged or stage_patch(sandbox, files)
    fuzz = f"{FUZZY_PATCH} -i {path}"
    fallback = (f"elif {fuzz} --dry-run >/dev/null && {fuzz}; then m='patch --fuzz'; "
                if fuzzy and all(_patch_reads_like_git(f) for f in files) else "")
    script = (f"if {GIT_APPLY} {path}; then m='git apply'; {fallback}"
              f"else m=''; fi; rm -f {path}; echo; echo \"{APPLY_MARK}$m\"")
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
