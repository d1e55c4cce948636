"""The xdist groups of the real tests: every test that reads one shared fixture instance is in one group,
so `make test`'s `-n 2 --dist loadgroup` runs each shared launch once (NOTE [xdist groups])."""

from __future__ import annotations

import contextlib
import io

import pytest

# The readers of tests/conftest.py's two shared torchrun launches, and test_torchrun.py's module fixture.
FILES = ["tests/test_strategy.py", "tests/runtime/test_torchrun.py", "tests/passes/test_training.py"]


class _Collected:
    """A plugin that keeps the collected items of a nested `pytest --collect-only`."""

    def __init__(self) -> None:
        self.items: list[pytest.Item] = []

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.items = list(session.items)


def _group(item: pytest.Item) -> set[str]:
    return {str(mark.args[0]) for mark in item.iter_markers("xdist_group")}


@pytest.fixture(scope="module")
def collected(request) -> list[pytest.Item]:
    plugin = _Collected()
    with contextlib.redirect_stdout(io.StringIO()):
        code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "--rootdir", str(request.config.rootpath),
                            *(str(request.config.rootpath / f) for f in FILES)], plugins=[plugin])
    assert code == 0 and plugin.items
    return plugin.items


def test_the_readers_of_a_shared_launch_share_one_group(collected):
    # Found through item.fixturenames (the names a test needs, with its fixtures' own), not the hook's route
    # (the fixture definitions' scopes).
    for name in ("equal_layers_run", "training_1f1b_run"):
        readers = [item for item in collected if name in item.fixturenames]
        assert {item.nodeid.split("::")[0] for item in readers} >= {FILES[1], FILES[0] if "equal" in name else FILES[2]}
        marks = [_group(item) for item in readers]
        assert all(len(m) == 1 for m in marks) and len({min(m) for m in marks}) == 1, (name, marks)


def test_the_readers_of_a_module_fixture_share_one_group_and_others_have_none(collected):
    readers = [item for item in collected if "two_rank_out" in item.fixturenames]
    assert len(readers) >= 3
    assert len({frozenset(_group(item)) for item in readers}) == 1 and _group(readers[0])
    # A test that reads no shared fixture (nor mixed4/annotated alone) runs wherever a worker is free.
    free = [item for item in collected if not {"equal_layers_run", "training_1f1b_run", "two_rank_out"}
            & set(item.fixturenames) and not _group(item)]
    assert free, "some of these files' tests share nothing"
