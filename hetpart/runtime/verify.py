"""`hetpart run --verify`: the pipeline's outputs (and gradients) against the unpartitioned model's.

    >>> ref = torch.tensor([1.0, -2.0, 0.0])
    >>> check_tensor("logits", ref + 1e-7, ref, Tolerances()).ok
    True
    >>> check_tensor("logits", ref * (1 + 1e-3), ref, Tolerances()).ok
    False
    >>> tiny = ref * 1e-10  # an absolute 1e-5 would pass any output this small
    >>> check_tensor("logits", tiny * (1 + 1e-2), tiny, Tolerances()).ok
    False
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils import _pytree as pytree

from hetpart.runtime.optimizers import OptimizerSpec

# NOTE [verify tolerances]
# An output (or a weight's gradient) passes iff every element satisfies
#     |pipeline - model| <= atol * scale + rtol * |model|
# (numpy's allclose, with the absolute term in units of the tensor's own scale: `output_scale`,
# the largest finite |model| element that is not an outlier far above the rest, see below).
# - Why scaled: fp32 rounding in a sum of products is relative to the size of its terms, not
#   of its result, so an element that cancels to near 0 carries an error of the tensor's
#   scale; an absolute 1e-5 then fails correct plans whose outputs are large (by that
#   reasoning, logits of magnitude 1e3 round by ~1e-4) and passes anything whose outputs
#   are small (mobilenet_v3 and efficientnet at random init give ~1e-10, issue 17: a wrong
#   plan is also within 1e-5 of them).
#   Scaled, a 1e-10 output with a 1% error fails like a 1-sized one does.
# - Defaults atol = rtol = 1e-5: fp32 has 24 bits (eps 6e-8). With the reference computing
#   on the ranks' thread count (`reference_outputs`), the pipeline runs the same
#   kernels, on microbatches, whose reductions may be blocked differently. Measured on this
#   2-core VM: max_rel_err 0 for zoo:resnet at base_width 96-128, a zoo:llama layer at dim
#   1024 and the 6-layer MLP of tests/runtime/test_verify.py on two ranks; 1.2e-7 for a
#   2-layer MLP of width 16 (microbatches of 2 against the batch of 8): 80x below the
#   tolerance. The 6-layer MLP with one weight of rank 1 scaled by 1 + 1e-3 is off by 5.9e-5
#   (logits) and 1.6e-4 (features) of the scale: 6-16x above it. (Half-precision models
#   will need larger --rtol/--atol; not measured.)
#   On this VM the reference gave the same outputs at 2 and at 8 threads; issue 17's resnet50
#   (3.05e-05) and hf:llama (2.24e-05) differed only with the machine's threads, and
#   `OMP_NUM_THREADS=1` gave 0 there.
# - "Tiny": where max|model| <= atol, an absolute tolerance would pass an all-zero pipeline
#   output; the scaled one does not, and the report says the output was compared relative to
#   its own scale (`TensorCheck.tiny`).
# - Below the smallest normal float (finfo.tiny: identically 0, or subnormal with fewer
#   than 24 bits left) there is no scale to compare relative to: such an output proves
#   nothing. If the pipeline's is as small, the verdict is CANNOT TELL (exit 1, not PASS)
#   when every output is so; a pipeline output that is not that small fails.
# - Non-finite model elements (a -inf mask, a NaN) must be matched exactly: inf by the same
#   inf, NaN by NaN. The rule above cannot judge them (rtol * inf passes any finite value),
#   and they do not enter the scale.
# - The scale is robust to outliers. Masked logits hold a fill of 1e9 (or finfo.min) in part
#   of the tensor; with max|model| as the scale, atol * 1e9 = 1e4 would pass every other
#   element however wrong (issue 17). `output_scale` sorts the nonzero finite |model| and
#   starts at the lower quartile (the bulk of the values, so a fill of up to 3/4 of them is
#   left out), then climbs the sorted magnitudes while each is within OUTLIER_GAP (100x) of
#   the one before; the scale is the last one reached. A tensor with no such gap (any
#   output of a sum of products: gaussian-like, or with outlier features that grow
#   continuously out of the bulk) gets max|model| exactly as before, so the measurements
#   below are unchanged; a fill 100x above everything else is left out. What is left: a fill
#   covering more than 3/4 of the nonzero elements is the scale (then the bulk is the fill);
#   an output whose values really are two clusters 100x apart is compared at the lower
#   cluster's scale, which is stricter (a FAIL to look at, never a PASS by accident).
# - Gradients, the weights after the steps and the losses are compared at max|model| (no
#   outlier step: they hold no mask fills). A gradient is a sum over microbatches (and over
#   pipelines and tied copies, NOTE [pipelines gradients] in worker.py) that the pipeline adds
#   in another order than the model, so it rounds relative to its terms; and a block of it may
#   cancel to noise: the key bias of attention gets no gradient in exact arithmetic (softmax
#   ignores it), ~1e-9 in fp32, a third of `qkv.bias`. The outlier step would take that
#   block's 1e-9 for the scale and fail sums that agree to 6e-8 of a 0.45 gradient (measured
#   on two pipelines of a 4-layer GPT, 12 microbatches); at max|model| they pass, and a
#   gradient scaled or summed wrongly is still off by a fraction of max|model|.
# Integer and bool outputs must be equal.

# NOTE [every held weight checked]
# In training each rank writes the gradients (and, after the last step, the values) of the weights its
# stages hold, and --verify compares every tensor written against the model's. What a rank did NOT write
# would be compared nowhere: a stage whose weights got no gradient under a schedule (so the optimizer
# never moved them) printed max_grad_rel_err=0 and was caught only by the weights after the step. So
# each weight the manifest gives a rank (`rank_weights`: its stages, virtual ones included) for which the
# model has a gradient (or value) must be in that rank's file; each one missing is a failed check named
# "<weight> (rank r)", and the verdict is FAIL.
# NOTE [verify a resume]
# A resumed run (`run --resume CK --verify`) is compared with the model trained from the same initial weights for
# the checkpoint's steps plus the run's. That alone could not tell a resume that loaded the checkpoint from one that
# loaded nothing and trained from the initial weights: where the steps before the checkpoint move every weight by
# less than the tolerance (a small lr, few steps; measured on zoo:llama on 2 ranks, 1 step at lr 1e-4: 6e-7 of the
# scale), the restarted pipeline is within the tolerance of the model too, and --verify said PASS (review23). So
# each rank also writes the weights it holds right after the resume (worker.py, `resumed<rank>.safetensors`), and
# they are compared with the model's after the checkpoint's steps, by the rule above. And the reference asks
# whether the checks could tell at all: a resume that loaded nothing would give the model's own first steps from
# the initial weights (its weights before them, the gradients of step 0, the losses of steps 0.., the weights
# after the run's count of steps), which `reference_training` compares with the resumed run's by the same rules.
# Where every one of them passes, the verdict is CANNOT TELL, exit 1: a resume that loaded nothing would pass too.
OUTLIER_GAP = 100.0
VERIFY_RTOL = 1e-5
VERIFY_ATOL = 1e-5


@dataclass(frozen=True)
class Tolerances:
    rtol: float = VERIFY_RTOL  # of each element's |model|
    atol: float = VERIFY_ATOL  # of the tensor's scale, max|model| less outliers (NOTE [verify tolerances])

    def describe(self) -> str:
        return f"|pipeline - model| <= {self.atol:g} * scale + {self.rtol:g} * |model| elementwise"


@dataclass(frozen=True)
class TensorCheck:
    """One output or gradient compared: the numbers the report prints."""

    name: str  # `logits`, `output 0`, `lm_head.weight (rank 1)`
    max_abs_diff: float
    scale: float  # max |model| less outliers (`output_scale`)
    max_rel_err: float  # max_abs_diff / scale (0 where both are 0, inf where only the model's is)
    ok: bool  # every element within its tolerance
    tiny: bool = False  # 0 < scale <= atol: compared relative to its own scale
    unreadable: bool = False  # the model's and the pipeline's are both below the smallest normal float
    problem: str | None = None  # a shape or dtype that differs

    def describe(self) -> str:
        text = f"{self.name}: max_abs_diff={self.max_abs_diff:.3g} max_rel_err={self.max_rel_err:.3g}"
        return text + (f" (scale {self.scale:.3g})" if self.scale else "") + (f": {self.problem}" if self.problem else "")


def output_scale(ref: torch.Tensor, robust: bool = True) -> float:
    """The tensor's scale for the absolute term: its largest finite |element| that is not an
    outlier far above the rest (NOTE [verify tolerances]); 0 where no element is finite and nonzero.

    >>> output_scale(torch.tensor([0.5, -2.0, 1.0, float("-inf")]))
    2.0
    >>> output_scale(torch.tensor([0.5, -2.0, 1.0, 1e9]))  # a mask fill is left out
    2.0
    """
    if not robust:  # gradients, weights, losses: max|model| (NOTE [verify tolerances]); no sort needed
        finite = ref.detach().abs().flatten()
        finite = finite[finite.isfinite()]
        return float(finite.max()) if finite.numel() else 0.0
    magnitudes = ref.detach().double().abs().flatten()
    magnitudes = magnitudes[magnitudes.isfinite() & (magnitudes > 0)].sort().values
    if not magnitudes.numel():
        return 0.0
    start = (magnitudes.numel() - 1) // 4  # the lower quartile: inside the bulk
    gaps = (magnitudes[start + 1:] > OUTLIER_GAP * magnitudes[start:-1]).nonzero()
    return float(magnitudes[start + int(gaps[0])] if gaps.numel() else magnitudes[-1])


def check_tensor(name: str, got: torch.Tensor, ref: torch.Tensor, tol: Tolerances, robust: bool = True) -> TensorCheck:
    """`got` against `ref` by NOTE [verify tolerances] (`robust`: the scale leaves outliers out, for outputs)."""
    if got.shape != ref.shape:
        return TensorCheck(name, float("inf"), 0.0, float("inf"), False,
                           problem=f"shape {list(got.shape)}, the model's {list(ref.shape)}")
    if not ref.is_floating_point() and not ref.is_complex():
        equal = torch.equal(got.to(ref.dtype), ref)
        diff = float((got.double() - ref.double()).abs().max()) if got.numel() else 0.0
        return TensorCheck(name, diff, float(ref.double().abs().max()) if ref.numel() else 0.0,
                           0.0 if equal else float("inf"), equal)
    a, b = got.detach().double(), ref.detach().double()
    same = (a == b) | (a.isnan() & b.isnan())  # equal infinities and NaNs where the model has them
    diff = torch.where(same, 0.0, (a - b).abs())
    scale = output_scale(b, robust)
    max_diff = float(diff.max()) if diff.numel() else 0.0
    smallest = torch.finfo(ref.dtype).tiny
    if scale < smallest:  # nothing to compare relative to (NOTE [verify tolerances])
        finite_got = a[a.isfinite()]
        small = not finite_got.numel() or float(finite_got.abs().max()) < smallest
        return TensorCheck(name, max_diff, scale, 0.0 if max_diff == 0 else float("inf"), small, unreadable=small)
    # A non-finite model element passes only where matched exactly (`same`): rtol * inf passes anything.
    ok = bool((same | (b.isfinite() & (diff <= tol.atol * scale + tol.rtol * b.abs()))).all())
    return TensorCheck(name, max_diff, scale, max_diff / scale, ok, tiny=scale <= tol.atol)


@dataclass(frozen=True)
class Verification:
    """Every output (and in training every weight's gradient on every rank, the losses and the weights after
    the last step) compared."""

    outputs: list[TensorCheck]
    grads: list[TensorCheck]
    tolerances: Tolerances
    losses: list[TensorCheck] = field(default_factory=list)  # training: each step's and each microbatch's loss
    weights: list[TensorCheck] = field(default_factory=list)  # training: every copy of every weight after the steps
    replayed: bool = False  # the weights against each rank's step replayed (NOTE [verify after AdamW])
    resumed: list[TensorCheck] = field(default_factory=list)  # --resume: the weights each rank resumed with
    resume_told: bool = True  # --resume: one that loaded nothing would fail the checks (NOTE [verify a resume])

    @property
    def verdict(self) -> str:
        """PASS, FAIL, or CANNOT TELL where every output (or every gradient) is below the smallest normal float."""
        if not all(c.ok for c in self.outputs + self.grads + self.losses + self.weights + self.resumed):
            return "FAIL"
        for group in (self.outputs, self.grads):
            if group and all(c.unreadable for c in group):
                return "CANNOT TELL"
        return "PASS" if self.resume_told else "CANNOT TELL"

    @property
    def max_abs_diff(self) -> float:
        return max((c.max_abs_diff for c in self.outputs), default=0.0)

    @property
    def max_rel_err(self) -> float:
        return max((c.max_rel_err for c in self.outputs), default=0.0)

    @property
    def max_grad_rel_err(self) -> float | None:
        return max((c.max_rel_err for c in self.grads), default=0.0) if self.grads else None

    def report(self) -> list[str]:
        """What `hetpart run --verify` prints: the worst differences, each output where there are
        several (or it failed, or is tiny), and the verdict with its tolerances."""
        lines = [f"max_abs_diff={self.max_abs_diff:.3g} max_rel_err={self.max_rel_err:.3g}"]
        if self.grads:
            lines.append(f"max_grad_rel_err={self.max_grad_rel_err:.3g}")
        if self.losses or self.weights:
            lines.append(f"max_loss_rel_err={max((c.max_rel_err for c in self.losses), default=0.0):.3g} "
                         f"max_weight_rel_err={max((c.max_rel_err for c in self.weights), default=0.0):.3g} "
                         "(after the last step" + ("; AdamW: each rank's step replayed on its own gradients, "
                                                   "NOTE [verify after AdamW])" if self.replayed else ")"))
        if self.resumed:
            lines.append(f"max_resumed_weight_rel_err={max(c.max_rel_err for c in self.resumed):.3g} (the weights each "
                         "rank resumed with, against the model's after the checkpoint's steps; NOTE [verify a resume])")
        for c in self.losses:
            if not c.ok:
                lines.append(f"  {c.describe()}  FAIL")
        for c in self.outputs:
            if len(self.outputs) > 1 or not c.ok or c.tiny or c.unreadable:
                lines.append(f"  {c.describe()}" + ("" if c.ok else "  FAIL"))
            if c.tiny:
                lines.append(f"  note: {c.name} is tiny (scale {c.scale:.3g} <= atol {self.tolerances.atol:g}):"
                             " an absolute tolerance would pass any output this small; it is compared relative to "
                             "its own scale")
            if c.unreadable:
                lines.append(f"  note: {c.name} is identically 0 (or below the smallest normal float) in the "
                             "model and the pipeline: it cannot tell a right plan from a wrong one")
        for what, checks in (("gradient", self.grads), ("weight after the last step", self.weights),
                             ("weight resumed from the checkpoint", self.resumed)):
            failed = [c for c in checks if not c.ok]
            for c in sorted(failed, key=lambda c: -c.max_rel_err)[:5]:
                lines.append(f"  {what} of {c.describe()}  FAIL")
            if len(failed) > 5:
                lines.append(f"  ... and {len(failed) - 5} more {what}(s) outside the tolerance")
        verdict = self.verdict
        why = ""
        if verdict == "CANNOT TELL" and not self.resume_told:
            why = ("; the steps before the checkpoint changed the model by less than the tolerance, so a resume that "
                   "loaded nothing (started from the initial weights) would pass too (NOTE [verify a resume]): verify "
                   "the resume of a checkpoint written after more steps or at a larger --lr")
        elif verdict == "CANNOT TELL":
            why = ("; the model's outputs are all 0: equal outputs prove nothing here; verify with inputs or weights "
                   "that give non-zero outputs")
        lines.append(f"verify: {verdict} ({self.tolerances.describe()}; "
                     f"--atol {self.tolerances.atol:g} --rtol {self.tolerances.rtol:g}{why})")
        return lines


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Compute with `count` intra-op threads (a rank's: the reference reduces as the ranks do), then restore."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class ReferenceTraining:
    """The unpartitioned model's training on the global batch, as `run --mode training` steps it."""

    grads: dict[str, torch.Tensor]  # every weight's gradient in the first step, by each of its names
    losses: torch.Tensor  # [steps, microbatches]: each microbatch's training_loss, each step
    weights: dict[str, torch.Tensor]  # every weight after the last step, by each of its names
    optim: OptimizerSpec | None = None  # what stepped it
    initial: dict[str, torch.Tensor] = field(default_factory=dict)  # AdamW: every weight before the first step
    resumed: dict[str, torch.Tensor] = field(default_factory=dict)  # a resume: every weight before step first_step
    resume_told: bool = True  # a resume: one that loaded nothing would fail the checks (NOTE [verify a resume])


def reference_training(module: torch.nn.Module, inputs: tuple, target: torch.Tensor, microbatches: int, steps: int,
                       optim: OptimizerSpec, threads: int, first_step: int = 0,
                       at_first_step: Callable[[], None] | None = None, tol: Tolerances = Tolerances()) -> ReferenceTraining:
    """`steps` steps of `optim` (NOTE [the run's optimizer]) of the model on the global batch, at a rank's
    `threads`: each step's loss is the mean of its `microbatches` microbatch losses (NOTE [pipelines gradients]
    in worker.py). Trains `module`. A run resumed after `first_step` steps (NOTE [checkpoint layout] in
    checkpoint.py) is checked against steps `first_step`.. only: the gradients of that step, the losses from it
    on, the weights after the last, and the weights before it (NOTE [verify a resume], whether they moved beyond
    `tol`); `at_first_step` runs before that step (the launcher takes the outputs there)."""
    from hetpart.runtime.worker import training_loss

    def values() -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in module.named_parameters(remove_duplicate=False)}

    def step_grads() -> dict[str, torch.Tensor]:
        return {name: p.grad.clone() for name, p in module.named_parameters(remove_duplicate=False)
                if p.grad is not None}

    optimizer = optim.make(module.parameters())
    initial = values() if optim.replayed or first_step else {}  # NOTE [verify after AdamW], NOTE [verify a resume]
    run_steps = steps - first_step
    resumed: dict[str, torch.Tensor] = {}
    restarted: dict[str, dict[str, torch.Tensor]] = {}  # a resume that loaded nothing: its first gradients, last weights
    grads: dict[str, torch.Tensor] = {}
    losses = []
    chunks = list(zip(*(x.tensor_split(microbatches) for x in inputs)))
    with torch_threads(threads):
        for step in range(steps):
            if step == first_step and first_step:
                resumed = values()
            if step == first_step and at_first_step is not None:
                at_first_step()
            optimizer.zero_grad(set_to_none=True)
            step_losses = []
            for xs, t in zip(chunks, target.tensor_split(microbatches)):
                loss = training_loss(tuple(pytree.tree_leaves(module(*xs))), t)
                (loss / microbatches).backward()
                step_losses.append(loss.detach())
            losses.append(torch.stack(step_losses))
            if step == first_step:
                grads = step_grads()
            if step == 0 and first_step:
                restarted["grads"] = step_grads()
            optimizer.step()
            if step == run_steps - 1 and first_step:
                restarted["weights"] = values()
    weights = values()
    told = True
    if first_step:  # would a resume that loaded nothing pass? (NOTE [verify a resume])
        same = [check_tensor(k, w, initial[k], tol, robust=False) for k, w in resumed.items()]
        same += [check_tensor(k, restarted["grads"].get(k, torch.zeros_like(g)), g, tol, robust=False)
                 for k, g in grads.items()]
        same += [check_tensor(k, restarted["weights"][k], w, tol, robust=False) for k, w in weights.items()]
        same.append(check_tensor("losses", torch.stack(losses[:run_steps]), torch.stack(losses[first_step:]), tol,
                                 robust=False))
        told = not all(c.ok for c in same)
    return ReferenceTraining(grads, torch.stack(losses[first_step:]).float(), weights, optim,
                             initial if optim.replayed else {}, resumed, told)


# NOTE [verify after AdamW]'s tolerance: a rank's weights after its AdamW step against that step replayed on the
# rank's own gradient (checked against the model's by the rule above) are the same elementwise arithmetic on the
# same numbers, equal to the last bits on one kind of processor; 1e-6 leaves room for a GPU's kernels and still
# sees a weight decay of 0.01 left out at lr 1e-3 (its move, 1e-5 of the weight; at lr 1e-4 it is the tolerance).
REPLAYED = Tolerances(rtol=1e-6, atol=1e-7)


@dataclass(frozen=True)
class TrainingChecks:
    grads: list[TensorCheck]
    losses: list[TensorCheck]
    weights: list[TensorCheck]
    resumed: list[TensorCheck] = field(default_factory=list)  # NOTE [verify a resume]


def training_checks(io_dir: Path, manifest: dict, reference: ReferenceTraining, tol: Tolerances) -> TrainingChecks:
    """What the ranks wrote (worker.py) against `reference`: every weight's first-step gradient and its value after
    the last step on every rank that holds it (each copy must carry the whole gradient: NOTE [replicated
    weights], NOTE [pipelines gradients] in worker.py), and the loss of every microbatch and step, the
    pipelines' concatenated in batch order."""
    from safetensors.torch import load_file

    from hetpart.errors import HetpartError
    from hetpart.runtime.artifacts import mesh_pipelines
    from hetpart.runtime.checkpoint import rank_weights

    def per_rank(prefix: str, ref: dict[str, torch.Tensor], what: str,
                 replay: Callable[[str, int], torch.Tensor] | None = None) -> list[TensorCheck]:
        got, unwritten = [], []
        for entry in manifest["ranks"]:
            rank = entry["rank"]
            path = io_dir / f"{prefix}{rank}.safetensors"
            written = load_file(str(path)) if path.exists() else {}
            got.extend((name, rank, t) for name, t in written.items())
            # NOTE [every held weight checked]: a weight the rank holds and the model has a gradient (or value) for
            # must be in the rank's file; one it never wrote would otherwise be compared nowhere
            unwritten += [TensorCheck(f"{name} (rank {rank})", float("inf"), 0.0, float("inf"), False,
                                      problem=f"the rank wrote no {what[:-1]} for it; the model has one")
                          for name in rank_weights(entry) if name in ref and name not in written]
        missing = sorted({name for name, _, _ in got} - set(ref))
        if missing:
            raise HetpartError(f"verification: the pipeline has {what} for {missing[:5]} the model does not")
        # NOTE [verify after AdamW]: with `replay`, each rank's weights against its step on its own gradients
        return [check_tensor(f"{name} (rank {rank})", t,
                             *((replay(name, rank), REPLAYED) if replay else (ref[name], tol)), robust=False)
                for name, rank, t in got] + unwritten

    rank_grads: dict[int, dict[str, torch.Tensor]] = {}

    def replay(name: str, rank: int) -> torch.Tensor:
        """The weight `name` after `reference.optim`'s step from its first value on rank `rank`'s gradient."""
        if rank not in rank_grads:
            path = io_dir / f"grads{rank}.safetensors"
            rank_grads[rank] = load_file(str(path)) if path.exists() else {}
        return reference.optim.stepped(reference.initial[name], rank_grads[rank].get(name))

    last_ranks = [q.stages[-1][0] for q in mesh_pipelines(manifest)]
    losses = torch.cat([load_file(str(io_dir / f"losses{r}.safetensors"))["losses"] for r in last_ranks], dim=1)
    dumped = any((io_dir / f"weights{r}.safetensors").exists() for r in range(manifest["world_size"]))
    with torch_threads(1):  # hundreds of small comparisons: on a busy machine a thread pool waits more than it adds
        return TrainingChecks(
            grads=per_rank("grads", reference.grads, "gradients"),
            losses=[check_tensor("loss of each step", losses.mean(dim=1), reference.losses.mean(dim=1), tol,
                                 robust=False),
                    check_tensor("loss of each microbatch and step", losses, reference.losses, tol, robust=False)],
            weights=per_rank("weights", reference.weights, "weights",
                             replay if reference.initial else None) if dumped else [],
            resumed=per_rank("resumed", reference.resumed, "weights") if reference.resumed else [])


def rank_threads() -> int:
    """Intra-op threads of each rank: OMP_NUM_THREADS, else 1 (NOTE [profile threads] in profiler/measure.py)."""
    return int(os.environ.get("OMP_NUM_THREADS", "1"))


def reference_outputs(module: torch.nn.Module, inputs: tuple) -> tuple[torch.Tensor, ...]:
    """The unpartitioned model's outputs, flat (NOTE [model outputs] in frontend/export.py), computed with
    a rank's thread count, so that its reductions are blocked as the ranks' are (NOTE [verify tolerances])."""
    with torch_threads(rank_threads()), torch.no_grad():
        return tuple(pytree.tree_leaves(module(*inputs)))
