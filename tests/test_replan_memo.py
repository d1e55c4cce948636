"""NOTE [shape memo] through the CLI: `partition --parallel data` writes ir/shapes.json (listed and hashed by the
manifest), `hetpart replan` starts its search from it and writes the memo again into NEW_DIR, and a changed
ir/shapes.json is refused (an artifacts directory is code)."""

from __future__ import annotations

import json

from hetpart.cli import main

MLP = ["zoo:mlp", "--set", "hidden=64", "--set", "n_blocks=3", "--batch-size", "24", "--microbatches", "6",
       "--no-pt2", "--mode", "training", "--parallel", "data", "--time-limit", "5"]


def test_replan_starts_from_the_memo_and_a_changed_memo_is_refused(tmp_path, capsys):
    old, new = tmp_path / "old", tmp_path / "new"
    assert main(["partition", *MLP, "--cluster", "preset:mixed-4", "--out", str(old)]) == 0
    memo = json.loads((old / "ir" / "shapes.json").read_text())
    assert "ir/shapes.json" in json.loads((old / "manifest.json").read_text())["files"]
    assert memo["plans"] and len(memo["fingerprint"]) == 64
    capsys.readouterr()

    assert main(["replan", str(old), "--lose", "b/1", "--out", str(new), "--time-limit", "3"]) == 0
    out = capsys.readouterr().out
    assert "another problem's" not in out and "the from-scratch search started from" in out, out
    again = json.loads((new / "ir" / "shapes.json").read_text())
    assert again["fingerprint"] == memo["fingerprint"]  # the same model and costs: the memo carries on
    assert set(memo["plans"]) <= set(again["plans"])
    assert "ir/shapes.json" in json.loads((new / "manifest.json").read_text())["files"]
    for plan in (json.loads((d / "plan.json").read_text()) for d in (old, new)):  # the cut parts, in words and listed
        note = plan["bound_note"]  # a loaded machine can cut the whole bound ("did not finish") or parts of it
        cut = "(past the deadline)" in note or "did not finish before the deadline" in note
        assert cut == bool(plan.get("bound_unfinished")), note

    path = old / "ir" / "shapes.json"
    path.write_text(path.read_text().replace('"m_ref":', '"m_ref": ', 1))
    assert main(["replan", str(old), "--lose", "b/1", "--out", str(tmp_path / "new2"), "--time-limit", "3"]) == 2
    assert "shapes.json' does not match its sha256 in manifest.json" in capsys.readouterr().err


def test_partition_with_max_tensor_parallel_writes_the_kept_degrees_shapes(tmp_path):
    """`--parallel data --max-tensor-parallel 2`: ir/shapes.json holds the shapes the kept degree's search solved, of
    the problem ir/analysis.json stores (each degree's search has its own memo), what `hetpart replan` plans from
    (it was not written on this path before)."""
    from hetpart.partitioner.problem_json import problem_from_json
    from hetpart.partitioner.shape_memo import problem_fingerprint

    old = tmp_path / "old"
    assert main(["partition", "zoo:gpt-small", "--set", "n_layer=2", "--set", "n_embd=64", "--set", "vocab_size=128",
                 "--set", "block_size=32", "--batch-size", "8", "--seq-len", "16", "--microbatches", "4", "--no-pt2",
                 "--mode", "training", "--max-tensor-parallel", "2", "--parallel", "data", "--time-limit", "6",
                 "--cluster", "preset:cpu-8", "--out", str(old)]) == 0
    memo = json.loads((old / "ir" / "shapes.json").read_text())
    stored = problem_from_json(json.loads((old / "ir" / "analysis.json").read_text())["problem"])
    assert memo["plans"] and memo["fingerprint"] == problem_fingerprint(stored, 4)
    assert "ir/shapes.json" in json.loads((old / "manifest.json").read_text())["files"]
