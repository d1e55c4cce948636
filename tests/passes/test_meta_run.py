"""The analysis passes share one run of the graph on meta tensors (NOTE [one meta run])."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import hetpart.passes.meta as meta
from hetpart.devices import load_cluster
from hetpart.frontend import export_model, load_model
from hetpart.ir import info
from hetpart.passes import PassContext, PassManager, PassResult, default_passes
from hetpart.passes.flops import FlopsPass
from hetpart.passes.shape import ShapePass
from tests.conftest import SMALL


@dataclass(frozen=True)
class _Changes:
    """A pass that says it changed the graph: a run kept before it must not be read after it."""
    name: ClassVar[str] = "changes"
    summary: ClassVar[str] = "claims a change"
    requires: ClassVar[tuple[str, ...]] = ()
    provides: ClassVar[tuple[str, ...]] = ()

    def run(self, gm, ctx):
        return PassResult(gm, changed=True)


def _counting(monkeypatch) -> list[int]:
    runs: list[int] = []
    real = meta.run_on_meta

    def counted(gm, batch_size, on_node=None):
        runs.append(batch_size)
        return real(gm, batch_size, on_node)

    monkeypatch.setattr(meta, "run_on_meta", counted)
    return runs


def _graph():
    module, inputs = load_model(SMALL["mlp"])
    return export_model(module, inputs)


def test_shape_flops_and_op_cost_run_the_graph_on_meta_once(monkeypatch):
    runs = _counting(monkeypatch)
    ctx = PassContext(load_cluster("preset:mixed-4").device_types, batch_size=4, microbatch_size=2)
    gm = PassManager(default_passes(), echo=lambda _: None).run(_graph(), ctx)
    assert runs == [2]
    assert any((info(n).flops or 0) > 0 for n in gm.graph.nodes), "the FLOPs came from that one run"


def test_a_pass_that_changes_the_graph_drops_the_run(monkeypatch):
    runs = _counting(monkeypatch)
    PassManager([ShapePass(), _Changes(), FlopsPass()], echo=lambda _: None).run(_graph(), PassContext(microbatch_size=2))
    assert runs == [2, 2]
