"""The optimizer a training run steps: `hetpart run --optimizer sgd|adamw --lr LR` (NOTE [the run's optimizer])."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from hetpart.errors import HetpartError

if TYPE_CHECKING:
    from hetpart.runtime.checkpoint import CheckpointRun
    from hetpart.runtime.launch import RunOptions

# NOTE [the run's optimizer]
# Every rank and --verify's reference step the same optimizer (one place makes it: `OptimizerSpec.make`), so
# the reference is the unpartitioned model trained as the ranks train their parts: SGD (no state) or AdamW
# (torch's defaults: betas (0.9, 0.999), eps 1e-8, weight decay 0.01; two moments and a step per weight,
# what the plan's default --optimizer-bytes-per-param 8 budgets). Both are elementwise, so a weight held
# by several ranks (tied weights, data-parallel pipelines) stays the same on each once its gradient is.
# A checkpoint records the optimizer's type and hyperparameters (checkpoint.py `rank_state`); a resumed run
# steps what the checkpoint was trained with: flags left out are taken from it, flags that differ are
# refused, since one optimizer's state cannot seed another and --verify retrains the reference with one
# optimizer and one lr for every step, the resumed ones included.

# NOTE [verify after AdamW]
# AdamW moves each weight by lr * m / (sqrt(v) + eps), normalised per element: where a gradient cancels to
# about 0 (1e-9 of a gradient of scale 1e-3), float rounding in it (1e-10, from another order of sums: the
# pipeline's microbatches, its stages' backward, the data-parallel all-reduce) changes that move by a
# sizeable part of lr (measured 0.008 lr on zoo:mlp in 2 pipelines), so the weights after an AdamW step are
# not the model's to the verify tolerance. --verify checks the step in two parts instead: each rank's
# gradients against the model's (the rule of NOTE [verify tolerances], before any step), and each rank's
# weights after the step against `OptimizerSpec.stepped`: the same AdamW step replayed from the shipped weights
# on that rank's own gradients (verify.py `REPLAYED`, 1e-6: the same arithmetic on the same numbers). A rank
# that does not step, steps SGD, Adam, another lr, eps or weight decay, steps twice or leaves weights out of its
# optimizer fails. One step cannot tell the betas: bias correction cancels them at step 1. A first
# version compared the weights with the model's plus a slack per element derived from the gradient
# tolerance; a review showed it passed a missing weight decay or plain Adam at lr <= 2e-3 (rev23, 22nd stop).
# The replay needs the step's gradients, which a rank writes for its run's first step only, and the trajectories
# part after it, so --verify checks one AdamW step from the start: `resumed_optimizer` refuses more steps or a
# resume (SGD is linear in the gradient and is checked over any steps and resumes, as issue 21 asks).
OPTIMIZERS = {"sgd": "SGD", "adamw": "AdamW"}  # the --optimizer name -> torch.optim's class (the checkpoint's "type")
DEFAULT = "sgd"
DEFAULT_LR = 1e-3


@dataclass(frozen=True)
class OptimizerSpec:
    name: str = DEFAULT
    lr: float = DEFAULT_LR

    def make(self, params: Any) -> torch.optim.Optimizer:
        """This optimizer over `params` (NOTE [the run's optimizer])."""
        return getattr(torch.optim, OPTIMIZERS[self.name])(params, lr=self.lr)

    def worker_args(self) -> list[str]:
        return ["--optimizer", self.name, "--lr", repr(self.lr)]

    @property
    def replayed(self) -> bool:
        """Whether --verify checks the weights after a step by replaying it (NOTE [verify after AdamW])."""
        return self.name == "adamw"

    def stepped(self, weight: torch.Tensor, grad: torch.Tensor | None) -> torch.Tensor:
        """`weight` after one step of this optimizer on `grad` (None: no gradient, so no step), from fresh state."""
        p = torch.nn.Parameter(weight.detach().clone())
        if grad is not None:
            p.grad = grad.to(p.dtype)
            self.make([p]).step()
        return p.detach()

    def said(self) -> str:
        return f"{OPTIMIZERS[self.name]} at lr {self.lr:g}"


def run_optimizer(name: str | None, lr: float | None, saved: list[dict[str, Any]] | None = None,
                  where: str = "") -> OptimizerSpec:
    """The run's optimizer from its --optimizer and --lr (None: left out) and, on a resume, the checkpoint's
    ranks' optimizer records `saved` (`{"type", "param_groups"}` each; NOTE [the run's optimizer])."""
    if name is not None and name not in OPTIMIZERS:
        raise HetpartError(f"--optimizer {name}: expected one of {', '.join(OPTIMIZERS)}")
    if lr is not None and not (math.isfinite(lr) and lr > 0):
        raise HetpartError(f"--lr {lr}: expected a positive finite number")
    asked = OptimizerSpec(name or DEFAULT, DEFAULT_LR if lr is None else lr)
    kinds = {r["type"] for r in saved or [] if r.get("type") is not None}
    if not kinds:  # no resume, or a checkpoint of no weights' state
        return asked
    names = {n for n, cls in OPTIMIZERS.items() if cls in kinds}
    if len(kinds) != 1 or len(names) != 1:  # several optimizers' state, or one hetpart does not step
        raise HetpartError(f"checkpoint '{where}' holds {sorted(kinds)} state; `hetpart run` steps "
                           f"{', '.join(OPTIMIZERS.values())}: resume it with the optimizer it was trained with")
    saved_name = names.pop()
    lrs = {g.get("lr") for r in saved for g in r.get("param_groups", [])}
    if len(lrs) > 1:  # the ranks would refuse it too (checkpoint.py `_optimizer_state`), after the launch line
        raise HetpartError(f"checkpoint '{where}': its ranks were trained at different lrs ({sorted(lrs, key=str)}); "
                           "hetpart resumes one: resume from another checkpoint")
    saved_lr = lrs.pop() if lrs else None
    if name is not None and name != saved_name:
        raise HetpartError(f"--optimizer {name}: checkpoint '{where}' was trained with {OPTIMIZERS[saved_name]}; "
                           f"resume with --optimizer {saved_name} (or leave it out), or train from the start")
    if lr is not None and saved_lr is not None and lr != saved_lr:
        raise HetpartError(f"--lr {lr!r}: checkpoint '{where}' was trained at lr {saved_lr!r}; a resumed run steps "
                           f"the checkpoint's lr (--verify retrains the model at one lr): leave --lr out or pass "
                           f"--lr {saved_lr!r}")
    return OptimizerSpec(saved_name, saved_lr if saved_lr is not None else asked.lr)


def resumed_optimizer(opts: RunOptions, run: CheckpointRun | None) -> OptimizerSpec:
    """`run_pipeline`'s hook: the optimizer of the RunOptions `opts`, the checkpoint's where `run` (a
    CheckpointRun or None) resumes one (NOTE [the run's optimizer])."""
    if opts.mode != "training" and (opts.optimizer is not None or opts.lr is not None):
        flag = "--optimizer" if opts.optimizer is not None else "--lr"
        raise HetpartError(f"{flag}: only a training run steps an optimizer; pass --mode training, or leave {flag} "
                           "out")
    saved = None
    if run is not None and run.resume is not None:
        from hetpart.runtime.checkpoint import read_checkpoint

        saved = [r["optimizer"] for r in read_checkpoint(run.resume, check_tensors=False).ranks]
    spec = run_optimizer(opts.optimizer, opts.lr, saved, str(run.resume) if saved is not None else "")
    if opts.verify and spec.replayed and saved is not None:
        raise HetpartError("--verify checks one AdamW step from the start, not a resumed run "
                           "(NOTE [verify after AdamW]): resume without --verify; check the plan with a fresh run "
                           "(no --resume): `--optimizer adamw --steps 1 --verify`, or `--optimizer sgd --verify` over "
                           "any steps")
    if opts.verify and spec.replayed and opts.steps > 1:
        raise HetpartError("--verify checks one AdamW step from the start (NOTE [verify after AdamW]): AdamW turns "
                           "float rounding in a gradient that cancels to about 0 into a move of up to the lr, which "
                           "later steps spread to every weight; pass --steps 1, or verify the plan with --optimizer "
                           "sgd over any steps")
    return spec
