"""`hetpart partition --dump-ir/--verbose` and `hetpart inspect --stage/--ir/--json`."""

import json
import re

from hetpart.cli import main


def test_dump_ir_dir_and_verbose_timings(partitioned):
    names = sorted(p.name for p in partitioned.dump_dir.iterdir() if p.name != ".hetpart-dumps")  # its marker
    assert names == ["00-export.txt", "01-shape.txt", "02-flops.txt", "03-memory.txt", "04-op-cost.txt",
                     "05-partition.txt", "graph.json", "partition.dot"]
    for name in names:  # the same dumps as the artifacts' ir/
        assert (partitioned.dump_dir / name).read_bytes() == (partitioned.out / "ir" / name).read_bytes()
    for line in ("pass 01 shape: ", "pass 04 op-cost: ", "solve: "):
        assert line in partitioned.stdout
    assert "subgraph cluster_stage_0" in (partitioned.out / "ir" / "partition.dot").read_text()


def test_inspect_table_has_simulated_step(partitioned, capsys):
    assert main(["inspect", str(partitioned.out)]) == 0
    shown = capsys.readouterr().out
    assert "bottleneck" in shown and "lower bound" in shown and "gap" in shown
    assert "step of 4 microbatches (GPipe, simulated)" in shown


def test_inspect_stage_prints_source_with_inputs_and_outputs(partitioned, capsys):
    manifest = json.loads((partitioned.out / "manifest.json").read_text())
    assert main(["inspect", str(partitioned.out), "--stage", "1"]) == 0
    shown = capsys.readouterr().out
    entry = manifest["ranks"][1]
    assert shown.count("class Stage(") == 1
    assert all(f"#   {v['name']} : " in shown for v in entry["inputs"] + entry["outputs"])
    assert shown.endswith((partitioned.out / "rank1" / "stage.py").read_text())


def test_inspect_ir_by_number_or_name(partitioned, capsys):
    assert main(["inspect", str(partitioned.out), "--ir", "4"]) == 0
    by_number = capsys.readouterr().out
    assert main(["inspect", str(partitioned.out), "--ir", "op-cost"]) == 0
    assert capsys.readouterr().out == by_number == (partitioned.out / "ir" / "04-op-cost.txt").read_text()


def test_inspect_json_for_tools(partitioned, capsys):
    assert main(["inspect", str(partitioned.out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    plan = json.loads((partitioned.out / "plan.json").read_text())
    assert data["bottleneck_us"] == plan["bottleneck_us"] and data["gap"] == plan["gap"]
    assert [s["device"] for s in data["stages"]] == [s["device"] for s in plan["stages"]]
    assert max(s["share_of_bottleneck"] for s in data["stages"]) == 1.0
    assert all(s["inputs"] or s["index"] == 0 for s in data["stages"])
    step = data["simulated_step"]
    assert step["schedule"] == "gpipe" and 0 < step["bubble_fraction"] < 1
    assert step["step_us"] >= plan["microbatches"] * plan["bottleneck_us"] - 0.01
    assert [d["name"] for d in data["ir"]][-1] == "partition"
    # "prints it all": every field of plan.json, as it is there (review22: `mode`, `schedule`, `certificate`, ...
    # were missing); `cluster` is its name, `stages` add derived columns to plan.json's.
    assert data["mode"] == plan["mode"] and data["cluster"] == plan["cluster"]["name"]
    assert {k: v for k, v in data.items() if k in plan and k not in ("cluster", "stages")} == {
        k: v for k, v in plan.items() if k not in ("cluster", "stages")}
    assert [{k: s[k] for k in p} for s, p in zip(data["stages"], plan["stages"])] == plan["stages"]


def test_inspect_errors_list_what_exists(partitioned, capsys):
    stages = ", ".join(str(r["stage"]) for r in json.loads((partitioned.out / "manifest.json").read_text())["ranks"])
    assert main(["inspect", str(partitioned.out), "--stage", "9"]) == 2
    assert f"no stage 9 (stages: {stages})" in capsys.readouterr().err
    assert main(["inspect", str(partitioned.out), "--ir", "lowering"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hetpart: error: --ir lowering") and "04 op-cost" in err and "05 partition" in err


def test_a_plan_json_of_other_stages_than_the_manifest_is_refused(partitioned, tmp_path, capsys):
    """plan.json edited with its digest (an unsigned directory): a stage dropped, or one added, a schedule or mode
    edited to an unknown word, is refused by every reader (read_plan) with exit 2; `inspect --stage` of the dropped
    one was an IndexError traceback."""
    import hashlib
    import shutil

    plan = json.loads((partitioned.out / "plan.json").read_text())
    assert len(plan["stages"]) >= 2
    for edit, want in (("drop", "has no stage"), ("add", "stages, manifest.json runs"),
                       ("virtual", "virtual stage(s) per device, manifest.json 1"),
                       # review22: "simulate: unknown schedule 'zz'" naming no file; an edited mode read as inference
                       ("schedule", "plan.json: 'schedule' is 'zz', expected one of gpipe, 1f1b"),
                       ("mode", "plan.json: 'mode' is 'train', expected one of inference, training")):
        out = tmp_path / edit
        shutil.copytree(partitioned.out, out)
        edited = json.loads(json.dumps(plan))
        if edit == "drop":
            edited["stages"].pop()
        elif edit == "virtual":  # each device two stages: not what the manifest runs
            edited["virtual_stages"] = 2
        elif edit in ("schedule", "mode"):
            edited[edit] = {"schedule": "zz", "mode": "train"}[edit]
        else:
            edited["stages"].append({**edited["stages"][-1], "index": len(edited["stages"])})
        text = json.dumps(edited)
        (out / "plan.json").write_text(text)
        manifest = json.loads((out / "manifest.json").read_text())
        manifest["files"]["plan.json"] = hashlib.sha256(text.encode()).hexdigest()
        (out / "manifest.json").write_text(json.dumps(manifest))
        last = str(len(plan["stages"]) - 1)
        for args in ([], ["--json"], ["--stage", last]):
            capsys.readouterr()
            assert main(["inspect", str(out), *args]) == 2, (edit, args)
            err = capsys.readouterr().err
            assert err.startswith("hetpart: error: ") and want in err and "Traceback" not in err, err
        assert main(["export", str(out), "--format", "torchtitan"]) == 2


def test_inspect_into_a_closed_pipe_ends_quietly(partitioned):
    """review22 (NOTE [closed stdout]): `inspect --json | head -1` was a BrokenPipeError traceback, and `inspect | head`
    (rich) said "the model's code called sys.exit(1)", exit 2. The pipe's reader is closed before hetpart starts, so
    its first write fails whatever the timing."""
    import os
    import subprocess
    import sys

    ended = {}
    for extra in (["--json"], []):
        read, write = os.pipe()
        os.close(read)
        try:
            done = subprocess.run([sys.executable, "-P", "-m", "hetpart", "inspect", str(partitioned.out), *extra],
                                  stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
        finally:
            os.close(write)
        ended[" ".join(extra) or "table"] = (done.returncode, done.stderr[-300:])
    assert ended == {"--json": (141, ""), "table": (141, "")}


def test_dump_ir_dir_of_an_earlier_run_keeps_no_dump_of_it(partitioned, tmp_path):
    """review22: a --dump-ir DIR reused after a --tensor-parallel run kept its 05-tensor-parallel.txt and
    06-partition.txt beside the new 05-partition.txt (and a failing run, the earlier run's dumps after the failing
    pass), each passing for this run's. A run now first removes the dumps the marker lists."""
    import shutil

    from tests.report.conftest import MLP

    dumps = tmp_path / "dumps"
    shutil.copytree(partitioned.dump_dir, dumps)
    marker = json.loads((dumps / ".hetpart-dumps").read_text())
    for stale in ("05-tensor-parallel.txt", "06-partition.txt"):  # what a --tensor-parallel 2 run writes there
        (dumps / stale).write_text(f"// ===== IR after {stale[:-4]} =====\n")
        marker["files"].append(stale)
    (dumps / ".hetpart-dumps").write_text(json.dumps(marker))
    assert main(["partition", *MLP, "--cluster", "preset:mixed-4", "--out", str(tmp_path / "out"), "--dump-ir",
                 str(dumps), "--no-pt2"]) == 0
    assert sorted(p.name for p in dumps.iterdir()) == sorted(p.name for p in partitioned.dump_dir.iterdir())
    assert json.loads((dumps / ".hetpart-dumps").read_text()) == json.loads(
        (partitioned.dump_dir / ".hetpart-dumps").read_text())


def test_inspect_stage_of_a_tensor_parallel_plan_names_the_group(tmp_path, capsys):
    """review22: `inspect --stage 1` of a --tensor-parallel 2 plan showed rank 2's file without saying it is TP rank 0
    of ranks 2 and 3, and a stage that does not exist listed the stages once per rank ("stages: 0, 0, 1, 1")."""
    out = tmp_path / "tp"
    assert main(["partition", "zoo:gpt-small", "--set", "n_layer=2", "--set", "n_embd=64", "--set", "vocab_size=128",
                 "--set", "block_size=32", "--seq-len", "16", "--cluster", "preset:cpu-4", "--tensor-parallel", "2",
                 "--no-pt2", "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    last = manifest["ranks"][-1]
    group = [e["rank"] for e in manifest["ranks"] if e["stage"] == last["stage"]]
    assert len(group) == 2
    capsys.readouterr()
    assert main(["inspect", str(out), "--stage", str(last["stage"])]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert head.startswith(f"# rank {group[0]}, stage {last['stage']} of {last['stage'] + 1}, TP rank 0 of 2 "
                           f"(the group's ranks: {group[0]}, {group[1]}): ")
    assert main(["inspect", str(out), "--stage", "7"]) == 2
    stages = ", ".join(map(str, range(last["stage"] + 1)))
    assert f"has no stage 7 (stages: {stages})" in capsys.readouterr().err
    # The dump after the tensor-parallel pass shows what it decided (it was 04-op-cost.txt again): every weight the
    # manifest's mesh splits, with its dim and parts, and the row linears' all-reduces.
    dump = (out / "ir" / "05-tensor-parallel.txt").read_text()
    split = {w: s for group in manifest["mesh"]["tensor_parallel"] for w, s in group["weights"].items()}
    shown = dict(re.findall(r"= weight\((\S+)\)\s+#.* tp2=shard:(\S+)", dump))
    assert shown == {w: f"{s['dim']}" + (f"x{s['chunks']}" if s["chunks"] > 1 else "") for w, s in split.items()}
    assert "tp2=allreduce" in dump and "tp2=split:" in dump
    # review22: no way to print the group's other ranks; --tp-rank R picks one, a bad R says which there are.
    assert main(["inspect", str(out), "--stage", str(last["stage"]), "--tp-rank", "1"]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"# rank {group[1]}, stage {last['stage']} of {last['stage'] + 1}, TP rank 1 of 2 ")
    assert shown.endswith((out / f"rank{group[1]}" / "stage.py").read_text())
    assert (out / f"rank{group[1]}" / "stage.py").read_text() != (out / f"rank{group[0]}" / "stage.py").read_text()
    for argv, want in ((["--stage", "0", "--tp-rank", "2"], f"--tp-rank 2: stage 0 of '{out}' runs on a "
                        "tensor-parallel group of 2 (TP ranks 0..1: ranks 0, 1); pass one of 0..1"),
                       (["--tp-rank", "1"], "--tp-rank 1 goes with --stage K"),
                       (["--stage", "0", "--tp-rank", "-1"], "--tp-rank")):
        assert main(["inspect", str(out), *argv]) == 2, argv
        err = capsys.readouterr().err
        assert want in err and "Traceback" not in err, err


def test_tp_rank_of_a_stage_on_one_device(partitioned, capsys):
    assert main(["inspect", str(partitioned.out), "--stage", "1", "--tp-rank", "0"]) == 0
    assert capsys.readouterr().out.endswith((partitioned.out / "rank1" / "stage.py").read_text())
    assert main(["inspect", str(partitioned.out), "--stage", "1", "--tp-rank", "1"]) == 2
    assert "runs on one device, not a tensor-parallel group" in capsys.readouterr().err


def test_a_file_of_the_artifacts_for_the_directory_says_which_directory(partitioned, capsys):
    """review22: `inspect out/plan.json` said "artifacts directory 'out/plan.json' not found; create it with
    `hetpart partition ... --out out/plan.json`"."""
    for command in (["inspect"], ["export", "--format", "schedule-csv"]):
        assert main([*command, str(partitioned.out / "plan.json")]) == 2
        err = capsys.readouterr().err
        assert "is a file, not an artifacts directory" in err and f"did you mean '{partitioned.out}'?" in err


def test_ir_dumps_are_the_ones_the_manifest_lists(partitioned, tmp_path, capsys):
    """review22: the dumps came from the folder: `--json` listed a file put in ir/ by hand, and `--ir 4` of a deleted
    04-op-cost.txt said "no such IR dump (dumps: ..., 05 partition)" instead of that it is missing."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(partitioned.out, out)
    (out / "ir" / "04-op-cost.txt").unlink()
    (out / "ir" / "07-extra.txt").write_text("not hetpart's\n")
    assert main(["inspect", str(out), "--ir", "4"]) == 2
    assert "ir/04-op-cost.txt' is missing" in capsys.readouterr().err
    assert main(["inspect", str(out), "--json"]) == 0
    listed = sorted(f for f in json.loads((out / "manifest.json").read_text())["files"] if f.endswith(".txt"))
    assert [d["file"] for d in json.loads(capsys.readouterr().out)["ir"]] == listed


def test_a_stage_at_degree_one_beside_tp_groups_names_no_group(tmp_path, capsys):
    """--tensor-parallel a=2,b=1: b's stages each run on one device, and their manifest entries share group None, so
    `inspect --stage` of either said "(the group's ranks: 2, 3)", a group that does not exist."""
    out = tmp_path / "mixed"
    assert main(["partition", "zoo:gpt-small", "--set", "n_layer=4", "--set", "n_embd=32", "--set", "n_head=2",
                 "--set", "vocab_size=64", "--set", "block_size=16", "--seq-len", "8", "--cluster", "preset:mixed-4",
                 "--tensor-parallel", "a=2,b=1", "--no-pt2", "--time-limit", "3", "--out", str(out)]) == 0
    ranks = json.loads((out / "manifest.json").read_text())["ranks"]
    alone = [e for e in ranks if e["tp"]["degree"] == 1]
    assert len(alone) >= 2  # the case: several one-device stages
    capsys.readouterr()
    for e in alone:
        assert main(["inspect", str(out), "--stage", str(e["stage"])]) == 0
        head = capsys.readouterr().out.splitlines()[0]
        assert head.startswith(f"# rank {e['rank']}, stage {e['stage']} of ") and "group's ranks" not in head, head
    grouped = next(e for e in ranks if e["tp"]["degree"] == 2)  # the control: a TP stage still names its group
    assert main(["inspect", str(out), "--stage", str(grouped["stage"])]) == 0
    assert "(the group's ranks: " in capsys.readouterr().out.splitlines()[0]
