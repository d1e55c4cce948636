"""NOTE [checkpoint slices] without torchrun: a new rank's part assembled from old ranks' shards equals the part
cut from the full tensor with torch.narrow/cat (random shapes, degrees, dims, fused chunks, replicated holders),
reads only its own elements, and a wrong slice or a tampered shard file is caught; TP checkpoints of weights
and Adam state resume as TP (same or another degree), whole, and from whole; a rank of several stages
(virtual stages) saves and resumes all of them."""

from __future__ import annotations

import random
import shutil

import pytest
import torch

from hetpart.errors import HetpartError
from hetpart.runtime.checkpoint import (
    finish_checkpoint, load_rank, part_layouts, rank_state, read_checkpoint, save_rank,
)
from hetpart.runtime.checkpoint_slices import (
    Layout, SliceRead, assemble, needed_layout, plan_reads, saved_layouts, shard_layout,
)
from hetpart.runtime.schedules import RankStages
from hetpart.shards import WeightShard, shard_tensor

MODEL = {"model": "zoo:mlp", "overrides": {}, "seed": 0}
DATA = {"batch_size": 8, "seq_len": 1, "seed": 0, "microbatches": 2}


def _narrowed(full: torch.Tensor, dim: int, chunks: int, rank: int, degree: int) -> torch.Tensor:
    """Rank `rank`'s part by the definition: of each of the `chunks` equal parts along `dim`, its 1/degree."""
    size = full.shape[dim] // (chunks * degree)
    return torch.cat([full.narrow(dim, c * size * degree + rank * size, size) for c in range(chunks)], dim=dim)


def _config(rng: random.Random, shape: list[int]) -> dict[str, int] | None:
    """A random split of `shape` (None: replicated) whose dim divides evenly."""
    options = [(d, c, t) for d, n in enumerate(shape) for c in (1, 2, 3) for t in (1, 2, 3, 4) if n % (c * t) == 0]
    if rng.random() < 0.2:
        return None
    d, c, t = rng.choice(options)
    return {"dim": d, "chunks": c, "degree": t}


def test_assembled_parts_equal_narrow_and_cat_of_the_full_tensor_on_random_splits():
    rng, checked = random.Random(0), 0
    for case in range(60):
        shape = [rng.choice([6, 12, 24]) for _ in range(rng.choice([1, 2, 3]))]
        full = torch.randn(shape, generator=torch.Generator().manual_seed(case))
        old, new = _config(rng, shape), _config(rng, shape)
        holders = []
        if old is None or rng.random() < 0.3:  # a replicated holder, somewhere in the preference order
            holders.append(("whole", Layout(tuple(shape))))
        files = {"whole": full}
        for r in range(old["degree"] if old else 0):
            spec = {**old, "rank": r}
            files[f"rank{r}"] = shard_tensor(full, WeightShard(old["dim"], old["chunks"]), r, old["degree"])
            holders.insert(rng.randrange(len(holders) + 1), (f"rank{r}", shard_layout(tuple(shape), spec)))
        for r in range(new["degree"] if new else 1):
            need = shard_layout(tuple(shape), {**new, "rank": r} if new else None)
            reads = plan_reads("weight/w", need, holders)
            got = assemble(need, reads, lambda f: files[f])
            want = _narrowed(full, new["dim"], new["chunks"], r, new["degree"]) if new else full
            assert torch.equal(got, want), (case, shape, old, new, r)
            # Only its own elements are read, each once: never the full tensor for a shard.
            assert sum(files[x.file][x.src].numel() for x in reads) == want.numel()
            # Negative control: one slice moved by one element (where it can move) gives another tensor.
            shifts = [(i, x, -1 if sl.start > 0 else 1) for x in reads for i, sl in enumerate(x.src)
                      if sl.start > 0 or sl.stop < files[x.file].shape[i]]
            if shifts:
                i, x, by = shifts[0]
                src = x.src[:i] + (slice(x.src[i].start + by, x.src[i].stop + by),) + x.src[i + 1:]
                wrong = [SliceRead(x.file, src, x.dst) if y is x else y for y in reads]
                assert not torch.equal(assemble(need, wrong, lambda f: files[f]), want)
                checked += 1
    assert checked > 40  # the negative control ran on most cases


def test_a_part_no_old_rank_holds_and_a_bad_layout_are_refused():
    shape = (8, 4)
    half = shard_layout(shape, {"dim": 0, "chunks": 1, "rank": 0, "degree": 2})
    assert half == Layout(shape, 0, ((0, 4),)) and half.local_shape() == (4, 4)
    assert shard_layout((12,), {"dim": 0, "chunks": 3, "rank": 1, "degree": 2}).pieces == ((2, 4), (6, 8), (10, 12))
    with pytest.raises(HetpartError, match=r"no old rank holds weight/w\[4:8, 0:4\]"):
        plan_reads("weight/w", Layout(shape), [("rank0", half)])
    with pytest.raises(HetpartError, match="a checkpoint of another model"):
        plan_reads("weight/w", Layout((8, 5)), [("rank0", Layout(shape))])
    with pytest.raises(HetpartError, match="slices"):
        Layout.from_json({"shape": [8, 4], "dim": 0, "slices": [[4, 9]]}, "here")
    assert Layout.from_json(half.to_json(), "here") == half
    assert needed_layout("optimizer/w/odd", Layout((3,)), {"w": {"dim": 0, "chunks": 1, "rank": 0, "degree": 2}},
                         shape) == Layout((3,))  # not of the weight's shape: whole
    assert needed_layout("optimizer/w/exp_avg", Layout(shape), {"w": {"dim": 0, "chunks": 1, "rank": 0,
                                                                      "degree": 2}}, shape) == half
    with pytest.raises(HetpartError, match="optimizer state optimizer/w/odd is \\[3\\]"):
        saved_layouts({"weight/w": torch.zeros(4, 4), "optimizer/w/odd": torch.zeros(3)},
                      {"w": {"dim": 0, "chunks": 1, "rank": 0, "degree": 2}})


class _Pair(torch.nn.Module):
    """fc1 (column-split: weight and bias on dim 0) then fc2 (row-split: weight on dim 1), `rows` wide."""

    def __init__(self, rows: int, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = torch.nn.Linear(4, rows)
        self.fc2 = torch.nn.Linear(rows, 3)


NAMES = {"fc1.weight": "fc1.weight", "fc1.bias": "fc1.bias", "fc2.weight": "fc2.weight", "fc2.bias": "fc2.bias"}
SPLIT = {"fc1.weight": (0, 1), "fc1.bias": (0, 1), "fc2.weight": (1, 1)}


def _shards(rank: int, degree: int) -> dict[str, dict[str, int]]:
    return {} if degree == 1 else {n: {"dim": d, "chunks": c, "rank": rank, "degree": degree}
                                   for n, (d, c) in SPLIT.items()}


def _shard_state(full: dict[str, torch.Tensor], rank: int, degree: int) -> dict[str, torch.Tensor]:
    return {k: _narrowed(v, *SPLIT[k], rank, degree) if k in SPLIT and degree > 1 else v.clone()
            for k, v in full.items()}


def _stepped(module: torch.nn.Module, grads: list[dict[str, torch.Tensor]]) -> torch.optim.Optimizer:
    """Adam stepped with `grads` (one table per step): exp_avg, exp_avg_sq and step are real state."""
    opt = torch.optim.Adam(module.parameters(), lr=0.1)
    for step in grads:
        for attr, p in module.named_parameters():
            p.grad = step[attr]
        opt.step()
    return opt


def _save(ck, modules: list[torch.nn.Module], opts, degree: int):
    for r, (m, opt) in enumerate(zip(modules, opts)):
        tensors, state = rank_state(m, opt, NAMES, list(m.parameters()))
        save_rank(ck, 2, "t", r, {"planned_device": f"local/{r}", "machine": "local"}, tensors, state,
                  _shards(r, degree))
    return finish_checkpoint(ck, 2, "t", len(modules), DATA, MODEL, keep=None)


@pytest.mark.parametrize("old,new", [(2, 2), (2, 1), (1, 2), (2, 3)])
def test_tp_checkpoints_of_weights_and_adam_state_resume_under_another_degree(tmp_path, old, new):
    whole = _Pair(6, 0)
    g = torch.Generator().manual_seed(1)
    grads = [{k: torch.randn(p.shape, generator=g) for k, p in whole.named_parameters()} for _ in range(2)]
    full = {k: v.detach().clone() for k, v in whole.state_dict().items()}
    modules, opts = [], []
    for r in range(old):  # each old TP rank steps its shards with its shards of the gradients
        m = _Pair(6 // old, 1)
        m.load_state_dict(_shard_state(full, r, old))
        modules.append(m)
        opts.append(_stepped(m, [_shard_state(step, r, old) for step in grads]))
    whole_opt = _stepped(whole, grads)  # Adam is elementwise: the shards' state is the whole one's, cut
    full = {k: v.detach() for k, v in whole.state_dict().items()}
    avg = {k: whole_opt.state[p]["exp_avg"] for k, p in whole.named_parameters()}
    path = _save(tmp_path, modules, opts, old)
    ckpt = read_checkpoint(path)
    if old > 1:
        assert ckpt.ranks[1]["layout"]["weight/fc2.weight"] == {"shape": [3, 6], "dim": 1, "slices": [[3, 6]]}
        assert ckpt.ranks[1]["layout"]["optimizer/fc2.weight/exp_avg"]["slices"] == [[3, 6]]
        assert ckpt.ranks[1]["layout"]["optimizer/fc2.weight/step"] == {"shape": [], "replicated": True}
    for r in range(new):
        fresh = _Pair(6 // new, 5)
        opt = torch.optim.Adam(fresh.parameters(), lr=0.1)
        load_rank(ckpt, {"rank": r, "planned_device": f"local/{r}", "machine": "local"}, fresh, opt, NAMES,
                  list(fresh.parameters()), _shards(r, new))
        want = _shard_state(full, r, new)
        assert all(torch.allclose(fresh.state_dict()[k], want[k], rtol=1e-6, atol=0) for k in want), (old, new, r)
        want_avg = _shard_state(avg, r, new)
        for attr, p in fresh.named_parameters():
            state = opt.state[p]
            assert torch.allclose(state["exp_avg"], want_avg[attr], rtol=1e-6, atol=0)
            assert state["exp_avg_sq"].shape == p.shape
            assert state["step"].dim() == 0 and float(state["step"]) == 2.0  # a scalar counter, not a shard
    if old == 1:  # a format-1 part (no `layout`): every tensor whole, its shape from the file's header
        v1 = part_layouts(ckpt, {k: v for k, v in ckpt.ranks[0].items() if k != "layout"})
        assert v1 == {k: Layout(tuple(v["shape"])) for k, v in ckpt.ranks[0]["layout"].items()}
    # A changed byte in one shard file is refused when a rank opens it.
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    data = bytearray((bad / "rank0.safetensors").read_bytes())
    data[-1] ^= 1
    (bad / "rank0.safetensors").write_bytes(bytes(data))
    fresh = _Pair(6 // new, 5)
    with pytest.raises(HetpartError, match="'rank0.safetensors' has sha256"):
        load_rank(read_checkpoint(bad, check_tensors=False), {"rank": 0, "planned_device": "local/0",
                  "machine": "local"}, fresh, None, NAMES, list(fresh.parameters()), _shards(0, new))


def test_a_rank_of_several_stages_saves_and_resumes_all_of_them(tmp_path):
    def stages(seed: int) -> RankStages:
        torch.manual_seed(seed)
        return RankStages([torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)],
                          [{"weight": "blocks.0.weight", "bias": "blocks.0.bias"},
                           {"weight": "blocks.2.weight", "bias": "blocks.2.bias"}])

    rank = stages(0)
    opt = torch.optim.SGD(rank.parameters(), lr=0.1, momentum=0.9)
    for p in rank.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    names = rank.weight_names()
    tensors, state = rank_state(rank, opt, names, list(rank.parameters()))
    assert sorted(k for k in tensors if k.startswith("weight/")) == [
        "weight/blocks.0.bias", "weight/blocks.0.weight", "weight/blocks.2.bias", "weight/blocks.2.weight"]
    save_rank(tmp_path, 1, "t", 0, {"planned_device": "local/0", "machine": "local"}, tensors, state)
    ckpt = read_checkpoint(finish_checkpoint(tmp_path, 1, "t", 1, DATA, MODEL, keep=None))
    fresh = stages(7)
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    load_rank(ckpt, {"rank": 0, "planned_device": "local/0", "machine": "local"}, fresh, fresh_opt,
              fresh.weight_names(), list(fresh.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(rank.state_dict().values(), fresh.state_dict().values()))
    for p, q in zip(rank.parameters(), fresh.parameters()):
        assert torch.equal(opt.state[p]["momentum_buffer"], fresh_opt.state[q]["momentum_buffer"])
