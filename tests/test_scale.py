"""Issue 19's big presets, `count` in cluster files, and the refusal before the trace."""

import pytest

from hetpart.devices import load_cluster, parse_cluster
from hetpart.errors import HetpartError


@pytest.mark.parametrize("name, machines", [("hetero-64", 8), ("hetero-256", 32), ("hetero-1024", 128)])
def test_hetero_presets_are_8_gpu_machines_of_four_types(name, machines):
    c = load_cluster(f"preset:{name}")
    assert len(c.machines) == machines and len(c.devices) == 8 * machines
    assert all(len(m.devices) == 8 and len({d.type.name for d in m.devices}) == 1 for m in c.machines)
    kinds = {t: sum(d.type.name == t for d in c.devices) for t in c.device_types}
    assert sorted(kinds) == ["a100-40g", "a100-80g", "h100-80g", "l4-24g"] and set(kinds.values()) == {2 * machines}
    assert len({d.name for d in c.devices}) == len(c.devices)
    # NVLink-like inside the GPU machines, 200 Gb/s between machines.
    h = [d for d in c.devices if d.type.name == "h100-80g"]
    assert c.link(h[0], h[1]).bandwidth_bytes_per_s == 450e9 and c.link(h[0], h[-1]) == c.network
    assert c.network.bandwidth_bytes_per_s == 25e9


NODE = '[[nodes]]\nname = "g"\n{count}devices = ["t4-16g", "l4-24g"]\nlink = {{ bandwidth_GBps = 16 }}\n'


def test_count_repeats_a_machine_under_numbered_names():
    c = parse_cluster(NODE.format(count="count = 3\n") + '[[nodes]]\nname = "x"\ndevices = ["cpu"]\n', "c.toml", "c")
    assert [m.name for m in c.machines] == ["g-0", "g-1", "g-2", "x"]
    assert [d.name for d in c.machines[2].devices] == ["g-2/0", "g-2/1"]
    assert [d.type.name for d in c.devices] == ["t4-16g", "l4-24g"] * 3 + ["cpu"]
    assert all(m.link.bandwidth_bytes_per_s == 16e9 for m in c.machines[:3])
    one = parse_cluster(NODE.format(count=""), "c.toml", "c")
    assert [m.name for m in one.machines] == ["g"]


@pytest.mark.parametrize("count, needle", [
    ("0", "'count' is how many such machines"), ("2.5", "a whole number"), ("true", "got True"),
    ('"4"', "got '4'"), ("5000", "from 1 to 4096"),
])
def test_bad_counts_are_refused_at_their_line(count, needle):
    with pytest.raises(HetpartError) as err:
        parse_cluster("# fleet\n" + NODE.format(count=f"count = {count}\n"), "c.toml", "c")
    msg = str(err.value)
    assert msg.startswith("c.toml:4:") and needle in msg


def test_counts_count_towards_the_cluster_limit():
    with pytest.raises(HetpartError, match="the cluster has 4098 devices; hetpart plans at most 4096"):
        parse_cluster(NODE.format(count="count = 2049\n"), "c.toml", "c")


def test_counted_machines_may_not_take_another_nodes_name():
    text = NODE.format(count="count = 2\n") + '[[nodes]]\nname = "g-1"\ndevices = ["cpu"]\n'
    with pytest.raises(HetpartError, match="machine name 'g-1' is used twice"):
        parse_cluster(text, "c.toml", "c")


# --- refused before the trace (NOTE [refused before the trace])


def test_weight_memory_counts_shared_parameters_once_and_training_state():
    from torch import nn

    from hetpart.frontend.fits import weight_memory

    lin = nn.Linear(4, 3)  # 15 fp32 parameters
    tied = nn.Sequential(lin, nn.ReLU(), lin)
    tied.extra = nn.Linear(2, 2, bias=False).to(dtype=__import__("torch").bfloat16)  # 4 bf16 parameters
    tied.extra.weight.requires_grad_(False)  # frozen: no gradient, no optimizer state
    got = weight_memory(tied, training=False, optimizer_bytes_per_param=8)
    assert (got.params, got.param_bytes, got.state_bytes) == (19, 15 * 4 + 4 * 2, 0)
    trained = weight_memory(tied, training=True, optimizer_bytes_per_param=8)
    assert trained.state_bytes == 15 * 4 + 15 * 8 and trained.total_bytes == 68 + 180


def _tiny_cluster(tmp_path, mem: str):
    f = tmp_path / "tiny.toml"
    f.write_text(f'[[nodes]]\nname = "n"\ncount = 2\ndevices = [{{type = "cpu", mem = "{mem}"}}]\n')
    return str(f)


def test_a_model_too_big_for_the_cluster_is_refused_before_the_trace(tmp_path, capfd, monkeypatch):
    import hetpart.compile
    from hetpart.cli import main

    def no_trace(*args, **kwargs):
        raise AssertionError("traced a model the cluster cannot hold")

    monkeypatch.setattr(hetpart.compile, "export_model", no_trace)
    # zoo:mlp at its defaults: 2,126,090 fp32 parameters, 8.1 MiB; with their gradients and Adam's state 4x that.
    cluster = _tiny_cluster(tmp_path, "2 MiB")  # 4 MiB in all
    before = sorted(p.name for p in tmp_path.iterdir())
    capfd.readouterr()
    status = main(["partition", "zoo:mlp", "--cluster", cluster, "--out", str(tmp_path / "out"), "--mode", "training"])
    err = capfd.readouterr().err
    assert status == 2 and err.count("hetpart: error: ") == 1 and "Traceback" not in err, err
    assert "zoo:mlp does not fit cluster 'tiny'" in err and "need at least 32.4 MiB (8.11 MiB of weights + 24.3 MiB" in err
    assert "2 device(s) hold 4 MiB in all" in err
    assert "refused before tracing" in err and "--mode inference" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written
    # Enough memory for the weights but not their training state: inference passes the check, training does not.
    cluster = _tiny_cluster(tmp_path, "10 MiB")  # 20 MiB: above 8.1 MiB, below 32.4 MiB
    assert main(["partition", "zoo:mlp", "--cluster", cluster, "--out", str(tmp_path / "out"),
                 "--mode", "training"]) == 2
    assert "refused before tracing" in capfd.readouterr().err
    with pytest.raises(AssertionError, match="traced a model"):
        main(["partition", "zoo:mlp", "--cluster", cluster, "--out", str(tmp_path / "out")])


def test_the_405b_config_is_meta_only_with_its_parameter_count():
    from hetpart.models import ZOO, build_zoo

    entry = ZOO["llama-405b"]
    assert entry.meta_only and entry.config_cls().n_layers == 126
    # Two of its 126 layers (building all takes seconds): the count below is the published one at 126.
    module, (tokens,) = build_zoo("llama-405b", {"dtype": "bfloat16", "n_layers": "2"}, batch_size=2, seq_len=8)
    params = list(module.parameters())
    assert all(p.is_meta and p.dtype.itemsize == 2 for p in params) and len(module.layers) == 2
    # Llama-3.1-405B: embedding and LM head 128,256 x 16,384; per layer q and o 16,384^2, k and v 16,384 x 1,024,
    # three 16,384 x 53,248 MLP matrices and two norms; a final norm.
    per_layer = 2 * 16384**2 + 2 * 16384 * 1024 + 3 * 16384 * 53248 + 2 * 16384
    assert sum(p.numel() for p in params) == 2 * 128256 * 16384 + 2 * per_layer + 16384
    assert 2 * 128256 * 16384 + 126 * per_layer + 16384 == 405_853_388_800
    assert tuple(tokens.shape) == (2, 8)


@pytest.mark.parametrize("flags", [
    ["--meta"],
    ["--parallel", "data", "--batch-size", "2", "--microbatches", "2"],
    ["--parallel", "data", "--batch-size", "2", "--microbatches", "2", "--max-tensor-parallel", "2"],
    ["--tensor-parallel", "2"],
], ids=["meta", "parallel-data", "max-tensor-parallel", "tensor-parallel"])
def test_the_refusal_before_the_trace_holds_on_every_planning_path(tmp_path, capfd, monkeypatch, flags):
    """Issue 19: --meta, --parallel data and the tensor-parallel paths check the parameters against the cluster's
    memory before the trace too (NOTE [refused before the trace]); a model the cluster holds in all is traced, whatever
    the degree (a TP plan may hold what no single device does)."""
    import hetpart.compile
    from hetpart.cli import main

    def no_trace(*args, **kwargs):
        raise AssertionError("traced a model the cluster cannot hold")

    monkeypatch.setattr(hetpart.compile, "export_model", no_trace)
    capfd.readouterr()
    status = main(["partition", "zoo:mlp", "--cluster", _tiny_cluster(tmp_path, "2 MiB"), "--out",
                   str(tmp_path / "out"), "--mode", "training", *flags])
    err = capfd.readouterr().err
    assert status == 2 and "refused before tracing" in err and "Traceback" not in err, err
    with pytest.raises(AssertionError, match="traced a model"):  # 2 x 40 MiB hold its 32.4 MiB: on to the trace
        main(["partition", "zoo:mlp", "--cluster", _tiny_cluster(tmp_path, "40 MiB"), "--out", str(tmp_path / "out"),
              "--mode", "training", *flags])
