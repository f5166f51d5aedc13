"""Run inside a sandbox by :mod:`.testmap` (never imported by patchgym): pytest with a plugin that
records, for each test, the functions whose code ran during it (setup, call and teardown), as
``{node id: [[path relative to the working directory, first line of the code object], ...]}``.

``python reach_plugin.py OUT [pytest args...]``. A profile hook sees every Python call; it costs a
few times the suite's own time, once per revision, and saves running the whole suite per mutant.
"""

import json
import os
import sys
import threading

import pytest

ROOT = os.path.realpath(os.getcwd())


class Reach:
    def __init__(self) -> None:
        self.current: set | None = None
        self.reached: dict[str, set] = {}
        self.files: dict[str, str | None] = {}

    def profile(self, frame, event, arg):
        if event == "call" and self.current is not None:
            code = frame.f_code
            self.current.add((code.co_filename, code.co_firstlineno))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.current = self.reached.setdefault(item.nodeid, set())
        sys.setprofile(self.profile)
        threading.setprofile(self.profile)
        try:
            yield
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
            self.current = None

    def relative(self, filename: str) -> str | None:
        if filename not in self.files:
            real = os.path.realpath(filename)
            inside = real.startswith(ROOT + os.sep) and os.sep + "site-packages" + os.sep not in real[len(ROOT):]
            self.files[filename] = os.path.relpath(real, ROOT).replace(os.sep, "/") if inside else None
        return self.files[filename]


def main() -> int:
    out, args = sys.argv[1], sys.argv[2:]
    reach = Reach()
    code = pytest.main(args, plugins=[reach])
    found = {test: sorted([path, line] for filename, line in calls if (path := reach.relative(filename)))
             for test, calls in reach.reached.items()}
    with open(out, "w") as f:
        json.dump({"exit_code": int(code), "tests": found}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
