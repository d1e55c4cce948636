"""The house rule that every module of hetpart/ stays under 600 lines (docs/architecture.md): a file that grows
past it is split by what it does, not trimmed."""

from __future__ import annotations

from pathlib import Path

LIMIT = 600
ROOT = Path(__file__).resolve().parents[1] / "hetpart"


def test_every_module_is_under_the_limit():
    long = {str(p.relative_to(ROOT)): n for p in sorted(ROOT.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) >= LIMIT}
    assert not long, f"modules of {LIMIT} lines or more (split them): {long}"
