"""Shared fixtures: small zoo models traced and annotated once per session, and torchrun launches that
several tests read (NOTE [shared launches] in tests/shared_runs.py)."""

from __future__ import annotations

import os

import pytest

# Every OPTIMAL / WITHIN_GAP claim in the tests is re-proved (NOTE [checked certificates]).
os.environ.setdefault("HETPART_CHECK_CERTIFICATE", "1")

from hetpart.compile import analyze
from hetpart.devices import load_cluster
from hetpart.frontend import ModelSpec
from tests.shared_runs import GPT_CPU2, SharedRun, cli_output

SMALL = {
    "mlp": ModelSpec("zoo:mlp", {"n_blocks": "3", "hidden": "32"}, batch_size=8, seq_len=1),
    "gpt-small": ModelSpec("zoo:gpt-small", {"n_layer": "2", "n_embd": "64", "n_head": "4", "vocab_size": "128",
                                             "block_size": "32"}, batch_size=8, seq_len=16),
}


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
