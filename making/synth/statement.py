"""Bug reports for injected bugs, written from what the failing tests show, never from the change.

A report names the failing tests, the first error line pytest printed for each (``E ...``: an
assertion with its values, or an exception's type and message) and the library names those tests
call. It never quotes the library's source: no traceback lines, no file:line locations, and every
report is checked for the changed lines before it is used. An optional OpenAI-compatible endpoint
may rewrite it as a user would; any failure, or a rewrite that leaks, keeps the template.
"""

from __future__ import annotations

import ast
import logging
import re
from collections import Counter
from collections.abc import Iterable

from patchgym.grading.pyast import parse as parse_python

log = logging.getLogger(__name__)

SHOWN_TESTS = 5
MESSAGE_LIMIT = 200
_SECTION = re.compile(r"^={3,} (FAILURES|ERRORS|PASSES|warnings summary|short test summary info) ={3,}$")
_HEADER = re.compile(r"^_{3,} (.+?) _{3,}$")
_SUMMARY = re.compile(r"^(?:FAILED|ERROR) (\S+?)(?: - (.*))?$")
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Warning|Failed|Exit|Interrupt)):")
_NO_RAISE = re.compile(r"^Failed: DID NOT RAISE <class '(?:[\w.]+\.)?(\w+)'>")


def headline(test_id: str) -> str:
    """pytest's title for a test in its failure report: ``Class.test[param]`` for
    ``file.py::Class::test[param]``."""
    return ".".join(test_id.split("::")[1:]) or test_id


def failure_messages(output: str, tests: Iterable[str]) -> dict[str, str]:
    """The first ``E`` line of each test's failure report in pytest's output (else the short
    summary's message), for the ``tests`` that have one."""
    by_headline: dict[str, list[str]] = {}
    for test in tests:
        by_headline.setdefault(headline(test), []).append(test)
    found: dict[str, str] = {}
    section = current = None
    for line in output.splitlines():
        match = _SECTION.match(line)
        if match:
            section, current = match.group(1), None
            continue
        if section in ("FAILURES", "ERRORS"):
            header = _HEADER.match(line)
            if header:
                title = header.group(1).removeprefix("ERROR at setup of ").removeprefix("ERROR at teardown of ")
                waiting = [t for t in by_headline.get(title, []) if t not in found]
                current = waiting[0] if waiting else None
            elif current and line.startswith("E ") and line[1:].strip():
                found[current] = line[1:].strip()
                current = None
        elif section == "short test summary info":
            summary = _SUMMARY.match(line)
            if summary and summary.group(2) and summary.group(1) in by_headline.get(headline(summary.group(1)), []):
                found.setdefault(summary.group(1), summary.group(2).strip())
    return {t: _clip(m) for t, m in found.items()}


def _clip(text: str, limit: int = MESSAGE_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def test_calls(test_sources: dict[str, str], tests: Iterable[str], defined: set[str]) -> dict[str, set[str]]:
    """For each test (node id), the library names (in ``defined``) its function calls:
    ``Version.parse`` for ``Version.parse(...)``, ``satisfies`` for ``satisfies(...)``."""
    trees: dict[str, ast.Module | None] = {}
    found: dict[str, set[str]] = {}
    for test in tests:
        path, *rest = test.split("::")
        if path not in trees:
            try:
                trees[path] = parse_python(test_sources[path]) if path in test_sources else None
            except SyntaxError:
                trees[path] = None
        tree = trees[path]
        node = _find_test(tree, [re.sub(r"\[.*$", "", part) for part in rest]) if tree and rest else None
        names: set[str] = set()
        for call in ast.walk(node) if node is not None else ():
            if not isinstance(call, ast.Call):
                continue
            func = call.func
            if isinstance(func, ast.Name) and func.id in defined:
                names.add(func.id)
            elif isinstance(func, ast.Attribute) and func.attr in defined:
                owner = func.value.id if isinstance(func.value, ast.Name) else None
                names.add(f"{owner}.{func.attr}" if owner and owner in defined else func.attr)
        found[test] = names
    return found


def rank_apis(calls: dict[str, set[str]], failing: list[str]) -> list[str]:
    """The names the failing tests call, the most telling first: called by many of the failing
    tests and by few of the others (``calls`` covers the whole suite)."""
    everywhere = Counter(name for names in calls.values() for name in names)
    in_failing = Counter(name for test in failing for name in calls.get(test, ()))
    score = {name: n * n / (everywhere[name] * max(1, len(failing))) for name, n in in_failing.items()}
    return sorted(score, key=lambda name: (-score[name], -in_failing[name], name))


def _find_test(tree: ast.Module, parts: list[str]) -> ast.AST | None:
    body: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    for part in parts:
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            return None
        body = node.body  # type: ignore[attr-defined]
    return node


def _symptom(messages: list[str]) -> str:
    """What the failures have in common: an exception type, a missing exception, or wrong values."""
    kinds: Counter[str] = Counter()
    for message in messages:
        no_raise = _NO_RAISE.match(message)
        exception = _EXCEPTION.match(message)
        if no_raise:
            kinds[f"no-raise:{no_raise.group(1)}"] += 1
        elif exception and exception.group(1) not in ("AssertionError", "Failed"):
            kinds[f"raises:{exception.group(1).rsplit('.', 1)[-1]}"] += 1
        else:
            kinds["wrong"] += 1
    return kinds.most_common(1)[0][0] if kinds else "wrong"


def problem_statement(repo: str, failing: list[str], messages: dict[str, str], apis: list[str],
                      total: int) -> str:
    """A bug report from the failing tests (``failing``: node ids; ``total``: tests in the suite)."""
    subject = " / ".join(f"`{a}`" for a in apis[:2]) if apis else f"`{repo.rsplit('/', 1)[-1]}`"
    symptom = _symptom([messages[t] for t in failing if t in messages])
    if symptom.startswith("no-raise:"):
        title = f"{subject} no longer raises `{symptom.split(':', 1)[1]}` for invalid input"
    elif symptom.startswith("raises:"):
        title = f"{subject} raises `{symptom.split(':', 1)[1]}` unexpectedly"
    else:
        title = f"{subject} gives wrong results"
    lines = [title, "",
             f"Something in {repo} regressed: {len(failing)} of its {total} tests "
             f"{'fails' if len(failing) == 1 else 'fail'} at the current revision.",
             "", "Failing tests and what they report:", ""]
    for test in failing[:SHOWN_TESTS]:
        message = messages.get(test)
        lines.append(f"- `{test}` fails with `{message}`" if message else f"- `{test}` fails")
    if len(failing) > SHOWN_TESTS:
        files = sorted({t.split("::", 1)[0] for t in failing[SHOWN_TESTS:]})
        lines.append(f"- and {len(failing) - SHOWN_TESTS} more in {', '.join(files)}")
    lines += ["", "These tests describe the intended behaviour; the library should satisfy them again "
              "without the tests being changed."]
    if apis:
        lines += ["", "The failing tests call " + ", ".join(f"`{a}`" for a in apis[:5]) + "."]
    return "\n".join(lines) + "\n"


def leaks(text: str, changed: Iterable[str], minimum: int = 5) -> list[str]:
    """The changed source lines (long enough to mean something) that ``text`` quotes."""
    return [line for line in changed if len(line) >= minimum and line in text]


def safe_statement(repo: str, failing: list[str], messages: dict[str, str], apis: list[str], total: int,
                   changed: list[str]) -> str:
    """:func:`problem_statement`, with any message that quotes a changed line left out."""
    clean = {t: m for t, m in messages.items() if not leaks(m, changed)}
    text = problem_statement(repo, failing, clean, apis, total)
    if leaks(text, changed):
        text = problem_statement(repo, failing, {}, [], total)
    return text


REWRITE_PROMPT = (
    "Rewrite this bug report as a user of the library would file it on GitHub: a short title line, then "
    "a few sentences and the failing tests with their error messages. Keep every fact; add no guess about "
    "the cause, no code location and no fix. Reply with the report only.\n\n{statement}"
)


def rewrite(statement: str, *, url: str, model: str, api_key: str | None = None, changed: Iterable[str] = (),
            timeout: float = 60.0, transport: object | None = None) -> str:
    """``statement`` rewritten by an OpenAI-compatible chat endpoint (``url`` is its base, e.g.
    ``http://localhost:8000/v1``); the template itself on any error, an empty reply or a leak."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {"model": model, "temperature": 0,
            "messages": [{"role": "user", "content": REWRITE_PROMPT.format(statement=statement)}]}
    try:
        with httpx.Client(timeout=timeout, transport=transport) as client:  # type: ignore[arg-type]
            response = client.post(url.rstrip("/") + "/chat/completions", json=body, headers=headers)
            response.raise_for_status()
            text = response.json()["choices"][0]["message"]["content"]
    except Exception as exc:  # any failure keeps the template
        log.warning("problem statement rewrite failed, keeping the template: %s", exc)
        return statement
    if not isinstance(text, str) or not text.strip():
        return statement
    if leaks(text, list(changed)):
        log.warning("the rewritten problem statement quotes the changed code; keeping the template")
        return statement
    return text.strip() + "\n"
