"""Cluster files state their memory unit (NOTE [memory units]); the README lists the whole catalog."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetpart.devices import CATALOG, parse_cluster
from hetpart.devices.catalog import catalog_markdown
from hetpart.errors import HetpartError

README = Path(__file__).resolve().parents[2] / "README.md"


def one_device(entry: str) -> int:
    return parse_cluster(f'[[nodes]]\nname = "a"\ndevices = [{entry}]\n', "c.toml", "c").devices[0].mem_bytes


@pytest.mark.parametrize("entry, nbytes", [
    ('{type = "a100-80g", mem_GiB = 40}', 40 << 30),
    ('{type = "a100-80g", mem_GB = 40}', 40 * 10**9),
    ('{type = "a100-80g", mem = "40 GiB"}', 40 << 30),
    ('{type = "a100-80g", mem = "40GB"}', 40 * 10**9),
    ('{type = "a100-80g", mem = "512 MiB"}', 512 << 20),
    ('{type = "a100-80g", mem = "1.5 TB"}', 1_500 * 10**9),
    ('"a100-80g"', 81050 << 20),  # the catalog's capacity: what CUDA reports (NOTE [capacity CUDA reports])
])
def test_memory_in_each_unit(entry, nbytes):
    assert one_device(entry) == nbytes


@pytest.mark.parametrize("entry, message", [
    ('{type = "t4-16g", mem = "16"}', "c.toml:3: node 'a' device 0: 'mem' must be a size with a unit, like \"80 GiB\""),
    ('{type = "t4-16g", mem = "16 gigs"}', "(2^30 bytes) or \"40 GB\" (10^9 bytes; units: B, kB"),
    ('{type = "t4-16g", mem_GB = 16, mem_GiB = 16}', "give its memory once, as one of mem_GiB (2^30 bytes), mem_GB"),
    ('{type = "t4-16g", mem_GiB = 1e9}', "'mem_GiB' = 1000000000.0 is outside the range hetpart accepts, 1e-06 to "
                                         "100000 GiB (2^30 bytes)"),
    ('{type = "t4-16g", mem = "900 TB"}', "'mem' = '900 TB' is outside the range hetpart accepts, 1 kB to 100 TB"),
    ('{type = "t4-16g", mem_MB = 16}', "(or mem_GB = 40 for 10^9 bytes, or mem = \"40 GiB\")"),
])
def test_memory_errors_name_the_unit(entry, message):
    with pytest.raises(HetpartError) as err:
        one_device(entry)
    assert message in str(err.value)


def test_custom_device_type_memory_units():
    text = ('[[device_types]]\nname = "g"\npeak_tflops = { fp32 = 1 }\nmem = "48 GiB"\nmem_bw_GBps = 1\n'
            '[[nodes]]\ndevices = ["g"]\n')
    assert parse_cluster(text, "c.toml", "c").devices[0].mem_bytes == 48 << 30
    with pytest.raises(HetpartError, match=r"c.toml: device type 'g' needs its memory: mem_GiB = 80"):
        parse_cluster(text.replace('mem = "48 GiB"\n', ""), "c.toml", "c")


def test_readme_lists_every_catalog_type():
    text = README.read_text()
    start = text.index("<!-- device types:")
    block = text[text.index("\n", start) + 1:text.index("<!-- end device types -->")].strip()
    assert block == catalog_markdown()  # regenerate with catalog_markdown() when the catalog changes
    for name in CATALOG:
        assert f"- `{name}`:" in block
