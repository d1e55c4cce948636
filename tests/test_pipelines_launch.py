"""launch.sh of several data-parallel pipelines over several machines (issue 19): one torchrun case for every
node that runs a rank, with the ranks of each pipeline where the manifest puts them (NOTE [ranks are stages])."""

from __future__ import annotations

import json
import re
import subprocess

from hetpart.compile import CompileOptions, compile_model
from hetpart.frontend import ModelSpec

CLUSTER = """
[network]
bandwidth_GBps = 1
latency_us = 50
[[nodes]]
name = "m"
count = 4
devices = ["cpu", "cpu"]
link = { bandwidth_GBps = 2, latency_us = 20 }
"""


def test_every_node_of_two_pipelines_over_four_machines_gets_its_torchrun(tmp_path):
    """Pipelines of 2 and 3 stages over machines m-0..m-3 (m-1 hosts one stage of each, m-3 none): launch.sh
    starts one torchrun per node of the manifest, on its machine, with its ranks, and refuses any other."""
    cluster = tmp_path / "four.toml"
    cluster.write_text(CLUSTER)
    out = tmp_path / "out"
    groups = (("m-0/0", "m-1/0"), ("m-1/1", "m-2/0", "m-2/1"))
    opts = CompileOptions(microbatches=6, pt2=False, mode="training", schedule="1f1b", time_limit_s=4,
                          pipelines=groups, pipeline_microbatches=(3, 3))
    result = compile_model(ModelSpec("zoo:mlp", {"hidden": "32", "n_blocks": "6"}, 12, 16, 0), str(cluster), out,
                           opts, echo=lambda _: None)
    man = json.loads((out / "manifest.json").read_text())
    script = (out / "launch.sh").read_text()
    used = {d for p in result.pipelines.pipelines for s in p.plan.stages for d in s.devices}
    machines = {d.partition("/")[0] for d in used}
    assert len(result.pipelines.pipelines) == 2
    # Every node's case: its machine, its ranks' count, its node rank of all of them.
    cases = re.findall(r"^  (\d+)\)\n    MACHINE=(\S+) STAGES='?([\d, ]+)'?\n.*?--nproc-per-node (\d+)", script,
                       re.MULTILINE | re.DOTALL)
    assert [int(c[0]) for c in cases] == [n["node_rank"] for n in man["nodes"]] == list(range(len(man["nodes"])))
    assert {c[1] for c in cases} == {n["machine"] for n in man["nodes"]} == machines
    ranks = [int(r) for c in cases for r in c[2].split(",")]
    assert ranks == list(range(man["world_size"])) == list(range(len(used)))  # each rank once, in order
    assert [int(c[3]) for c in cases] == [len(n["ranks"]) for n in man["nodes"]]
    for n in man["nodes"]:  # a node's ranks all run on its machine
        assert {man["ranks"][r]["machine"] for r in n["ranks"]} == {n["machine"]}
    assert f"--nnodes '{len(man['nodes'])}'" in script or f"--nnodes {len(man['nodes'])}" in script
    subprocess.run(["bash", "-n", str(out / "launch.sh")], check=True)
    bad = subprocess.run(["bash", str(out / "launch.sh"), str(len(man["nodes"]))], capture_output=True, text=True)
    assert bad.returncode == 2 and "NODE_RANK must be 0.." in bad.stderr
