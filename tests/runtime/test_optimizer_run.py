"""`hetpart run --optimizer adamw --lr LR` (NOTE [the run's optimizer]): two data-parallel pipelines train 2 AdamW
steps with a checkpoint (the moments and step of every weight in it), one device is lost, `hetpart replan`
re-plans, and 2 resumed steps with --verify equal 4 uninterrupted AdamW steps of the unpartitioned model; a
resume that names another optimizer or lr is refused before any rank starts. Two torchrun launches."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from hetpart.errors import HetpartError
from hetpart.cli import main
from hetpart.runtime.optimizers import OptimizerSpec, run_optimizer
from hetpart.runtime.verify import Tolerances, check_tensor, reference_training
from tests.runtime.test_spot_pipelines import FAST3, GROUPS, MLP


def test_adamw_pipelines_verify_one_step_checkpoint_and_resume(tmp_path, capsys):
    old, new, ck, cluster = tmp_path / "old", tmp_path / "new", tmp_path / "ck", tmp_path / "fast3.toml"
    cluster.write_text(FAST3)
    assert main(["partition", *MLP, "--cluster", str(cluster), "--pipelines", GROUPS, "--out", str(old)]) == 0
    adamw = ["--mode", "training", "--optimizer", "adamw", "--lr", "0.01"]
    # One AdamW step checked: outputs, gradients and loss strictly, the weights after it with the slack.
    assert main(["run", str(old), *adamw, "--steps", "1", "--verify"]) == 0
    ran = capsys.readouterr().out
    assert "training with gpipe and AdamW at lr 0.01," in ran and "verify: PASS" in ran, ran
    assert "max_weight_rel_err=" in ran and "weight elements within their slack only" in ran, ran
    # 4 uninterrupted steps with a checkpoint at 2 and 4, then 2 resumed from step 2 on the same plan: the
    # resumed run's step 4 is the uninterrupted one's, bit for bit (weights, both moments, the step).
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert main(["run", str(old), *adamw, "--steps", "4", "--checkpoint-every", "2", "--checkpoint-dir",
                 str(whole)]) == 0
    shutil.copytree(whole / "step-000002", part / "step-000002")
    assert main(["run", str(old), "--mode", "training", "--steps", "2", "--resume", str(part / "step-000002"),
                 "--checkpoint-every", "2", "--checkpoint-dir", str(part)]) == 0
    assert "AdamW at lr 0.01" in capsys.readouterr().out  # the checkpoint's, though left out
    for rank in range(3):
        a, b = (load_file(str(d / "step-000004" / f"rank{rank}.safetensors")) for d in (whole, part))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), rank
        assert any(k.endswith("/exp_avg_sq") for k in a), a.keys()
    assert {r["optimizer"]["type"] for r in json.loads((whole / "step-000004" / "checkpoint.json").read_text())[
        "ranks"]} == {"AdamW"}

    # Re-planned onto 2 devices: the moments come from the survivors' files and the run goes on (both moments
    # are sums of gradients, so close to the uninterrupted run's, unlike the weights: NOTE [verify after AdamW]).
    assert main(["replan", str(old), "--lose", "local/2", "--out", str(new)]) == 0
    capsys.readouterr()
    for flags, said in ((["--optimizer", "sgd"], "was trained with AdamW"), (["--lr", "0.1"], "trained at lr 0.01"),
                        (["--verify"], "--verify checks one AdamW step from the start")):
        assert main(["run", str(new), "--mode", "training", "--steps", "2", "--resume", str(whole / "step-000002"),
                     *flags]) == 2
        refused = capsys.readouterr()
        assert said in refused.err and "launching" not in refused.out and "Traceback" not in refused.err, refused
    assert main(["run", str(new), "--mode", "training", "--steps", "2", "--resume", str(whole / "step-000002"),
                 "--checkpoint-every", "2", "--checkpoint-dir", str(ck)]) == 0
    moved = {k: v for r in range(2) for k, v in load_file(str(ck / "step-000004" / f"rank{r}.safetensors")).items()}
    kept = {k: v for r in range(3) for k, v in load_file(str(whole / "step-000004" / f"rank{r}.safetensors")).items()}
    moments = [k for k in moved if k.endswith("/exp_avg_sq")]
    assert moments and all(torch.allclose(moved[k], kept[k], rtol=1e-3, atol=1e-12) for k in moments)


def test_the_slack_after_adamw_takes_rounding_not_a_wrong_step():
    """NOTE [verify after AdamW] against its negative controls: the same AdamW step with its microbatches summed in
    another grouping (rounding only) fails the strict rule on a few weights and passes with the slack; no step,
    an SGD step and a step at another lr fail with it."""
    torch.manual_seed(0)
    layers = [m for _ in range(4) for m in (torch.nn.Linear(256, 256), torch.nn.ReLU())]
    x, target = torch.randn(48, 256), torch.randn(48, 10)

    def trained(spec: OptimizerSpec, microbatches: int = 6):
        torch.manual_seed(1)
        model = torch.nn.Sequential(*copy.deepcopy(layers), torch.nn.Linear(256, 10))
        return reference_training(model, (x,), target, microbatches, 1, spec, 1)

    ref = trained(OptimizerSpec("adamw", 0.01))

    def passes(weights, slack=True) -> bool:
        return all(check_tensor(n, weights[n], ref.weights[n], Tolerances(), robust=False,
                                slack=ref.slack[n] if slack else None).ok for n in ref.weights)

    regrouped = trained(OptimizerSpec("adamw", 0.01), microbatches=3).weights
    assert not passes(regrouped, slack=False) and passes(regrouped)
    torch.manual_seed(1)
    initial = dict(torch.nn.Sequential(*copy.deepcopy(layers), torch.nn.Linear(256, 10)).named_parameters())
    assert not passes({n: w.detach() for n, w in initial.items()})
    assert not passes(trained(OptimizerSpec("sgd", 0.01)).weights)
    assert not passes(trained(OptimizerSpec("adamw", 0.011)).weights)


SAVED = [{"type": "AdamW", "param_groups": [{"lr": 0.01, "betas": [0.9, 0.999]}]}]


@pytest.mark.parametrize("name, lr, saved, expected", [
    (None, None, None, OptimizerSpec("sgd", 1e-3)),
    ("adamw", 0.5, None, OptimizerSpec("adamw", 0.5)),
    (None, None, SAVED, OptimizerSpec("adamw", 0.01)),  # a resume: the checkpoint's
    ("adamw", 0.01, SAVED, OptimizerSpec("adamw", 0.01)),
    (None, 0.2, [{"type": None, "param_groups": []}], OptimizerSpec("sgd", 0.2)),  # ranks without weights
])
def test_the_runs_optimizer(name, lr, saved, expected):
    assert run_optimizer(name, lr, saved, "ck") == expected


@pytest.mark.parametrize("name, lr, saved, said", [
    ("sgd", None, SAVED, "--optimizer sgd: checkpoint 'ck' was trained with AdamW; resume with --optimizer adamw"),
    (None, 0.1, SAVED, "--lr 0.1: checkpoint 'ck' was trained at lr 0.01"),
    (None, None, [{"type": "Adagrad", "param_groups": []}], "holds ['Adagrad'] state"),
    (None, float("nan"), None, "--lr nan: expected a positive finite number"),
    ("lion", None, None, "--optimizer lion: expected one of sgd, adamw"),
])
def test_the_runs_optimizer_refused(name, lr, saved, said):
    with pytest.raises(HetpartError) as err:
        run_optimizer(name, lr, saved, "ck")
    assert said in str(err.value)


def test_an_optimizer_in_inference_is_refused(tmp_path, capsys):
    out = tmp_path / "mlp"
    assert main(["partition", *MLP[:-2], "--cluster", "preset:cpu-2", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["run", str(out), "--lr", "0.1"]) == 2
    refused = capsys.readouterr()
    assert "--lr: only a training run steps an optimizer; pass --mode training" in refused.err
    assert "launching" not in refused.out and "Traceback" not in refused.err
