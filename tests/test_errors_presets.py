"""docs/errors.md's examples that list the cluster presets print what hetpart prints now: each is run here
(they fail before torch is imported, in well under a second) and its documented line compared whole, so a
new preset that is not in the catalogue's examples fails this test."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from hetpart.cli import main
from hetpart.devices import PRESETS

DOC = Path(__file__).parents[1] / "docs" / "errors.md"
# `$ hetpart ARGS` followed by its `hetpart: error: ...` line, where the error names the presets.
EXAMPLE = re.compile(r"^\$ hetpart (?P<args>.+)\n(?P<error>hetpart: error: .*preset.*)$", re.MULTILINE)
EXAMPLES = [(m["args"], m["error"]) for m in EXAMPLE.finditer(DOC.read_text())]


def test_the_catalogue_has_the_preset_examples_and_lists_every_preset():
    assert len(EXAMPLES) >= 5, EXAMPLES
    listed = ", ".join(sorted(PRESETS))
    assert all(f"(known: {listed})" in error or f"(presets: {listed})" in error for _, error in EXAMPLES), listed


@pytest.mark.parametrize("args, error", EXAMPLES, ids=[args for args, _ in EXAMPLES])
def test_a_documented_preset_error_is_what_hetpart_prints(args, error, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "existing").mkdir()  # W18's setup: an empty directory
    assert main(shlex.split(args)) == 2
    assert capsys.readouterr().err.splitlines()[0] == error
