"""From a task to a sandbox: the one place that knows both the task model and the backends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sandboxes import LocalSandbox, ResourceLimits, Sandbox, SandboxSpec
from tasks.catalog import hidden_paths, repo_source
from tasks.model import Task

BACKENDS = ("local", "docker")

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
        from sandboxes.docker import DockerSandbox, shared_pool

        pool_size = options.pop("pool_size", None)
        if pool_size:
            options["pool"] = shared_pool(int(pool_size))
        return DockerSandbox(sandbox_spec(task), limits=limits, **options)
    raise ValueError(f"unknown backend {backend!r}; available: {', '.join(BACKENDS)}")


def sandbox_factory(backend: str = "local", **options: Any) -> SandboxFactory:
    """A one-argument factory bound to ``backend`` and its options."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; available: {', '.join(BACKENDS)}")
    return lambda task: make_sandbox(task, backend, **dict(options))
