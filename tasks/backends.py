"""From a task to a sandbox: the one place that knows both the task model and the backends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from patchgym.sandboxes import LocalSandbox, ResourceLimits, Sandbox, SandboxSpec
from patchgym.tasks.catalog import hidden_paths, hidden_paths_of_catalog, repo_source
from patchgym.tasks.model import Task

BACKENDS = ("local", "docker", "ray")
#: Options of the ray backend that go to the sandbox on the node (the rest configure the actor).
RAY_NODE_OPTIONS = ("isolation", "pool_size", "release", "network", "lifetime")

SandboxFactory = Callable[[Task], Sandbox]


def sandbox_spec(task: Task) -> SandboxSpec:
    """The sandbox a task needs: its repository at ``base_commit`` in its environment.

    ``environment_setup_commit`` is not used for the checkout: like SWE-bench, the agent works at
    ``base_commit``; environments are keyed by their spec instead.
    """
    return SandboxSpec(
        repo=repo_source(task),
        base_commit=task.base_commit,
        environment=task.environment.to_spec(),
        hidden_paths=hidden_paths(task),
    )


def make_sandbox(task: Task, backend: str = "local", **options: Any) -> Sandbox:
    """Create a fresh sandbox for ``task`` on ``backend`` (``options`` go to the backend)."""
    limits = options.pop("limits", None)
    if limits is not None and not isinstance(limits, ResourceLimits):
        limits = ResourceLimits(**limits)
    if backend == "local":
        return LocalSandbox(sandbox_spec(task), limits=limits, **options)
    if backend == "docker":
        from patchgym.sandboxes.docker import DockerSandbox, default_pool_size, shared_pool

        pool_size = options.pop("pool_size", None)  # None: $PATCHGYM_DOCKER_POOL, else 1; 0: no warm pool
        options["pool"] = shared_pool(default_pool_size() if pool_size is None else int(pool_size))
        return DockerSandbox(sandbox_spec(task), limits=limits, **options)
    if backend == "ray":
        from patchgym.sandboxes.ray_cluster import RaySandbox

        inner_options = {k: options.pop(k) for k in RAY_NODE_OPTIONS if k in options}
        return RaySandbox(sandbox_spec(task), limits=limits, inner_options=inner_options,
                          extra_hidden=node_catalog_paths, **options)
    raise ValueError(f"unknown backend {backend!r}; available: {', '.join(BACKENDS)}")


def node_catalog_paths() -> tuple[str, ...]:
    """The task catalog as a Ray node has it installed (called on the node): hidden there too, since
    the driver's paths for it may differ from the node's."""
    return hidden_paths_of_catalog()


def sandbox_factory(backend: str = "local", **options: Any) -> SandboxFactory:
    """A one-argument factory bound to ``backend`` and its options."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; available: {', '.join(BACKENDS)}")
    return lambda task: make_sandbox(task, backend, **dict(options))
