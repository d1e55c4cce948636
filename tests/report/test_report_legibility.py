"""report.html as a new user reads it (NOTE [report legibility], NOTE [report blocks]): HF models in
stage groups of their repeated layers, memory bars that show 0.002% use, backwards told from forwards.

The Chromium test keeps each screenshot under pytest's tmp dir (`<model>.png`) for a human to look at.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from hetpart.compile import CompileOptions, compile_model
from hetpart.frontend import ModelSpec
from hetpart.ir import info
from hetpart.plan_report import load_plan
from hetpart.report.blocks import coarsen_to_blocks
from hetpart.report.html import Block, BlockGraph, memory_bar_px, render_report
from tests.report.test_report import CHROMIUM, _chromium, _console_errors, _plan


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(8, 8), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x)


class _Inner(nn.Module):  # HF's LlamaModel: embeddings, a ModuleList of layers, a norm
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.layers = nn.ModuleList([_Layer() for _ in range(3)])
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) * 2.0  # the `* 2.0` runs in the wrapper's own forward
        for layer in self.layers:
            h = layer(h)
        return self.norm(h)


class _Wrapper(nn.Module):  # HF's LlamaForCausalLM: `model` and `lm_head`
    def __init__(self) -> None:
        super().__init__()
        self.model = _Inner()
        self.lm_head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model(x))


def test_a_wrapped_model_is_grouped_by_its_repeated_layers():
    gm = torch.export.export(_Wrapper(), (torch.randn(2, 4),)).module()
    nodes = [n for n in gm.graph.nodes if n.op in ("placeholder", "call_function", "output")]
    for i, n in enumerate(nodes):
        info(n).stage = 2 * i // len(nodes)
    names = [b.name for b in coarsen_to_blocks(gm).blocks]
    assert names[0] == "inputs" and names[-1] == "output"
    assert {"model.embed", "model.layers.0", "model.layers.1", "model.layers.2", "model.norm", "lm_head"} <= set(names)
    assert "model.layers.0.mlp.0" not in names and "model.layers" not in names  # the layer, not inside it


def test_memory_bars_are_visible_at_tiny_shares_and_ordered():
    widths = [memory_bar_px(share, 600) for share in (0.00002, 0.0003, 0.03, 1.0)]
    assert widths[0] > 30  # 0.002% of capacity: a twentieth of the bar, not a pixel
    assert widths == sorted(widths) and widths[-1] == 600
    assert memory_bar_px(0.0, 600) == 0.0 and 0 < memory_bar_px(1e-9, 600) < 3
    page = render_report(load_plan(Path("plan.json"), _plan()), BlockGraph())
    assert "0.001%" in page and "100%" in page  # the log axis is labelled
    plan = _plan()
    plan["stages"][0]["memory_bytes"] = 3000  # 0.0003% of 1 GiB: the axis starts lower, the bar still shows
    tiny = render_report(load_plan(Path("plan.json"), plan), BlockGraph())
    assert ">0.0001%</text>" in tiny and ">0.0001%</text>" not in page
    widths = [float(w) for w in re.findall(r'<rect class="used" x="[^"]*" y="[^"]*" width="([^"]*)"', tiny)]
    assert len(widths) == 2 and min(widths) > 30


def test_backwards_are_hatched_and_the_timeline_has_a_legend():
    plan = _plan(stages=2)
    for s in plan["stages"]:
        s["backward_us"] = 2 * s["compute_us"]
    training = render_report(load_plan(Path("plan.json"), plan), BlockGraph())
    bwd = plan["microbatches"] * 2
    assert training.count('fill="url(#bwd-hatch)" pointer-events="none"') == bwd
    assert training.count('<rect class="bwd"') == bwd and training.count('<rect class="fwd"') == bwd
    assert ">B0<" in training and ">F0<" in training
    assert all(f'class="legend-{k}"' in training for k in ("fwd", "bwd", "send"))
    inference = render_report(load_plan(Path("plan.json"), _plan(stages=2)), BlockGraph())
    assert "url(#bwd-hatch)" not in inference and 'class="legend-bwd"' not in inference


HF = {"gpt2": "h.0", "llama": "layers.0", "t5": "block.0"}  # family -> a repeated block it must show


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is absent: apt-get install -y chromium")
@pytest.mark.parametrize("family", sorted(HF))
def test_hf_reports_render_stage_groups_in_chromium(family, tmp_path):
    pytest.importorskip("transformers")
    from hetpart.frontend.hf import small_overrides  # 2 layers, tiny widths

    out = tmp_path / "out"
    spec = ModelSpec(f"hf:{family}", small_overrides(family), batch_size=4, seq_len=16)
    compile_model(spec, "preset:mixed-4", out, CompileOptions(pt2=False, time_limit_s=1), echo=lambda _: None)
    shot = tmp_path / f"{family}.png"
    proc = _chromium(out / "report.html", "--dump-dom", f"--screenshot={shot}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _console_errors(proc.stderr) == []
    boxes = re.findall(r'<g class="block"><title>([^<]*?) —', proc.stdout)  # the DOM as Chromium built it
    assert len(boxes) > 3, boxes
    assert any(b.endswith(HF[family]) for b in boxes), boxes
    layers = [b for b in boxes if re.search(r"\.\d+$", b)]
    assert len(layers) >= 2, f"not one box per layer: {boxes}"  # 2 layers (t5: 2 encoder + 2 decoder)
    assert Path(shot).stat().st_size > 20_000


def test_box_labels_drop_the_shared_wrapper_and_fit_their_box():
    from hetpart.report.html import BOX_LABEL_CHARS_SMALL, _box_labels

    t5 = _box_labels(["inputs", "model.encoder.embed_tokens", "model.encoder.block.0", "model.decoder.final_layer_norm",
                      "model", "model.lm_head", "output"])
    assert t5["model.encoder.block.0"] == ("encoder.block.0", 13) and t5["model"] == ("model", 13)
    assert t5["model.decoder.final_layer_norm"][1] < 13  # long: drawn smaller
    assert _box_labels(["inputs", "blocks.0", "blocks.1", "output"])["blocks.0"] == ("blocks.0", 13)  # not "0"
    long = _box_labels(["x.a_module_name_far_too_long_for_any_box"])["x.a_module_name_far_too_long_for_any_box"][0]
    assert "…" in long and len(long) <= BOX_LABEL_CHARS_SMALL
    blocks = BlockGraph([Block("model.encoder.block.0", {0: 3}), Block("model.lm_head", {1: 2})])
    page = render_report(load_plan(Path("plan.json"), _plan()), blocks)
    assert ">encoder.block.0</text>" in page and "<title>model.encoder.block.0 —" in page  # the full name on hover
