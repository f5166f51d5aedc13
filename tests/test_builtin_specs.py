"""The built-in specs are made by one generator (:mod:`patchgym.tasks.builtin_specs`) from SWE-bench's
harness, patchgym's changes noted with SWE-bench's values (coverage and conversion:
tests/test_swebench_io.py; the requirement rewrite: tests/test_swebench_constants.py)."""

from __future__ import annotations

import json

import pytest

from patchgym.tasks.builtin_specs import (
    BUILTIN_SPECS,
    CHANGES,
    NOTE,
    ORIGINAL,
    Change,
    derive,
    main,
    original,
    read_harness,
    render,
)
from patchgym.tasks.swebench_constants import REPLACE_NAME, REQS_NAME, SPECS_NAME, HarnessConstants


def test_the_file_is_what_the_generator_makes_of_swebenchs_tables():
    """No hand edits: SWE-bench's tables recovered from the file (each change keeps SWE-bench's
    values under _swebench) give the file back through the generator, byte for byte."""
    text = BUILTIN_SPECS.read_text(encoding="utf-8")
    document = json.loads(text)
    constants, parsers = original(document)
    assert render(derive(constants, parsers, document["_source"])) == text
    assert len(constants.specs) == 20
    changed = {(repo, version) for repo, versions in document[SPECS_NAME].items() for version, spec in versions.items()
               if NOTE in spec}
    assert changed == {(c.repo, v) for c in CHANGES for v in (c.versions or document[SPECS_NAME][c.repo])}
    sphinx = constants.specs["sphinx-doc/sphinx"]["3.5"]
    assert sphinx["test_cmd"] == "tox --current-env -epy39 -v --", "SWE-bench's own value is kept"


def test_a_change_keeps_swebenchs_values_and_says_why():
    constants = HarnessConstants(specs={"acme/lib": {"1.0": {"python": "3.9", "install": "pip install -e .",
                                                             "pre_install": ["sed -i x tox.ini", "apt-get y"]},
                                                     "2.0": {"python": "3.11"}}},
                                 reqs_paths={"acme/lib": ["req.txt"]})
    change = Change("acme/lib", note="why", set={"install": "V={version} pip install -e ."},
                    append={"pip_packages": ("extra<2",)}, remove={"pre_install": ("sed -i x tox.ini",)})
    document = derive(constants, {"acme/lib": "parse_log_acme"}, "here", changes=(change,))
    one, two = document[SPECS_NAME]["acme/lib"]["1.0"], document[SPECS_NAME]["acme/lib"]["2.0"]
    assert one["install"] == "V=1.0 pip install -e ." and two["install"] == "V=2.0 pip install -e ."
    assert one["pip_packages"] == ["extra<2"] and one["pre_install"] == ["apt-get y"] and "pre_install" not in two
    assert one[NOTE] == "patchgym: why" and one["log_parser"] == "parse_log_acme"
    assert one[ORIGINAL] == {"install": "pip install -e .", "pip_packages": None,
                             "pre_install": ["sed -i x tox.ini", "apt-get y"]}
    assert document[REQS_NAME] == {"acme/lib": ["req.txt"]}
    assert document[REPLACE_NAME] == [["types-pkg_resources", "types-setuptools"]]
    assert original(document) == (constants, {"acme/lib": "parse_log_acme"})
    # a SWE-bench update that drops what a change was made for is said, not skipped
    with pytest.raises(ValueError, match="acme/other"):
        derive(constants, {}, "here", changes=(Change("acme/other", note="x"),))
    with pytest.raises(ValueError, match="acme/lib 3.0"):
        derive(constants, {}, "here", changes=(Change("acme/lib", note="x", versions=("3.0",)),))


def test_the_generator_reads_swebenchs_harness_as_published(tmp_path):
    """The three files as SWE-bench lays them out; the parsers are functions, read by name."""
    harness = tmp_path / "swebench" / "harness"
    for part in ("constants", "test_spec", "log_parsers"):
        (harness / part).mkdir(parents=True)
    (harness / "constants" / "python.py").write_text(
        'TEST_PYTEST = "pytest -rA"\n'
        'SPECS_ACME = {k: {"python": "3.9", "packages": "requirements.txt", "test_cmd": TEST_PYTEST}\n'
        '              for k in ["1.0", "1.1"]}\n'
        'MAP_REPO_VERSION_TO_SPECS_PY = {"acme/lib": SPECS_ACME}\n'
        'MAP_REPO_TO_REQS_PATHS = {"acme/lib": ["requirements/dev.txt"]}\n')
    (harness / "test_spec" / "python.py").write_text(
        "import re\nREPLACE_REQ_PACKAGES = [\n    ('old-pkg', 'new-pkg'),\n    ('gone', None),\n]\n")
    (harness / "log_parsers" / "python.py").write_text(
        "def parse_log_acme(log, spec):\n    return {}\n\nMAP_REPO_TO_PARSER_PY = {'acme/lib': parse_log_acme}\n")
    output = tmp_path / "specs.json"
    with pytest.raises(ValueError, match="pallets/flask"):  # patchgym's changes name SWE-bench's repositories
        main([str(tmp_path), "--source", "test", "--output", str(output)])
    document = derive(*read_harness(tmp_path), "test", changes=())
    assert document[SPECS_NAME] == {"acme/lib": {
        v: {"python": "3.9", "packages": "requirements.txt", "test_cmd": "pytest -rA", "log_parser": "parse_log_acme"}
        for v in ("1.0", "1.1")}}
    assert document[REQS_NAME] == {"acme/lib": ["requirements/dev.txt"]}
    assert document[REPLACE_NAME] == [["old-pkg", "new-pkg"], ["gone", None]]
