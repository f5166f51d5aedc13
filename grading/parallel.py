"""Running per-instance work on a thread pool, with results handed over as they finish."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def run_parallel(fn: Callable[[T], R], items: Iterable[T], workers: int,
                 on_result: Callable[[R], None]) -> None:
    """Call ``fn`` on every item with ``workers`` threads; ``on_result`` runs in this thread.

    On Ctrl-C the queued items are cancelled and the running ones finish (each closes its own
    sandbox), so an interrupted run leaves nothing behind.
    """
    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    try:
        futures = [pool.submit(fn, item) for item in items]
        for future in as_completed(futures):
            on_result(future.result())
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
