"""Which tests must run on one pytest-xdist worker: those that share a module- or session-scoped fixture.

NOTE [xdist groups]: `make test` runs the suite on two pytest-xdist workers (`-n 2 --dist loadgroup`).
Each worker is its own pytest session, so a session fixture (tests/conftest.py's shared torchrun
launches, NOTE [shared launches] in tests/shared_runs.py) would run once per worker that needs it, and
a module fixture once per worker that gets one of its module's tests. `--dist loadgroup` sends all
tests with one `xdist_group` mark to one worker; `pytest_collection_modifyitems` in tests/conftest.py
marks every test that uses a module- or session-scoped fixture of the project (defined under tests/),
and `groups` joins the tests that share one into a group: the connected components of the graph of
tests and the fixture instances they use (a test of test_torchrun.py that reads both its module's
`two_rank_out` and the session's `equal_layers_run` joins the equal-layers run's other readers in
tests/test_strategy.py). So every such fixture runs once per session, as it does serially. xdist reads the group
from a `@NAME` suffix of the test's id, which it writes into an attribute pytest 9.2 no longer reads (every test
then went wherever a worker was free, so a shared launch could run once per worker: suite7); the conftest's
`pytest_collection_modifyitems` (a wrapper) writes it after xdist's hook, where pytest keeps the id
(`group_suffixed`). Only the fixtures in REPEATABLE run once per worker instead: cheap (well under a second or
two) and read by tests across the suite, one group of all their readers would put a fifth of the suite on one worker.
A test that uses none of them is a group of its own and goes wherever a worker is free.
Serially (`pytest` without -n) the marks do nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

# Session fixtures computed once per worker rather than grouping every reader: see NOTE [xdist groups].
REPEATABLE = frozenset({"mixed4", "annotated"})


@dataclass(frozen=True)
class FixtureUse:
    """One collected test (its node id) and the instances of shared fixtures it uses: a session fixture's
    name, or `MODULE::NAME` for a module-scoped one (one instance per module)."""

    nodeid: str
    instances: tuple[str, ...]


def instance_key(scope: str, name: str, nodeid: str) -> str | None:
    """The fixture instance that test `nodeid` gets of fixture `name` of `scope`; None for a fixture made
    per test (function or class scope) or in REPEATABLE.

        >>> instance_key("session", "equal_layers_run", "tests/test_strategy.py::test_x")
        'equal_layers_run'
        >>> instance_key("module", "two_rank_out", "tests/runtime/test_torchrun.py::test_y[a]")
        'tests/runtime/test_torchrun.py::two_rank_out'
        >>> instance_key("function", "tmp_path", "tests/test_cli.py::test_z") is None
        True
    """
    if name in REPEATABLE or scope not in ("module", "package", "session"):
        return None
    if scope == "session":
        return name
    module = nodeid.split("::")[0]
    return f"{module if scope == 'module' else module.rsplit('/', 1)[0]}::{name}"


def groups(tests: list[FixtureUse]) -> dict[str, str]:
    """nodeid -> xdist group name, for each test that shares a fixture instance: the tests connected
    through the instances they use get one name (the smallest instance key of their component, so a
    group reads as the fixture that made it). See NOTE [xdist groups].

        >>> groups([FixtureUse("a.py::t1", ("run",)), FixtureUse("b.py::t2", ("b.py::out", "run")),
        ...         FixtureUse("b.py::t3", ("b.py::out",)), FixtureUse("c.py::t4", ())])
        {'a.py::t1': 'b.py::out', 'b.py::t2': 'b.py::out', 'b.py::t3': 'b.py::out'}
    """
    graph = nx.Graph()
    for test in tests:
        for key in test.instances:
            graph.add_edge(("test", test.nodeid), ("fixture", key))
    named: dict[str, str] = {}
    for component in nx.connected_components(graph):
        name = min(key for kind, key in component if kind == "fixture")
        for kind, nodeid in component:
            if kind == "test":
                named[nodeid] = name
    return {test.nodeid: named[test.nodeid] for test in tests if test.nodeid in named}


def group_suffixed(nodeid: str, names: list[str]) -> str:
    """`nodeid` as pytest-xdist's loadgroup scheduler reads a grouped test: `NODEID@NAME` (the names sorted and
    joined by `_`), unchanged when it is suffixed already or has no group. See NOTE [xdist groups]: pytest 9.2 keeps a
    node's id in `_id`, so xdist 3.8's own suffixing (`item._nodeid = ...`) no longer reaches the scheduler.

        >>> group_suffixed("a.py::t[1]", ["b.py::out"])
        'a.py::t[1]@b.py::out'
        >>> group_suffixed("a.py::t@b.py::out", ["b.py::out"]), group_suffixed("a.py::t", [])
        ('a.py::t@b.py::out', 'a.py::t')
    """
    if not names or "@" in nodeid:
        return nodeid
    return f"{nodeid}@{'_'.join(sorted(set(names)))}"
