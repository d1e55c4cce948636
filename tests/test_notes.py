"""Every `NOTE [name]` that is cited has exactly one definition, every definition is cited, and a
citation that names the note's file (`NOTE [name] in file.py`) names the one that defines it.

What counts as a definition (docs/architecture.md, "Notes"): a line of Python source that
begins with `NOTE [name]`, followed by nothing (the note's text starts on the next line) or by
`:` and its text, either

- inside a docstring (of a module, class or function), at the start of one of its lines but the
  first, i.e. a paragraph of its own, or
- in a `#` comment that starts in column 0 (a comment block at module level).

Every other mention is a citation: in running text, in parentheses, `See NOTE [name]`, a
docstring's first line, `NOTE [name]: ...` right after the quotes (what this function or test
does by that note), an
indented `# NOTE [name]: ...` comment that applies the note where the code does, and every
mention in Markdown (docs/ and README.md restate and point to notes; they define none). A name
may wrap over two lines (`NOTE [what the partitioner` / `sees]`).
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("hetpart", "benchmarks", "tests", "docs", "README.md")
_DEFINITION = re.compile(r"NOTE \[([^\]\n]+)\](?::|\s*$)")
_MENTION = re.compile(r"NOTE\s+\[([^\]]+)\]")
_POINTER = re.compile(r"NOTE\s+\[([^\]]+)\]\)?,?\s+(?:\(|in\s+)`?((?:[\w.-]+/)*[\w.-]+\.py)`?")  # ... in FILE.py
_LINE_JOIN = re.compile(r"[ \t]*\n[ \t]*(?:#[ \t]*)?")  # a line break inside a comment or docstring

# Known offenders, each with why (none today). The test fails once one is fixed, so that the
# entry is removed with it.
ALLOW_UNDEFINED: dict[str, str] = {}  # cited, never defined by the rule above
ALLOW_UNCITED: dict[str, str] = {}  # defined, never cited anywhere else
ALLOW_WRONG_FILE: dict[tuple[str, str], str] = {}  # (citing file, note) whose `NOTE [name] in FILE.py` points elsewhere
# Definitions that need no citation: none today. A note is written to be cited from the code
# it explains; one that nothing cites belongs in a docstring as plain text.
STANDALONE: dict[str, str] = {}
PLACEHOLDERS = {"name"}  # `NOTE [name]` where docs/architecture.md states the rule


def _sources() -> list[Path]:
    """The files scanned; not this one, whose examples are notes of no code."""
    found = []
    for name in SCANNED:
        path = ROOT / name
        found += [path] if path.is_file() else sorted(p for p in path.rglob("*")
                                                      if p.suffix in (".py", ".md") and "__pycache__" not in p.parts)
    return [p for p in found if p != Path(__file__).resolve()]


def definitions_in(source: str) -> list[tuple[str, int]]:
    """(name, line) of every NOTE defined in Python `source`, by the rule of this module's docstring."""
    lines = source.splitlines()
    found: list[tuple[str, int]] = []
    if "NOTE" not in source:
        return found
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = node.body
        if not (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            continue
        for n in range(body[0].lineno + 1, body[0].end_lineno + 1):  # the first line is a summary
            m = _DEFINITION.match(lines[n - 1].strip())
            if m:
                found.append((" ".join(m.group(1).split()), n))
    if not re.search(r"^#[ \t]*NOTE \[", source, re.M):
        return found  # no column-0 comment names a note: skip tokenizing
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and tok.start[1] == 0:
            m = _DEFINITION.match(tok.string.lstrip("#").strip())
            if m:
                found.append((" ".join(m.group(1).split()), tok.start[0]))
    return found


def mentions_in(text: str) -> list[str]:
    """Every NOTE name `text` mentions, definitions included, names that wrap over lines joined."""
    return [" ".join(m.group(1).split()) for m in _MENTION.finditer(_LINE_JOIN.sub(" ", text))]


@functools.cache
def _texts() -> tuple[tuple[Path, str], ...]:
    """Each scanned file and its text, read once."""
    return tuple((path, path.read_text()) for path in _sources())


@functools.cache
def _survey() -> tuple[dict[str, list[str]], dict[str, int]]:
    """(name -> where it is defined, name -> how often it is cited)."""
    defined: dict[str, list[str]] = defaultdict(list)
    cited: dict[str, int] = defaultdict(int)
    for path, text in _texts():
        own = definitions_in(text) if path.suffix == ".py" else []
        for name, line in own:
            defined[name].append(f"{path.relative_to(ROOT)}:{line}")
        for name in mentions_in(text):
            cited[name] += 1
        for name, _ in own:
            cited[name] -= 1  # its definition's own mention
    return defined, {k: v for k, v in cited.items() if v > 0 and k not in PLACEHOLDERS}


@pytest.fixture(scope="module")
def survey() -> tuple[dict[str, list[str]], dict[str, int]]:
    """`_survey()`: a module fixture, so that the tests reading it run on one xdist worker and the tree is parsed
    once a session, not once per worker (NOTE [xdist groups])."""
    return _survey()


def test_the_rule_tells_definitions_from_citations():
    source = '''"""Module.

NOTE [heading form]
The text follows.

NOTE [inline form]: the text follows the colon.
"""
# NOTE [comment heading]
# text
# NOTE [comment inline]: text


def f():
    """NOTE [first line]: a summary that applies a note.

    NOTE [function docstring]: text; see NOTE [cited in a docstring].
    """
    # NOTE [heading form]: an indented comment applies a note: a citation
    return 1  # NOTE [trailing comment]


# See NOTE [see form]. NOTE [mid-line]: not a definition either
# NOTE [mid sentence] is cited here
'''
    assert [name for name, _ in definitions_in(source)] == [
        "heading form", "inline form", "function docstring", "comment heading", "comment inline"]
    assert mentions_in("text (NOTE [what the\n# partitioner sees]) and NOTE\n   [x]") == ["what the partitioner sees", "x"]


def test_every_cited_note_has_exactly_one_definition(survey):
    defined, cited = survey
    twice = {name: where for name, where in defined.items() if len(where) > 1}
    assert not twice, f"notes defined more than once (keep one, cite it from the others): {twice}"
    undefined = sorted(set(cited) - set(defined) - set(ALLOW_UNDEFINED))
    assert not undefined, (f"notes cited but never defined: {undefined}; define each once as a line "
                           "`# NOTE [name]` (column 0) or a docstring line `NOTE [name]: ...`")
    fixed = sorted(name for name in ALLOW_UNDEFINED if name in defined or name not in cited)
    assert not fixed, f"fixed: remove {fixed} from ALLOW_UNDEFINED"


def test_every_note_is_cited(survey):
    defined, cited = survey
    uncited = sorted(set(defined) - set(cited) - set(ALLOW_UNCITED) - set(STANDALONE))
    assert not uncited, {name: defined[name] for name in uncited}
    fixed = sorted(name for name in ALLOW_UNCITED if name in cited or name not in defined)
    assert not fixed, f"fixed: remove {fixed} from ALLOW_UNCITED"


def test_a_note_cited_with_its_file_is_defined_in_that_file(survey):
    # `NOTE [name] in path/file.py` or `NOTE [name] (file.py)`: the path is the end of the definition's.
    defined, _ = survey
    wrong = {}
    for path, text in _texts():
        here = str(path.relative_to(ROOT))
        for m in _POINTER.finditer(_LINE_JOIN.sub(" ", text)):
            name, file = " ".join(m.group(1).split()), m.group(2)
            where = [w.rsplit(":", 1)[0] for w in defined.get(name, [])]
            if where and not any(w == file or w.endswith("/" + file) for w in where):
                wrong[(here, name)] = f"says {file}, defined in {where}"
    assert set(wrong) - set(ALLOW_WRONG_FILE) == set(), {k: v for k, v in wrong.items() if k not in ALLOW_WRONG_FILE}
    fixed = sorted(set(ALLOW_WRONG_FILE) - set(wrong))
    assert not fixed, f"fixed: remove {fixed} from ALLOW_WRONG_FILE"
