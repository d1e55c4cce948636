"""Shared fixtures: small zoo models traced and annotated once per session, and torchrun launches that
several tests read (NOTE [shared launches] in tests/shared_runs.py)."""

from __future__ import annotations

import json
import os
import resource
import signal
import time

import pytest

# Every OPTIMAL / WITHIN_GAP claim in the tests is re-proved (NOTE [checked certificates]).
os.environ.setdefault("HETPART_CHECK_CERTIFICATE", "1")
# A pytest-xdist worker (`make test`: two on two cores) computes with one intra-op thread, as a rank of
# `hetpart run` does; two workers of two threads each ran torch-heavy tests 4-12x slower (NOTE [xdist groups]).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

from hetpart.compile import analyze
from hetpart.devices import load_cluster
from hetpart.frontend import ModelSpec
from tests.shared_runs import GPT_CPU2, SharedRun, cli_output
from tests.xdist_groups import FixtureUse, group_suffixed, groups, instance_key

SMALL = {
    "mlp": ModelSpec("zoo:mlp", {"n_blocks": "3", "hidden": "32"}, batch_size=8, seq_len=1),
    "gpt-small": ModelSpec("zoo:gpt-small", {"n_layer": "2", "n_embd": "64", "n_head": "4", "vocab_size": "128",
                                             "block_size": "32"}, batch_size=8, seq_len=16),
}


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist registers it too; serially (or without xdist installed) the mark does nothing.
    config.addinivalue_line("markers", "xdist_group(name): run on one xdist worker (NOTE [xdist groups])")


@pytest.hookimpl(wrapper=True)  # its first part before xdist's own hook turns the marks into `@group` suffixes
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    """Mark the tests that share a module- or session-scoped fixture of the project with one xdist group,
    so that `-n 2 --dist loadgroup` runs each such fixture once: NOTE [xdist groups] in tests/xdist_groups.py.
    After the other hooks, on an xdist worker of `--dist loadgroup`, write each grouped test's `@group` suffix
    where pytest 9.2 keeps a node's id (xdist 3.8 writes it where pytest no longer reads it)."""
    found = []
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs if info is not None else {}
        found.append(FixtureUse(item.nodeid, tuple(sorted(
            key for name, chain in defs.items() if chain and chain[-1].func.__module__.startswith("tests")
            for key in [instance_key(chain[-1].scope, name, item.nodeid)] if key is not None))))
    named = groups(found)
    for item in items:
        if item.nodeid in named:
            item.add_marker(pytest.mark.xdist_group(named[item.nodeid]))
    result = yield
    if getattr(config.option, "loadgroup", False):  # set on xdist workers only
        from _pytest.nodeid import NodeId  # pytest >= 9.2: a node's id, in `_id`

        for item in items:
            want = group_suffixed(item.nodeid, [str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                                                for m in item.iter_markers("xdist_group")])
            if want != item.nodeid:
                item._id = NodeId.parse(want)
                assert item.nodeid == want, (item.nodeid, want)
    return result


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    """With HETPART_TEST_CPU=FILE, appends one JSON line {nodeid, worker, cpu_s, children_s} per test to FILE: the CPU
    seconds of this process (the xdist worker) over the test's setup, call and teardown, plus those of the child
    processes it waited for (torchrun and its ranks), which cpu_s includes. Nothing without the variable."""
    path = os.environ.get("HETPART_TEST_CPU")
    if not path:
        yield
        return
    own, kids = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    yield
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    children = (after.ru_utime - kids.ru_utime) + (after.ru_stime - kids.ru_stime)
    line = {"nodeid": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
            "cpu_s": round(time.process_time() - own + children, 3), "children_s": round(children, 3)}
    with open(path, "a") as f:  # one short append per line: the two workers' lines do not interleave
        f.write(json.dumps(line) + "\n")


@pytest.fixture
def sigint():
    """Sets SIGINT's handler for the test, and puts the suite's back after: a suite started in the background by
    a shell without job control inherits SIGINT ignored (Python then installs no KeyboardInterrupt handler)."""
    before = signal.getsignal(signal.SIGINT)
    yield lambda handler: signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGINT, before)


@pytest.fixture(scope="session")
def mixed4():
    return load_cluster("preset:mixed-4")


@pytest.fixture(scope="session")
def annotated(mixed4):
    """name -> annotated GraphModule of the small configs (microbatch of 2)."""
    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = analyze(SMALL[name], mixed4, microbatch_size=2)[0]
        return cache[name]

    return get


# --- torchrun launches that several tests read (NOTE [shared launches] in tests/shared_runs.py) ---

@pytest.fixture(scope="session")
def equal_layers_run(tmp_path_factory) -> SharedRun:
    """GPT_CPU2 partitioned with `--strategy equal-layers` (the same stages as the solver's plan: 2 blocks
    over 2 stages), run once with --verify, --measure and 2 steps at batch 6 and length 24 (its dynamic
    dims). Read by tests/test_strategy.py and tests/runtime/test_torchrun.py: NOTE [shared launches]."""
    out = tmp_path_factory.mktemp("equal-layers") / "out"
    text = cli_output(["partition", *GPT_CPU2, "--strategy", "equal-layers", "--out", str(out)])
    run = cli_output(["run", str(out), "--verify", "--measure", "--steps", "2", "--batch-size", "6", "--seq-len", "24"])
    return SharedRun(out, text, run)


@pytest.fixture(scope="session")
def training_1f1b_run(tmp_path_factory) -> SharedRun:
    """GPT_CPU2 partitioned for training with 1F1B, run once: a 1F1B training step with --verify (every
    weight's gradient, the tied one summed over both ranks). Read by tests/passes/test_training.py and
    tests/runtime/test_torchrun.py: NOTE [shared launches]."""
    out = tmp_path_factory.mktemp("training-1f1b") / "out"
    text = cli_output(["partition", *GPT_CPU2, "--mode", "training", "--schedule", "1f1b", "--time-limit", "10",
                       "--out", str(out)])
    run = cli_output(["run", str(out), "--verify", "--mode", "training", "--schedule", "1f1b"])
    return SharedRun(out, text, run)
