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
