"""The bad-input catalogue, wave 2 (docs/errors.md, "Bad input, wave 2"): issue 18's cases.

Each case runs `hetpart.cli.main` with the contract of tests/test_errors.py (whose helpers
it imports): exit status 2, one `hetpart: error: ...` message naming what, where and what
to do, no traceback on file descriptor 2, and the test's directory byte for byte unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
import time

import networkx as nx
import pytest

from hetpart.cli import main
from hetpart.devices.cluster import MAX_DEVICES
from hetpart.partitioner import solve
from hetpart.partitioner.bounds import compute_bounds
from hetpart.partitioner.problem import TIME_NS, Device, Link, Problem
from tests.test_errors import MLP, Case, _fill, _manifest_edit, _tree, artifacts  # noqa: F401 - a fixture

BAD_MODELS_PY = '''\
import sys
import torch
from torch import nn


class Returns(nn.Module):
    def __init__(self, value):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.value = value

    def forward(self, x):
        self.lin(x)
        return self.value


class Exits(nn.Module):
    def forward(self, x):
        sys.exit(0)


def returns_none():
    return None


def returns_int():
    return 3


def forward_none():
    return Returns(None), (torch.randn(4, 8),)


def forward_int():
    return Returns(3), (torch.randn(4, 8),)


def forward_str():
    return Returns("text"), (torch.randn(4, 8),)


def exits_0():
    sys.exit(0)


def interrupts():
    raise KeyboardInterrupt


class Custom(BaseException):
    pass


def raises_base():
    raise Custom("not an Exception")


def forward_exits():
    return Exits(), (torch.randn(4, 8),)
'''


def _cluster(body: str) -> str:
    return f'[[nodes]]\nname = "a"\ndevices = ["cpu", "cpu"]\n{body}'


PLACEMENT = {"maxSizePerFPGA": 1000, "maxFPGAs": 2, "maxCPUs": 1,
             "nodes": [{"id": 1, "supportedOnFpga": 1, "cpuLatency": 1.0, "fpgaLatency": 0.5, "size": 10},
                       {"id": 2, "supportedOnFpga": 1, "cpuLatency": 2.0, "fpgaLatency": 0.5, "size": 10}],
             "edges": [{"sourceId": 1, "destId": 2, "cost": 0.1}]}


def _placement(edit) -> str:
    data = json.loads(json.dumps(PLACEMENT))
    edit(data)
    return json.dumps(data)


FILES = {
    # Cluster TOML
    "huge-bandwidth.toml": '[network]\nbandwidth_GBps = 1e300\n' + _cluster(""),
    "tiny-bandwidth.toml": _cluster("link = { bandwidth_GBps = 1e-300, latency_us = 2 }\n"),
    "huge-latency.toml": _cluster("link = { bandwidth_GBps = 10, latency_us = 1e300 }\n"),
    "nan-latency.toml": _cluster("link = { bandwidth_GBps = 10, latency_us = nan }\n"),
    "huge-memory.toml": '[[nodes]]\nname = "a"\ndevices = [{type = "cpu", mem_GB = 1e300}]\n',
    "bool-memory.toml": '[[nodes]]\nname = "a"\ndevices = [{type = "cpu", mem_GB = true}]\n',
    "string-memory.toml": '[[nodes]]\nname = "a"\ndevices = [{type = "cpu", mem_GB = "16"}]\n',
    "tiny-peak.toml": ('[[device_types]]\nname = "slow"\npeak_tflops = { fp32 = 1e-300 }\nmem_GB = 16\n'
                       'mem_bw_GBps = 100\n[[nodes]]\nname = "a"\ndevices = ["slow"]\n'),
    "deep.toml": '[[nodes]]\nname = "a"\ndevices = ' + "[" * 3000 + "]" * 3000 + "\n",
    "nodes-not-tables.toml": 'nodes = ["a", "b"]\n',
    "newline-name.toml": '[[nodes]]\nname = "a\\nrm -rf ~"\ndevices = ["cpu"]\n',
    "shell-name.toml": '[[nodes]]\nname = "$(reboot)"\ndevices = ["cpu"]\n',
    "unicode-name.toml": '[[nodes]]\nname = "m\u00e1quina"\ndevices = ["cpu"]\n',
    "spaced-type-name.toml": ('[[device_types]]\nname = "my gpu"\npeak_tflops = { fp32 = 10 }\nmem_GB = 16\n'
                              'mem_bw_GBps = 100\n[[nodes]]\nname = "a"\ndevices = ["my gpu"]\n'),
    "too-many-devices.toml": '[[nodes]]\nname = "a"\ndevices = [' + ", ".join(['"cpu"'] * (MAX_DEVICES + 1)) + "]\n",
    "binary.toml": "\udcff",  # written as bytes below
    # Placement JSON
    "nan.json": json.dumps(PLACEMENT).replace('"cpuLatency": 1.0', '"cpuLatency": NaN', 1),
    "infinity.json": json.dumps(PLACEMENT).replace('"cost": 0.1', '"cost": Infinity', 1),
    "negative-cost.json": _placement(lambda d: d["edges"][0].update(cost=-100)),
    "string-latency.json": _placement(lambda d: d["nodes"][1].update(fpgaLatency="0.5")),
    "bool-latency.json": _placement(lambda d: d["nodes"][1].update(cpuLatency=True)),
    "negative-size.json": _placement(lambda d: d["nodes"][0].update(size=-1)),
    "missing-latency.json": _placement(lambda d: d["nodes"][1].pop("cpuLatency")),
    "unknown-node.json": _placement(lambda d: d["edges"][0].update(destId=99)),
    "cycle.json": _placement(lambda d: d["edges"].append({"sourceId": 2, "destId": 1, "cost": 0.3})),
    "self-loop.json": _placement(lambda d: d["edges"].append({"sourceId": 2, "destId": 2, "cost": 0.3})),
    "overflow.json": _placement(lambda d: d["nodes"][0].update(fpgaLatency=1e15)),
    "fractional-fpgas.json": _placement(lambda d: d.update(maxFPGAs=2.5)),
    "deep.json": "[" * 100_000 + "]" * 100_000,
    "no-nodes.json": _placement(lambda d: d.update(nodes=[], edges=[])),
    # Models
    "bad_models.py": BAD_MODELS_PY,
    "exits_at_import.py": "import sys\nsys.exit(0)\n",
}

PARTITION = ["--cluster", "preset:cpu-2", "--out", "{out}", "--no-pt2"]


def _toml(name: str, *expect: str) -> Case:
    return Case(["partition", "zoo:mlp", "--cluster", f"{{tmp}}/{name}", "--out", "{out}"], list(expect))


def _json(name: str, *expect: str) -> Case:
    return Case(["placement", f"{{tmp}}/{name}", "--time-limit", "5"], list(expect))


def _model(fn: str, *expect: str, file: str = "bad_models.py") -> Case:
    return Case(["partition", f"{{tmp}}/{file}:{fn}", *PARTITION], list(expect))


def _rehashed_plan(art, text: str) -> None:
    """plan.json replaced by `text`, its sha256 in the manifest updated: the edit passes the hash
    check (hetpart/trust.py) and meets the field checks behind it (a hand-edited, re-hashed plan)."""
    import hashlib

    (art / "plan.json").write_text(text)
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["files"]["plan.json"] = hashlib.sha256(text.encode()).hexdigest()
    (art / "manifest.json").write_text(json.dumps(manifest))


def _plan_edit(field: str):
    """Drop plan.json's `field` ("stages"), or make stage 0's `field` a string (re-hashed)."""
    def change(art) -> None:
        plan = json.loads((art / "plan.json").read_text())
        if field in plan:
            del plan[field]
        else:
            plan["stages"][0][field] = "fast"
        _rehashed_plan(art, json.dumps(plan))
    return change


CASES: dict[str, Case] = {
    # Cluster TOML: numbers in range, tables of their type, names (NOTE [cluster ranges])
    "cluster-huge-bandwidth": _toml("huge-bandwidth.toml", "{tmp}/huge-bandwidth.toml:2: [network]: 'bandwidth_GBps' "
                                    "= 1e+300 is outside the range hetpart accepts, 0.001 to 100000 GB/s"),
    "cluster-tiny-bandwidth": _toml("tiny-bandwidth.toml", "{tmp}/tiny-bandwidth.toml:4: node 'a' link: "
                                    "'bandwidth_GBps' = 1e-300 is outside the range"),
    "cluster-huge-latency": _toml("huge-latency.toml", "{tmp}/huge-latency.toml:4: node 'a' link: 'latency_us' = "
                                  "1e+300 is outside the range hetpart accepts, 0 to 1e+06 us"),
    "cluster-nan-latency": _toml("nan-latency.toml", "{tmp}/nan-latency.toml:4: node 'a' link: 'latency_us' must be "
                                 "a number >= 0, got nan"),
    "cluster-huge-memory": _toml("huge-memory.toml", "{tmp}/huge-memory.toml:3: node 'a' device 0: 'mem_GB' = 1e+300 "
                                 "is outside the range hetpart accepts, 1e-06 to 100000 GB"),
    "cluster-bool-memory": _toml("bool-memory.toml", "{tmp}/bool-memory.toml:3: node 'a' device 0: 'mem_GB' must be a "
                                 "number > 0, got True"),
    "cluster-string-memory": _toml("string-memory.toml", "'mem_GB' must be a number > 0, got '16'"),
    "cluster-tiny-peak": _toml("tiny-peak.toml", "{tmp}/tiny-peak.toml:3: device type 'slow' peak_tflops: 'fp32' = "
                               "1e-300 is outside the range hetpart accepts, 0.001 to 100000 TFLOP/s"),
    "cluster-deep-nesting": _toml("deep.toml", "{tmp}/deep.toml:3: arrays or tables nested too deeply to read"),
    "cluster-nodes-not-tables": _toml("nodes-not-tables.toml", "{tmp}/nodes-not-tables.toml:1: nodes must be an "
                                      "array of tables, one [[nodes]] per machine"),
    "cluster-name-with-newline": _toml("newline-name.toml", "{tmp}/newline-name.toml:2: node name 'a\\nrm -rf ~' is "
                                       "not a valid name: use 1 to 64 letters, digits, '.', '_' or '-'"),
    "cluster-name-with-shell-characters": _toml("shell-name.toml", "node name '$(reboot)' is not a valid name"),
    "cluster-name-not-ascii": _toml("unicode-name.toml", "node name 'm\u00e1quina' is not a valid name"),
    "cluster-type-name-with-space": _toml("spaced-type-name.toml", "{tmp}/spaced-type-name.toml:2: [[device_types]] "
                                          "#1: device type name 'my gpu' is not a valid name"),
    "cluster-too-many-devices": _toml("too-many-devices.toml", f"the cluster has {MAX_DEVICES + 1} devices; hetpart "
                                      f"plans at most {MAX_DEVICES}"),
    "cluster-not-utf8": _toml("binary.toml", "cannot read cluster file '{tmp}/binary.toml'", "a cluster file is UTF-8"),
    "cluster-empty": Case(["partition", "zoo:mlp", "--cluster", "", "--out", "{out}"], ["--cluster is empty"]),
    "cluster-is-a-directory": Case(["partition", "zoo:mlp", "--cluster", "{tmp}/existing", "--out", "{out}"],
                                   ["cluster file '{tmp}/existing' is a directory"]),
    # Placement JSON (NOTE [placement input ranges])
    "placement-nan": _json("nan.json", "{tmp}/nan.json: not a valid benchmark input: NaN is not a number JSON allows"),
    "placement-infinity": _json("infinity.json", "Infinity is not a number JSON allows"),
    "placement-negative-cost": _json("negative-cost.json", "{tmp}/negative-cost.json: edges[0] (1->2): 'cost' must be "
                                     "a finite number >= 0 and below 2^53, got -100"),
    "placement-string-latency": _json("string-latency.json", "nodes[1] (id 2): 'fpgaLatency' must be a finite number "
                                      ">= 0 and below 2^53, got '0.5'"),
    "placement-bool-latency": _json("bool-latency.json", "nodes[1] (id 2): 'cpuLatency' must be a finite number"),
    "placement-negative-size": _json("negative-size.json", "nodes[0] (id 1): 'size' must be a finite number >= 0"),
    "placement-missing-field": _json("missing-latency.json", "nodes[1] (id 2): missing field 'cpuLatency'"),
    "placement-edge-to-unknown-node": _json("unknown-node.json", "edges[0] (1->99): edge 1->99 names an unknown node "
                                            "id (99 is not in 'nodes')"),
    "placement-cycle": _json("cycle.json", "invalid placement input", "form a cycle between colour classes"),
    "placement-self-loop": _json("self-loop.json", "edges[1] (2->2): edge 2->2 goes from a node to itself"),
    "placement-overflows-the-solver": _json("overflow.json", "the latencies and costs add up to 1e+15, too large for "
                                            "the solver's integer units"),
    "placement-fractional-count": _json("fractional-fpgas.json", "'maxFPGAs' must be a whole number from 0 to 256, "
                                        "got 2.5"),
    "placement-deep-nesting": _json("deep.json", "{tmp}/deep.json: JSON nested too deeply to read"),
    "placement-no-nodes": _json("no-nodes.json", "'nodes' is empty"),
    "placement-is-a-directory": _json("existing", "{tmp}/existing is a directory"),
    # Models (NOTE [user code exits])
    "model-function-returns-none": _model("returns_none", "bad_models.py:returns_none() must return (nn.Module, "
                                          "tuple_of_example_inputs) (got NoneType)"),
    "model-function-returns-int": _model("returns_int", "(got int)"),
    "model-forward-returns-none": _model("forward_none", "Returns.forward's output is NoneType (None), not a tensor"),
    "model-forward-returns-int": _model("forward_int", "Returns.forward's output is int (3), not a tensor"),
    "model-forward-returns-str": _model("forward_str", "Returns.forward's output is str ('text'), not a tensor"),
    "model-exits-at-import": _model("build", "{tmp}/exits_at_import.py:2: importing the model file called "
                                    "sys.exit(0)", file="exits_at_import.py"),
    "model-function-exits": _model("exits_0", "{tmp}/bad_models.py:43: exits_0() called sys.exit(0)"),
    "model-function-raises-keyboardinterrupt": _model("interrupts", "{tmp}/bad_models.py:47: interrupts() raised "
                                                      "KeyboardInterrupt"),
    "model-function-raises-baseexception": _model("raises_base", "raises_base() raised Custom: not an Exception"),
    "model-forward-exits": _model("forward_exits", "{tmp}/bad_models.py:19: the model's forward, traced, called "
                                  "sys.exit(0)"),
    "model-file-is-a-directory": _model("build", "model file '{tmp}/existing' is a directory", file="existing"),
    # --set values of the zoo
    "set-negative-size": Case(["partition", "zoo:mlp", "--set", "hidden=-1", *PARTITION],
                              ["--set hidden=-1: zoo:mlp's hidden is a size or a count, it must be >= 0"]),
    "set-size-too-large-for-torch": Case(["partition", "zoo:mlp", "--set", "hidden=99999999999999999999", *PARTITION],
                                         ["zoo:mlp with --set hidden=99999999999999999999: building the model failed",
                                          "check the --set values"]),
    "set-float-nan": Case(["partition", "zoo:llama", "--set", "norm_eps=nan", *PARTITION],
                          ["--set norm_eps=nan: expected a float"]),
    # CLI numbers (one argparse type, hetpart.cli_args._number)
    "timeout-nan": Case(["run", "{art}", "--timeout", "nan"], ["run: --timeout must be a finite number (got nan)"]),
    "timeout-huge": Case(["run", "{art}", "--timeout", "1e300"], ["--timeout must be <= 1e+06 (got 1e300)"]),
    "time-limit-inf": Case(["partition", "zoo:mlp", *PARTITION, "--time-limit", "inf"],
                           ["partition: --time-limit must be a finite number (got inf)"]),
    # OR-Tools' linear solver raised OverflowError (a traceback) on a limit past ~9.2e15 s (planfuzz found it)
    "time-limit-huge": Case(["partition", "zoo:mlp", *PARTITION, "--parallel", "data", "--time-limit", "1e20"],
                            ["partition: --time-limit must be <= 1e+06 (got 1e20)"]),
    "replan-time-limit-huge": Case(["replan", "{art}", "--lose", "x", "--out", "{tmp}/new", "--time-limit", "1e20"],
                                   ["replan: --time-limit must be <= 1e+06 (got 1e20)"]),
    "time-limit-negative": Case(["placement", "{tmp}/nan.json", "--time-limit", "-1"],
                                ["placement: --time-limit must be positive (got -1)"]),
    "gap-nan": Case(["partition", "zoo:mlp", *PARTITION, "--gap", "nan"], ["--gap must be a finite number (got nan)"]),
    "batch-size-0": Case(["partition", "zoo:mlp", *PARTITION, "--batch-size", "0"],
                         ["--batch-size must be >= 1 (got 0)"]),
    "microbatches-negative": Case(["run", "{art}", "--microbatches", "-2"], ["--microbatches must be >= 1 (got -2)"]),
    "seq-len-0": Case(["partition", "zoo:mlp", *PARTITION, "--seq-len", "0"], ["--seq-len must be >= 1 (got 0)"]),
    "steps-not-an-integer": Case(["run", "{art}", "--steps", "1.5"], ["--steps must be an integer (got '1.5')"]),
    "master-port-out-of-range": Case(["run", "{art}", "--master-port", "70000"],
                                     ["--master-port must be <= 65535 (got 70000)"]),
    "workers-0": Case(["placement", "{tmp}/nan.json", "--workers", "0"], ["--workers must be >= 1 (got 0)"]),
    "threads-0": Case(["profile", "zoo:mlp", "--out", "{tmp}/p.json", "--threads", "0"],
                      ["profile: --threads must be >= 1 (got 0)"]),
    "repeats-0": Case(["profile", "zoo:mlp", "--out", "{tmp}/p.json", "--repeats", "0"], ["--repeats must be >= 1"]),
    "optimizer-bytes-huge": Case(["partition", "zoo:mlp", *PARTITION, "--optimizer-bytes-per-param", "5000"],
                                 ["--optimizer-bytes-per-param must be <= 1024 (got 5000)"]),
    "seed-negative": Case(["partition", "zoo:mlp", *PARTITION, "--seed", "-1"], ["--seed must be >= 0 (got -1)"]),
    "emulate-by-unknown": Case(["run", "{art}", "--emulate", "--emulate-by", "nap"],
                               ["run: argument --emulate-by: invalid choice: 'nap'"]),
    "unknown-choice": Case(["partition", "zoo:mlp", *PARTITION, "--mode", "train"],
                           ["partition: argument --mode: invalid choice: 'train'", "see `hetpart partition --help`"]),
    # Artifacts edited by hand (hetpart/runtime/artifacts.py: read_json, read_plan)
    "plan-json-is-a-list": Case(["inspect", "{art}"], ["{art}/plan.json: expected a JSON object, got list"],
                                lambda art: _rehashed_plan(art, "[]")),
    "plan-json-without-stages": Case(["inspect", "{art}", "--json"], ["{art}/plan.json: 'stages' is missing or not a "
                                                                      "list (got None)"], _plan_edit("stages")),
    "plan-json-stage-field-of-another-type": Case(["run", "{art}"], ["{art}/plan.json: stages[0].'compute_us' is "
                                                                      "missing or not a number (got 'fast')"],
                                                  _plan_edit("compute_us")),
    "manifest-not-utf8": Case(["inspect", "{art}", "--stage", "0"], ["{art}/manifest.json: not a JSON file hetpart "
                                                                     "wrote"],
                              lambda art: (art / "manifest.json").write_bytes(b"\xff\xfe\x00")),
    "manifest-nested-too-deeply": Case(["run", "{art}"], ["{art}/manifest.json: not a JSON file hetpart wrote "
                                                          "(nested too deeply)"],
                                       lambda art: (art / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)),
    "manifest-rank-field-of-another-type": Case(["run", "{art}"], ["{art}/manifest.json: ranks[0] must be rank 0 "
                                                                   "with rank (int), stage (int), dir (str), files "
                                                                   "(dict)"],
                                                _manifest_edit(lambda m: m["ranks"][0].update(files="x"))),
    # profile --out
    "profile-out-is-a-directory": Case(["profile", "zoo:mlp", "--out", "{tmp}/existing"],
                                       ["--out {tmp}/existing is a directory; give a file name"]),
    "profile-out-in-a-missing-folder": Case(["profile", "zoo:mlp", "--out", "{tmp}/nope/p.json"],
                                            ["--out {tmp}/nope/p.json: its folder {tmp}/nope does not exist"]),
}


def _write_files(tmp_path) -> None:
    (tmp_path / "existing").mkdir()
    for name, text in FILES.items():
        if name == "binary.toml":
            (tmp_path / name).write_bytes(b"\xff\xfe\x00[[nodes]]")
        else:
            (tmp_path / name).write_text(text)


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(name, tmp_path, request, capfd):
    case = CASES[name]
    _write_files(tmp_path)
    subs = {"{tmp}": str(tmp_path), "{out}": str(tmp_path / "out"), "{art}": str(tmp_path / "art")}
    if "{art}" in " ".join(case.argv):
        shutil.copytree(request.getfixturevalue("artifacts"), tmp_path / "art")
        if case.change is not None:
            case.change(tmp_path / "art")
    before = _tree(tmp_path)
    capfd.readouterr()
    status = main([_fill(a, subs) for a in case.argv])
    err = capfd.readouterr().err
    assert status == 2, err
    assert err.startswith("hetpart: error: ") and err.count("hetpart: error: ") == 1 and "Traceback" not in err, err
    for text in case.expect:
        assert _fill(text, subs) in err, err
    assert _tree(tmp_path) == before, "nothing written, nothing left behind"


@pytest.mark.parametrize("index", ['{"weight_map": 5}', "[1]"])
def test_shard_weights_with_an_index_of_another_shape(index, tmp_path, capfd):
    """A checkpoint index whose weight_map is no map of names (AttributeError before)."""
    meta = tmp_path / "meta"
    assert main(["partition", *MLP, "--cluster", "preset:cpu-2", "--out", str(meta), "--meta", "--no-pt2"]) == 0
    (tmp_path / "ck.safetensors.index.json").write_text(index)
    before = _tree(tmp_path)
    capfd.readouterr()
    assert main(["shard-weights", str(meta), str(tmp_path / "ck.safetensors.index.json")]) == 2
    err = capfd.readouterr().err
    assert err.startswith(f"hetpart: error: checkpoint index {tmp_path}/ck.safetensors.index.json: unreadable")
    assert 'expected a JSON file with a "weight_map"' in err and "Traceback" not in err, err
    assert _tree(tmp_path) == before


def test_catalogue_documents_every_case():
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "errors.md").read_text()
    missing = [name for name in CASES if f"test_bad_inputs.py::test_bad_input[{name}]" not in doc]
    assert not missing, f"docs/errors.md lacks {missing}"


def test_valid_names_and_edge_values_are_accepted(tmp_path):
    """The ranges do not refuse what real clusters hold (NOTE [cluster ranges])."""
    from hetpart.devices import load_cluster

    path = tmp_path / "edge.toml"
    path.write_text('[network]\nbandwidth_GBps = 0.001\nlatency_us = 0\n'
                    '[[nodes]]\nname = "rack-1.node_07"\ndevices = [{type = "cpu", mem_GB = 0.000001}, "cpu"]\n'
                    'link = { bandwidth_GBps = 100000, latency_us = 1000000 }\n')
    cluster = load_cluster(str(path))
    assert [d.name for d in cluster.devices] == ["rack-1.node_07/0", "rack-1.node_07/1"]
    assert cluster.devices[0].mem_bytes == 1000


def test_a_real_ctrl_c_while_the_model_builds_stays_an_interrupt(tmp_path, sigint):
    """NOTE [user code exits]: a SIGINT that arrives is not the model's own KeyboardInterrupt."""
    import os
    import signal

    sigint(signal.default_int_handler)  # as in a terminal, however the suite was started

    from hetpart.errors import HetpartError
    from hetpart.frontend.load import user_code

    with pytest.raises(KeyboardInterrupt):
        with user_code("building"):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the signal ends this at once
    with pytest.raises(HetpartError, match="building raised KeyboardInterrupt"):
        with user_code("building"):
            raise KeyboardInterrupt


# --- --time-limit on large clusters (NOTE [bounds deadline])


def _wide_problem(types: int, per_type: int, machines: int) -> Problem:
    """A chain of 6 ops over `types` device types, `per_type` devices of each on `machines` machines."""
    g = nx.path_graph([f"v{i}" for i in range(6)], create_using=nx.DiGraph)
    names = [f"t{j}" for j in range(types)]
    nx.set_node_attributes(g, {v: {t: 10 + i + j for j, t in enumerate(names)} for i, v in enumerate(g)}, TIME_NS)
    devices = [Device(f"m{k % machines}/{k}", t, f"m{k % machines}", 1 << 30)
               for j, t in enumerate(names) for k in range(j * per_type, (j + 1) * per_type)]
    return Problem(graph=g, weights={}, devices=devices,
                   intra_node_links={f"m{i}": Link(1000, 1) for i in range(machines)}, network=Link(100, 5))


def test_bounds_past_their_deadline_are_left_out_and_named():
    p = _wide_problem(types=5, per_type=40, machines=5)  # 41^5 device multisets: the stage-sum bound cannot finish
    late = compute_bounds(p, deadline=time.perf_counter() - 1)
    assert "stage_sum" in late.unfinished and late.stage_sum_ns == 0
    assert late.to_json()["unfinished"] == list(late.unfinished)
    small = _wide_problem(types=2, per_type=2, machines=2)
    full = compute_bounds(small)
    assert full.unfinished == () and "unfinished" not in full.to_json() and full.stage_sum_ns > 0
    # Stopped early, every bound stays below the optimum (a valid bound, or 0).
    stopped = compute_bounds(small, deadline=time.perf_counter() - 1)
    assert stopped.lower_bound_ns <= full.lower_bound_ns and set(stopped.unfinished) <= {"stage_sum", "sequence"}


def test_a_cpsat_model_too_large_to_build_in_time_falls_back_to_the_dp_plan():
    p = _wide_problem(types=2, per_type=3, machines=3)
    # A limit of a microsecond: past the model's build deadline before its first stage (the DP
    # stops at its own deadline with the list-order plan, NOTE [DP deadline]).
    plan = solve(p, time_limit_s=1e-6, run_ideal_dp=False)
    assert plan.stats.cpsat_not_built and plan.stats.plan_from == "dp" and plan.stats.cpsat_seconds is None
    assert plan.solver_status in ("FEASIBLE", "OPTIMAL") and plan.lower_bound_ns <= plan.bottleneck_ns


def test_a_profile_that_is_a_fifo_is_refused_not_read(tmp_path, capsys):
    # Reading a FIFO blocks until a writer comes: `partition --profile FIFO` hung (red team, issue 18).
    os.mkfifo(tmp_path / "pipe")
    assert main(["partition", "zoo:mlp", "--cluster", "preset:cpu-2", "--out", str(tmp_path / "out"),
                 "--profile", str(tmp_path / "pipe"), "--no-pt2"]) == 2
    assert f"--profile {tmp_path / 'pipe'}: not a regular file" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]
