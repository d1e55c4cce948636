"""Shared fixtures: small zoo models traced and annotated once per session."""

from __future__ import annotations

import os

import pytest

# Every OPTIMAL / WITHIN_GAP claim in the tests is re-proved (NOTE [checked certificates]).
os.environ.setdefault("HETPART_CHECK_CERTIFICATE", "1")

from hetpart.compile import analyze
from hetpart.devices import load_cluster
from hetpart.frontend import ModelSpec

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
