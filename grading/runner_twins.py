"""Conflicting twins (:mod:`.twins`) for Django's and SymPy's runners, whose ids are not pytest's.

:mod:`.twins` knows a test as ``path::name`` or ``path::Class::name``. These runners report
others, which are translated both ways here:

* SymPy's ``bin/test`` reports a bare function name (``test_x``) and runs whole files: a hidden
  test is found in the one module of the test patch that defines it, and no name the run gives
  may be bound in another of them (a bare name would stand for two tests);
* Django's ``runtests.py`` reports ``test_x (module.Class)`` (``(module.Class.test_x)`` from
  Python 3.11) and runs labels (``module.Class.test_x``): a hidden test is a method of a class of
  the test patch's module ``module``; an id that is a docstring line names no method and is left
  as it is.

The runner's ids in the run are mapped back to the official ones outside the sandbox, in the
wording the runner used; twins' ids are dropped from the results once checked.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from patchgym.grading import runners
from patchgym.grading.canary_copies import read_module
from patchgym.grading.outcome import TestStatus
from patchgym.grading.twins import Twins, make_twins


@dataclass
class RunnerTwins:
    """Twins made for a runner's run: ``twins`` by their ``path::...`` ids, each official id that
    was renamed -> its ``path::...`` id, and each ``path::...`` id (official, renamed, twin) -> the
    ids the runner may report for it (every wording)."""

    twins: Twins
    official: dict[str, str]
    wordings: dict[str, list[str]]

    @functools.cached_property
    def reported(self) -> dict[str, str]:
        """Each id the runner may report for a renamed test or a twin -> its ``path::...`` id."""
        return {said: run_id for run_id, words in self.wordings.items() for said in words}

    def cover(self, failing: Iterable[str]) -> bool:
        """Whether every one of ``failing`` (official ids) has twins."""
        return self.twins.cover(self.official.get(t, t) for t in failing)

    def run_ids(self, tests: Sequence[str]) -> list[str]:
        """``tests`` (official ids) as the run names them, each test with twins followed by its
        twins, the group in random order (the runner's first wording)."""
        out: list[str] = []
        for test in tests:
            if test not in self.official:
                out.append(test)
                continue
            out.extend(self.wordings[run][0] for run in self.twins.run_ids([self.official[test]]))
        return out

    def problem(self, statuses: dict[str, TestStatus]) -> str | None:
        """:meth:`.Twins.problem` of the run's results (the runner's ids)."""
        return self.twins.problem({self.reported[t]: s for t, s in statuses.items() if t in self.reported})

    def to_official(self, statuses: dict[str, TestStatus]) -> dict[str, TestStatus]:
        """The run's results by official ids: twins dropped, renamed tests under their own names (in
        the wording the runner used)."""
        back = {said: official for test, run in self.twins.renamed.items()
                for said, official in zip(self.wordings[run], self.wordings[test], strict=True)}
        return {back.get(t, t): s for t, s in statuses.items() if not self.owns(t)}

    def owns(self, reported: str) -> bool:
        """Whether ``reported`` (an id the runner gave) is a twin's."""
        return reported in self.reported and self.twins.owns(self.reported[reported])


def _locate(sources: dict[str, bytes | None]) -> dict[str, list[str]]:
    """Each name a module of ``sources`` defines at its top level -> the modules that do."""
    where: dict[str, list[str]] = {}
    for path, source in sources.items():
        module = read_module(source) if source else None
        for name in module.defined if module is not None else ():
            where.setdefault(name, []).append(path)
    return where


def _unambiguous(twins: Twins, sources: dict[str, bytes | None], bare: bool) -> bool:
    """No name the run gives is bound in another module of the run (bare ids), nor given twice."""
    given = [*twins.renamed.values(), *twins.original]
    names = [run_id.rpartition("::")[2] for run_id in given]
    if len(set(names)) < len(names):
        return False
    if not bare:
        return True
    modules = {path: read_module(source) for path, source in sources.items() if source}
    return not any(name in module.taken for run_id, name in zip(given, names, strict=True)
                   for path, module in modules.items() if module is not None and not run_id.startswith(path + "::"))


def _made(twins: Twins, official: dict[str, str], wordings: Callable[[str], list[str]]) -> RunnerTwins:
    """``official`` (official id -> ``path::...`` id) kept where it was renamed, and the runner's
    ``wordings`` of every ``path::...`` id the run knows."""
    return RunnerTwins(twins, {t: i for t, i in official.items() if i in twins.renamed},
                       {run_id: wordings(run_id) for run_id in (*twins.renamed, *twins.renamed.values(),
                                                                *twins.original)})


def sympy_twins(sources: dict[str, bytes | None], tests: Sequence[str], passing: set[str],
                rng) -> RunnerTwins | None:
    """Twins for SymPy's runner: ``tests`` are bare names, ``sources`` the test patch's modules as
    they will run. None where nothing is renamed."""
    where = _locate(sources)
    official = {t: f"{where[t][0]}::{t}" for t in tests if t not in passing and len(where.get(t, ())) == 1}
    twins = make_twins(sources, list(official.values()), rng)
    if not twins.renamed or not _unambiguous(twins, sources, bare=True):
        return None
    return _made(twins, official, lambda run_id: [run_id.rpartition("::")[2]])


def django_twins(sources: dict[str, bytes | None], tests: Sequence[str], passing: set[str],
                 rng) -> RunnerTwins | None:
    """Twins for Django's runner: ``tests`` are its ids, ``sources`` the test patch's modules (by
    path, under ``tests/``) as they will run. None where nothing is renamed."""
    modules = {runners.django_module_label(path): path for path in sources}
    official: dict[str, str] = {}
    for test in tests:
        label = runners.django_label(test) if test not in passing else None
        where, _, name = (label or "").rpartition(".")
        module, _, class_name = where.rpartition(".")
        if label and module in modules and class_name:
            official[test] = f"{modules[module]}::{class_name}::{name}"
    twins = make_twins(sources, list(official.values()), rng)
    if not twins.renamed or not _unambiguous(twins, sources, bare=False):
        return None
    labels = {path: label for label, path in modules.items()}

    def wordings(run_id: str) -> list[str]:
        path, class_name, name = run_id.split("::")
        where = f"{labels[path]}.{class_name}"
        return [f"{name} ({where})", f"{name} ({where}.{name})"]

    return _made(twins, official, wordings)
