import pytest

from hetpart.devices import CATALOG, load_cluster
from hetpart.errors import HetpartError


def test_mixed4_preset_has_two_machines_of_two_types():
    c = load_cluster("preset:mixed-4")
    assert [(d.name, d.type.name) for d in c.devices] == [
        ("a/0", "a100-80g"), ("a/1", "a100-80g"), ("b/0", "t4-16g"), ("b/1", "t4-16g")]
    a0, a1, b0 = c.devices[:3]
    assert c.link(a0, a1).bandwidth_bytes_per_s > c.link(a0, b0).bandwidth_bytes_per_s
    assert c.link(a0, b0) == c.network


def test_catalog_has_required_types_with_datasheet_numbers():
    for name in ("a100-80g", "v100-32g", "t4-16g", "cpu"):
        assert name in CATALOG
    assert CATALOG["a100-80g"].flops_per_s("fp32") == pytest.approx(19.5e12)
    assert CATALOG["t4-16g"].flops_per_s("bf16") == CATALOG["t4-16g"].flops_per_s("fp32")  # no bf16 units


def test_toml_file_loads_with_memory_override(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[network]\nbandwidth_GBps = 10\nlatency_us = 5\n[[nodes]]\nname = "x"\n'
                 'devices = [{type = "a100-80g", mem_GB = 40}, "t4-16g"]\nlink = { bandwidth_GBps = 100, latency_us = 1 }\n')
    c = load_cluster(str(f))
    assert c.devices[0].mem_bytes == 40 * 10**9
    assert c.network.latency_s == pytest.approx(5e-6)


@pytest.mark.parametrize("text, needle", [
    ('[[nodes]]\nname = "x"\ndevices = ["a10"]\n', ":3: unknown device type 'a10' (known: a100-80g"),
    ('[[nodes]]\nname = "x"\ndevices = []\n', "has no devices"),
    ("[network]\nbandwidth_GBps = 0\n[[nodes]]\ndevices = ['cpu']\n", ":2: [network]: 'bandwidth_GBps' must be a positive number"),
    ("nodes = [\n", "not valid TOML"),
    ("", "the cluster has no [[nodes]]"),
])
def test_bad_cluster_files_say_where_and_what(tmp_path, text, needle):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(HetpartError) as err:
        load_cluster(str(f))
    assert needle in str(err.value)
    assert str(f) in str(err.value)


def test_unknown_preset_lists_presets():
    with pytest.raises(HetpartError, match="known: cpu-2, mixed-4"):
        load_cluster("preset:nope")
