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


class _LoadgroupWorker(_Collected):
    """`_Collected` with the option xdist's `setup_config` gives a worker of `--dist loadgroup`."""

    def pytest_configure(self, config: pytest.Config) -> None:
        config.option.loadgroup = True


def test_a_loadgroup_worker_reports_each_group_as_its_node_id_suffix(request):
    """xdist's scheduler groups tests by the `@NAME` suffix of the node ids a worker collects (`_split_scope`), not by
    the marks: with pytest 9.2 xdist 3.8's suffix never reached the id, and a shared launch could run once per worker
    (suite7). Each grouped test's id ends in its group, the others carry none."""
    from xdist.scheduler.loadgroup import LoadGroupScheduling

    plugin = _LoadgroupWorker()
    with contextlib.redirect_stdout(io.StringIO()):
        code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "--rootdir", str(request.config.rootpath),
                            *(str(request.config.rootpath / f) for f in FILES)], plugins=[plugin])
    assert code == 0 and plugin.items
    scope = LoadGroupScheduling._split_scope
    grouped = 0
    for item in plugin.items:
        names = _group(item)
        assert scope(None, item.nodeid) == ("_".join(sorted(names)) if names else item.nodeid), item.nodeid
        grouped += bool(names)
    assert grouped >= 3
