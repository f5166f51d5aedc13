"""Removing everything dead processes left behind, in the order that works: their cgroups first
(so their processes die), then their directories (unmounting what is still mounted) and the
half-made copies of cache entries they left under staging names, then the unfinished attempts of
environment builds nobody builds any more. Apart from :mod:`.reaper`, which only names and finds
leftovers, because the cgroup code uses those names."""

from __future__ import annotations

from patchgym.sandboxes.environments import reap_attempts
from patchgym.sandboxes.limits import reap_stale_cgroups
from patchgym.sandboxes.mounts import remove_tree
from patchgym.sandboxes.paths import cache_dir
from patchgym.sandboxes.reaper import OWNED_DIRS, STAGING_DIRS, stale_children


def reap_stale() -> int:
    """Remove leftovers of dead processes (cgroups first, so their processes die); return how many."""
    removed = reap_stale_cgroups()
    for kinds, staging in ((OWNED_DIRS, False), (STAGING_DIRS, True)):
        for kind in kinds:
            for child in stale_children(cache_dir(kind), staging=staging):
                removed += remove_tree(child)
    return removed + reap_attempts()
