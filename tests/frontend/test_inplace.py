"""NOTE [in-place writes]: a model that fills a tensor in place splits into stages that equal it."""

from __future__ import annotations

import torch

from hetpart.codegen import run_stages, split_stages
from hetpart.devices.cluster import parse_cluster
from hetpart.frontend import export_model
from hetpart.passes import PassContext, PassManager, default_passes, lower_to_problem


class _FillsInPlace(torch.nn.Module):
    """RWKV's pattern: `out[:, t] = ...` in a loop (user-less `copy_` into views), then reads of `out`."""

    def __init__(self, steps: int = 4, width: int = 8) -> None:
        super().__init__()
        self.steps = steps
        self.mix = torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, steps, width]
        out = torch.zeros_like(x)
        state = torch.zeros_like(x[:, 0])
        for t in range(self.steps):
            state = torch.tanh(self.mix(x[:, t]) + state)
            out[:, t] = state
        return self.head(out).sum(dim=1)


def _mutating_without_users(gm: torch.fx.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes if n.op == "call_function" and not n.users
            and getattr(getattr(n.target, "_schema", None), "is_mutable", False)]


def test_in_place_writes_are_functionalized_and_every_cut_reproduces_the_model():
    torch.manual_seed(0)
    module, x = _FillsInPlace().eval(), torch.randn(4, 4, 8)
    gm = export_model(module, (x,))
    assert not _mutating_without_users(gm)
    assert any("select_scatter" in str(n.target) for n in gm.graph.nodes)  # the writes became values
    cluster = parse_cluster('[[nodes]]\nname = "m"\ndevices = ["cpu", "cpu"]\n', "t.toml", "t")
    ctx = PassContext(device_types=cluster.device_types, batch_size=4, microbatch_size=4)
    gm = PassManager(default_passes(), echo=lambda _: None).run(gm, ctx)
    order = list(lower_to_problem(gm, cluster).node_order())
    for cut in range(1, len(order)):  # every two-stage cut of the order
        stage_of = {v: int(i >= cut) for i, v in enumerate(order)}
        if len(set(stage_of.values())) < 2:
            continue
        stages = split_stages(gm, stage_of, 2)
        for batch in (4, 3):
            y = torch.randn(batch, 4, 8)
            with torch.no_grad():
                torch.testing.assert_close(run_stages(stages, y)[0], module(y), rtol=0, atol=1e-6)


def test_in_place_ops_whose_result_is_used_stay():
    """`x += ...` with a used result (T5's relative buckets) orders its readers: the graph is kept as exported."""

    class AddsInPlace(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x * 2
            y += 1
            return y.relu()

    gm = export_model(AddsInPlace(), (torch.randn(4, 3),))
    assert any(str(n.target) == "aten.add_.Tensor" for n in gm.graph.nodes)
