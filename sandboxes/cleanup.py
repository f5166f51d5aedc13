"""Removing everything dead processes left behind, in the order that works: their cgroups first
(so their processes die), then their directories (unmounting what is still mounted) and the
half-made copies of cache entries they left under staging names, then the unfinished attempts of
environment builds nobody builds any more. Apart from :mod:`.reaper`, which only names and finds
leftovers, because the cgroup code uses those names."""

from __future__ import annotations

from sandboxes.environments import reap_attempts
from sandboxes.limits import reap_stale_cgroups
from sandboxes.mounts import remove_tree
from sandboxes.paths import cache_dir
from sandboxes.reaper import OWNED_DIRS, STAGING_DIRS, stale_children, stale_staging


def reap_stale() -> int:
    """Remove leftovers of dead processes (cgroups first, so their processes die); return how many."""
    removed = reap_stale_cgroups()
    for kind in OWNED_DIRS:
        for child in stale_children(cache_dir(kind)):
            removed += remove_tree(child)
    for kind in STAGING_DIRS:
        for child in stale_staging(cache_dir(kind)):
            if child.is_dir() and not child.is_symlink():
                removed += remove_tree(child)
            else:
                child.unlink(missing_ok=True)
                removed += 1
    return removed + reap_attempts()
