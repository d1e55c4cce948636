"""manifest.json's mesh: stage -> ranks and the process groups of each rank (NOTE [the mesh])."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from hetpart.codegen.artifacts import mesh
from hetpart.errors import HetpartError
from hetpart.runtime.artifacts import _check_mesh

PATH = Path("art/manifest.json")


def _ranks(n: int) -> list[dict]:
    return [{"rank": k, "stage": k} for k in range(n)]


def test_the_mesh_gives_each_stage_its_rank_and_each_shared_weight_its_group():
    m = mesh([["wte.weight", "h.0"], ["h.1"], ["h.2", "head.bias", "wte.weight"], ["head.bias"]])
    assert m["stages"] == [[0], [1], [2], [3]]
    assert m["groups"] == [
        {"name": "pipeline", "kind": "pipeline", "ranks": [0, 1, 2, 3]},
        {"name": "weights-0", "kind": "weights", "ranks": [0, 2], "weights": ["wte.weight"]},
        {"name": "weights-1", "kind": "weights", "ranks": [2, 3], "weights": ["head.bias"]},
    ]
    assert m["rank_groups"] == [["pipeline", "weights-0"], ["pipeline"], ["pipeline", "weights-0", "weights-1"],
                                ["pipeline", "weights-1"]]
    _check_mesh(PATH, m, _ranks(4))  # what codegen writes, the loader reads


def test_weights_held_by_the_same_ranks_share_one_group():
    m = mesh([["a", "b"], ["a", "b", "c"]])
    assert [g for g in m["groups"] if g["kind"] == "weights"] == [
        {"name": "weights-0", "kind": "weights", "ranks": [0, 1], "weights": ["a", "b"]}]


def _edit(m: dict, how) -> dict:
    m = copy.deepcopy(m)
    how(m)
    return m


@pytest.mark.parametrize(("how", "message"), [
    (lambda m: m.pop("rank_groups"), "needs a 'mesh' with stages, groups and rank_groups"),
    (lambda m: m["stages"].__setitem__(1, [0]), "every rank in one stage"),
    (lambda m: m["stages"].reverse(), "ranks[0] runs stage 0, which mesh.stages does not give rank 0"),
    (lambda m: m["groups"][0].update(ranks=[0, 2]), "one pipeline group holding one rank of each stage"),
    (lambda m: m["groups"].append(dict(m["groups"][1])), "uniquely named"),
    (lambda m: m["groups"][1].update(ranks=[0, 7]), "uniquely named pipeline or weights groups of ranks"),
    (lambda m: m["rank_groups"][1].append("weights-0"), "mesh.rank_groups must list the groups holding each rank"),
])
def test_an_edited_mesh_is_refused(how, message):
    good = mesh([["w"], [], ["w"]])
    with pytest.raises(HetpartError, match="the manifest was edited or truncated") as err:
        _check_mesh(PATH, _edit(good, how), _ranks(3))
    assert message in str(err.value)
