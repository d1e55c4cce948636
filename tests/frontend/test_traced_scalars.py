"""A scalar read from a tensor (`x.max().item()`, as HF XLM checks its lengths) through the passes and a split."""

import torch

from hetpart.codegen import run_stages, split_stages
from hetpart.devices import load_cluster
from hetpart.frontend import SequenceAxes, export_model
from hetpart.passes import PassContext, PassManager, default_passes, lower_to_problem
from hetpart.passes.meta import traced_scalar
from tests.codegen.test_split import contiguous_plan


class CheckedLengths(torch.nn.Module):
    """Embeds tokens, after checking (as XLM does) that no length exceeds the sequence."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.proj = torch.nn.Embedding(32, 8), torch.nn.Linear(8, 8)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        torch._check(lengths.max().item() <= ids.shape[1])  # XLM: `torch._check(lengths.max().item() <= slen)`
        h = torch.relu(self.proj(self.embed(ids)))
        return self.proj(h) * (torch.arange(ids.shape[1])[None, :] < lengths[:, None])[..., None]


def test_item_runs_on_meta_from_its_traced_value():
    module = CheckedLengths().eval()
    ids, lengths = torch.randint(0, 32, (4, 6)), torch.tensor([6, 3, 1, 5])
    gm = export_model(module, (ids, lengths), seq=SequenceAxes((True, False)))
    items = [n for n in gm.graph.nodes if n.target in (torch.ops.aten.item.default,
                                                        torch.ops.aten._local_scalar_dense.default)]
    assert items and isinstance(items[0].meta["val"], torch.SymInt)  # unbacked: u0
    assert traced_scalar(items[0]) == 0  # no example value: 0, inside the range export proved for it
    cluster = load_cluster("preset:cpu-2")
    gm = PassManager(default_passes(), echo=lambda _: None).run(gm, PassContext(cluster.device_types, 4, 2))
    stages = split_stages(gm, contiguous_plan(lower_to_problem(gm, cluster), 2), 2)
    other_ids, other_lengths = torch.randint(0, 32, (3, 9)), torch.tensor([9, 2, 7])
    with torch.no_grad():
        torch.testing.assert_close(run_stages(stages, other_ids, other_lengths)[0], module(other_ids, other_lengths),
                                   rtol=0, atol=1e-6)
