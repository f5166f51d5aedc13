"""The ray backend: sandboxes hosted by actors on the nodes of a Ray cluster.

The driver side (:class:`RaySandbox`) needs Ray; the node side (:mod:`.host`, :mod:`.guard`) runs
the local or docker backend on its node. Nothing here is imported by the other backends.
"""

from patchgym.sandboxes.ray_cluster.connect import (
           RESOURCE,
           RayUnavailableError,
           ensure_connected,
           require_capacity,
           sandbox_capacity,
)
from patchgym.sandboxes.ray_cluster.sandbox import RaySandbox

__all__ = ["RESOURCE", "RaySandbox", "RayUnavailableError", "ensure_connected", "require_capacity",
           "sandbox_capacity"]
