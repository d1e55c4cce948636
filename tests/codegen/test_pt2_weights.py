"""stage.pt2 holds no weights (NOTE [weightless .pt2]); `load_pt2` runs it with weights.safetensors' tensors."""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

import pytest
import torch

from hetpart.cli import main
from hetpart.errors import HetpartError
from hetpart.frontend import ModelSpec, load_model
from hetpart.runtime.artifacts import load_manifest, load_stage
from hetpart.runtime.pt2 import check_no_pickle, load_pt2

RESNET = ["zoo:resnet", "--set", "base_width=8", "--set", "n_stages=2", "--set", "blocks_per_stage=1",
          "--set", "image_size=8", "--batch-size", "4", "--cluster", "preset:mixed-4"]


@pytest.fixture(scope="module")
def resnet_out(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pt2w") / "out"
    assert main(["partition", *RESNET, "--out", str(out), "--time-limit", "2"]) == 0
    return out


def safetensors_tensors(path: Path) -> dict[str, bytes]:
    """Key -> raw bytes of every tensor in a safetensors file, read from its header and offsets."""
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    header.pop("__metadata__", None)
    return {key: data[8 + size + t["data_offsets"][0]:8 + size + t["data_offsets"][1]] for key, t in header.items()}


def pt2_tensors(path: Path) -> dict[str, bytes]:
    """Record name -> bytes of every tensor record (weights and constants) in a .pt2 archive."""
    with zipfile.ZipFile(path) as z:
        return {i.filename: z.read(i.filename) for i in z.infolist()
                if ("/data/weights/" in i.filename or "/data/constants/" in i.filename)
                and not i.filename.endswith(".json")}


def test_no_weight_is_stored_twice(resnet_out):
    module, _ = load_model(ModelSpec.from_json(json.loads((resnet_out / "plan.json").read_text())["model"]))
    model_bytes = sum(t.nbytes for t in module.state_dict().values())
    ranks = sorted(resnet_out.glob("rank*"))
    assert len(ranks) >= 2 and all((r / "stage.pt2").is_file() for r in ranks)
    stored = [(key, len(raw)) for r in ranks for key, raw in safetensors_tensors(r / "weights.safetensors").items()]
    keys = [key for key, _ in stored]
    assert len(keys) == len(set(keys)), "a weight is in two ranks' weights.safetensors"
    assert {name for name, _ in module.named_parameters()} <= set(keys)
    state = module.state_dict()
    assert sum(n for _, n in stored) == sum(state[key].nbytes for key in keys) <= model_bytes
    in_pt2 = sum(len(raw) for r in ranks for raw in pt2_tensors(r / "stage.pt2").values())
    assert in_pt2 == 0, "stage.pt2 repeats bytes that weights.safetensors holds"


@pytest.mark.parametrize("batch", [4, 3])
def test_pt2_runs_equal_to_stage_py(resnet_out, batch):
    manifest = load_manifest(resnet_out)
    x = torch.randn(batch, 3, 8, 8, generator=torch.Generator().manual_seed(batch))
    from_py = from_pt2 = (x,)
    with torch.no_grad():
        for entry in manifest["ranks"]:
            from_py = load_stage(resnet_out, entry)(*from_py)
            program = load_pt2(resnet_out, entry)
            assert not any(t.is_meta for t in program.state_dict().values())
            from_pt2 = program(*from_pt2)
    torch.testing.assert_close(from_pt2, from_py, rtol=0, atol=0)


def corrupted_copy(out: Path, tmp_path: Path, relative: str) -> Path:
    """A copy of the directory `out` whose file `relative` has its last byte flipped."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    data = bytearray((copy / relative).read_bytes())
    data[-1] ^= 0xFF
    (copy / relative).write_bytes(bytes(data))
    return copy


def test_load_pt2_checks_the_weights_hash(resnet_out, tmp_path):
    out = corrupted_copy(resnet_out, tmp_path, "rank1/weights.safetensors")
    entry = load_manifest(out)["ranks"][1]
    with pytest.raises(HetpartError, match="weights.safetensors"):
        load_pt2(out, entry)


def test_a_pt2_with_pickled_sample_inputs_is_refused(tmp_path):
    ep = torch.export.export(torch.nn.Linear(2, 2), (torch.randn(1, 2),))
    torch.export.save(ep, str(tmp_path / "plain.pt2"))  # keeps its example inputs: a torch.save pickle
    with pytest.raises(HetpartError, match="pickle"):
        check_no_pickle(tmp_path / "plain.pt2")


def test_timings_name_every_step(resnet_out):
    steps = json.loads((resnet_out / "timings.json").read_text())["steps_s"]
    expected = {"trace/build", "trace/export", "pass/shape", "pass/op-cost", "lower", "solve", "verify", "split",
                "baselines",
                "write/rank0/stage.py", "write/rank0/weights.safetensors", "pt2/rank1", "write/stage.pt2 (all ranks)",
                "write/manifest.json", "write/report.html", "write/ir/ (dumps)"}
    assert expected <= set(steps)
    assert "examples" not in steps, "a stage was exported again: its program was not built from its graph"
    assert all(s >= 0 for s in steps.values())
    timings = json.loads((resnet_out / "timings.json").read_text())
    writes = sum(s for name, s in steps.items() if name.startswith("write/"))
    assert timings["write_s"] == pytest.approx(writes, abs=1e-3)
    assert timings["total_s"] >= timings["write_s"]


@pytest.fixture(scope="module")
def mlp_stages():
    from hetpart.codegen import split_stages, stage_examples
    from hetpart.compile import analyze
    from hetpart.devices import load_cluster
    from hetpart.passes import lower_to_problem
    from tests.codegen.test_split import contiguous_plan

    spec = ModelSpec("zoo:mlp", {"hidden": "16", "n_blocks": "3"}, batch_size=4)
    cluster = load_cluster("preset:cpu-2")
    gm, _, inputs, _, _ = analyze(spec, cluster, 2, echo=lambda _: None)
    stages = split_stages(gm, contiguous_plan(lower_to_problem(gm, cluster), 3), 3)
    return stages, stage_examples(stages, tuple(x[:2] for x in inputs)), tuple(x[:2] for x in inputs)


def _real_run(stages, inputs):
    values, seen = inputs, []
    with torch.no_grad():
        for stage in stages:
            seen.append(values)
            values = tuple(stage.gm(*values))
    return seen


def test_examples_come_from_a_fake_run_with_the_real_shapes(mlp_stages, monkeypatch):
    from hetpart.codegen import stage_examples

    stages, examples, inputs = mlp_stages
    real = _real_run(stages, inputs)
    assert [[(v.shape, v.dtype) for v in e] for e in examples] == [[(v.shape, v.dtype) for v in r] for r in real]
    assert all(not v.any() for e in examples[1:] for v in e), "zeros of the fake run's shapes (NOTE [meta examples])"

    class NoFakeKernel:
        def __init__(self, *args, **kwargs):
            raise NotImplementedError("no fake kernel")

    monkeypatch.setattr("torch._subclasses.fake_tensor.FakeTensorMode", NoFakeKernel)  # a stage fake cannot run
    fallback = stage_examples(stages, inputs)
    for got, want in zip(fallback, real):
        torch.testing.assert_close(got, want)  # the real values, as before


def test_forked_pt2_writes_give_the_serial_bytes(mlp_stages, tmp_path, monkeypatch):
    # Stages whose graph cannot be a program as it is are exported again from examples (NOTE [stage programs]),
    # forked or not: the same bytes either way.
    from hetpart.codegen import pt2
    from hetpart.timings import StepTimes

    stages, _, inputs = mlp_stages

    def refuse(stage):
        raise ValueError("no program from this graph")

    monkeypatch.setattr(pt2, "stage_program", refuse)
    digests = {}
    for workers in (1, 3):
        jobs = []
        for s in stages:
            (tmp_path / f"w{workers}" / f"rank{s.index}").mkdir(parents=True)
            jobs.append((tmp_path / f"w{workers}" / f"rank{s.index}" / "stage.pt2", s))
        times = StepTimes()
        digests[workers] = list(pt2.write_pt2_files(jobs, inputs, times, workers=workers).values())
        assert {f"pt2/rank{s.index}" for s in stages} | {"examples"} <= set(times.seconds)
        assert "write/stage.pt2 (all ranks)" in times.seconds
    assert digests[1] == digests[3] and len(set(digests[1])) == len(stages)


def test_a_failing_forked_write_raises_in_the_parent(mlp_stages, tmp_path, monkeypatch):
    from hetpart.codegen import pt2

    stages, _, inputs = mlp_stages
    monkeypatch.setattr(pt2, "stage_program", lambda stage: 1 / 0)  # every stage exported again, forked
    jobs = [(tmp_path / f"rank{s.index}.pt2", s) for s in stages]
    jobs[1] = (tmp_path / "missing-dir" / "rank1.pt2", stages[1])  # its folder does not exist
    with pytest.raises(RuntimeError, match="failed in a child process"):
        pt2.write_pt2_files(jobs, inputs, workers=2)


def test_load_pt2_of_a_plan_without_pt2_says_so(resnet_out, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(resnet_out, out)
    (out / "rank0" / "stage.pt2").unlink()
    entry = load_manifest(out)["ranks"][0]
    del entry["files"]["stage.pt2"]  # as `partition --no-pt2` lists it
    with pytest.raises(HetpartError, match="--no-pt2"):
        load_pt2(out, entry)
