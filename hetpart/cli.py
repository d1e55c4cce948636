"""`hetpart partition | run | inspect | placement | devices | models`.

User mistakes raise HetpartError: printed as one message (what, where, what to
do), exit status 2, no traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from rich import box
from rich.console import Console
from rich.table import Table

from hetpart import __version__
from hetpart.errors import HetpartError, Terminated


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got '{text}'")
    return key, value


def _number(kind: type = int, *, minimum: float | None = None, positive: bool = False,
            maximum: float | None = None) -> Callable[[str], int | float]:
    """An argparse `type=`: `kind` (int or float) from the text, finite, >= `minimum` (or > 0 when
    `positive`) and <= `maximum`; otherwise an error that argparse prefixes with the flag."""
    def shown(bound: float) -> str:
        return str(int(bound)) if kind is int else f"{bound:g}"

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {'an integer' if kind is int else 'a number'} "
                                             f"(got {text!r})") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number (got {text})")
        if positive and not value > 0:
            raise argparse.ArgumentTypeError(f"must be positive (got {text})")
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {shown(minimum)} (got {text})")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {shown(maximum)} (got {text})")
        return value
    return parse


SEED_MAX = 2**31 - 1  # CP-SAT's random_seed is a 32-bit int
PROCESSES_MAX = 1024  # --concurrent, --threads, --workers: processes or threads this machine starts
_COUNT = _number(int, minimum=1)  # sizes and counts: batch, sequence, microbatches, steps, repeats
_SECONDS = _number(float, positive=True)
_SEED = _number(int, minimum=0, maximum=SEED_MAX)
_PROCESSES = _number(int, minimum=1, maximum=PROCESSES_MAX)


class _Parser(argparse.ArgumentParser):
    """argparse whose mistakes are HetpartErrors: one `hetpart: error:` line, status 2."""

    def error(self, message: str) -> NoReturn:
        # "argument --timeout: must be positive (got 0)" -> "--timeout must be positive (got 0)"
        flag, sep, rest = message.removeprefix("argument ").partition(": ")
        if message.startswith("argument ") and sep and rest.startswith("must "):
            message = f"{flag} {rest}"
        command = self.prog.removeprefix("hetpart").strip()
        raise HetpartError(f"{command + ': ' if command else ''}{message} (see `{self.prog} --help`)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="hetpart", description="Partition a PyTorch model across a heterogeneous cluster.")
    p.add_argument("--version", action="version", version=f"hetpart {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    part = sub.add_parser("partition", help="trace, cost, partition and write per-rank artifacts")
    part.add_argument("model", help="zoo:NAME or path/to/file.py:FUNCTION")
    part.add_argument("--cluster", required=True, help="preset:NAME or a cluster TOML file")
    part.add_argument("--out", required=True, type=Path, help="artifacts directory to write")
    part.add_argument("--mode", default="inference", choices=["inference", "training"],
                      help="what the plan is for; training costs forward + backward and holds gradients, "
                           "optimizer state and the schedule's activation stash")
    part.add_argument("--schedule", default="gpipe", choices=["gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb"],
                      help="training: GPipe stashes all microbatches, 1F1B stage k of S min(S-k, M); the interleaved "
                           "ones plan --virtual-stages per device (README: Schedules)")
    part.add_argument("--virtual-stages", type=_COUNT, default=None, metavar="V",
                      help="with an interleaved --schedule: stages per device, V*D in all (default 2)")
    part.add_argument("--optimizer-bytes-per-param", type=_number(int, minimum=0, maximum=1024), default=8, metavar="N",
                      help="training: optimizer state per parameter (default 8: Adam's two fp32 moments)")
    part.add_argument("--profile", dest="profiles", action="append", type=Path, default=[], metavar="FILE",
                      help="measured op times from `hetpart profile` for its device type (repeatable, one per type)")
    part.add_argument("--batch-size", type=_COUNT, default=8, help="traced batch size (dynamic in the artifacts)")
    part.add_argument("--seq-len", type=_COUNT, default=64, help="sequence length of generated example inputs")
    part.add_argument("--microbatches", type=_COUNT, default=4, help="microbatches per step; costs are per microbatch")
    part.add_argument("--set", dest="overrides", action="append", type=_key_value, default=[],
                      metavar="KEY=VALUE", help="set a model config field (repeatable)")
    part.add_argument("--time-limit", type=_SECONDS, default=30.0, help="solver time limit in seconds")
    part.add_argument("--gap", type=_number(float), default=0.0, metavar="FRACTION",
                      help="stop once the plan is certified within this relative gap of optimal "
                           "(e.g. 0.01 for 1%%; default 0: prove optimal or use the whole time limit)")
    part.add_argument("--seed", type=_SEED, default=0, help="seed for weights, inputs and the solver")
    part.add_argument("--strategy", default="optimal", metavar="NAME",
                      help="optimal (default), or write a baseline's plan instead: equal-layers, "
                           "equal-layers-best-order, parameters, dp-topo-order, fx-size-based")
    part.add_argument("--check-certificate", action=argparse.BooleanOptionalAction, default=None,
                      help="re-prove an OPTIMAL / WITHIN_GAP claim by another route (brute force or CP-SAT "
                           "without presolve) and downgrade it if refuted (default: HETPART_CHECK_CERTIFICATE)")
    part.add_argument("--force", action="store_true",
                      help="replace --out if hetpart wrote it (its .hetpart marker lists every file in it)")
    weights = part.add_mutually_exclusive_group()
    weights.add_argument("--meta", dest="meta", action="store_const", const=True, default=None,
                         help="trace without weights (meta device): per-rank weight manifests that "
                              "`shard-weights` fills; default: only when the weights would not fit in memory")
    weights.add_argument("--no-meta", dest="meta", action="store_const", const=False,
                         help="always build the model with its (random) weights")
    part.add_argument("--no-pt2", dest="pt2", action="store_false",
                      help="skip rank<k>/stage.pt2 (the torch.export programs; the slowest artifact to write)")
    part.add_argument("--print-ir-after", action="append", default=[], metavar="PASS",
                      help="print the IR after this pass (or 'all'); dumps always go to OUT/ir/")
    part.add_argument("--dump-ir", nargs="?", const=None, default=None, type=Path, metavar="DIR",
                      help="also write the IR dumps to DIR as each pass ends (kept if a later step fails); "
                           "default: only OUT/ir/")
    part.add_argument("--verbose", action="store_true", help="print each pass's and the solver's time")
    part.add_argument("--sign-key", type=Path, default=None, metavar="FILE",
                      help="sign manifest.json with this secret key (HMAC-SHA256) into manifest.json.hmac")
    part.add_argument("--align", default="ops", choices=["ops", "layers"],
                      help="layers: cut only between top-level blocks (what `hetpart export` formats for "
                           "torchtitan, Megatron, DeepSpeed and accelerate take); default ops: anywhere")
    part.add_argument("--pipelines", default=None, metavar="DEV,DEV;DEV,...",
                      help="data-parallel pipelines on these device groups (';' between pipelines, ',' between "
                           "devices), each planned on its own devices and fed its share of the batch")
    part.add_argument("--pipeline-microbatches", default=None, metavar="M,M,...",
                      help="with --pipelines: each pipeline's microbatches, adding up to --microbatches "
                           "(default: in proportion to each pipeline's speed)")
    part.add_argument("--parallel", default="pipeline", choices=["pipeline", "data"],
                      help="pipeline (default): one pipeline over the cluster; data: search data-parallel "
                           "pipelines of different shapes")
    part.add_argument("--tensor-parallel", type=int, default=1, metavar="T",
                      help="run every stage tensor-parallel on T devices of one type in one machine (Megatron-style "
                           "sharding found on the graph; default 1: off)")
    part.add_argument("--max-tensor-parallel", type=int, default=1, metavar="N",
                      help="let the solve choose each plan's tensor-parallel degree, up to N (1, 2, 4, 8: each solved, "
                           "the best kept, its bound the least of theirs); default 1: off")

    run = sub.add_parser("run", help="run the artifacts under torchrun (one CPU process per stage)")
    run.add_argument("out", type=Path, help="artifacts directory")
    run.add_argument("--verify", action="store_true", help="compare outputs (and gradients) with the unpartitioned model")
    run.add_argument("--mode", choices=["inference", "training"], default="inference",
                     help="training: MSE loss on the first output, SGD step on every rank")
    run.add_argument("--schedule", choices=["gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb"], default=None,
                     help="pipeline schedule (default: the plan's interleaved one, else gpipe)")
    run.add_argument("--microbatches", type=_COUNT, default=None, help="default: the plan's")
    run.add_argument("--batch-size", type=_COUNT, default=None,
                     help="run (and --verify) at this batch instead of the traced one; the batch is always dynamic")
    run.add_argument("--seq-len", type=_COUNT, default=None,
                     help="run at this sequence length, where the plan's is dynamic (plan.json `dynamic`)")
    run.add_argument("--steps", type=_COUNT, default=1, help="pipeline steps to run")
    run.add_argument("--measure", action="store_true",
                     help="time every stage and the step; write DIR/measured.json next to the plan's predictions")
    run.add_argument("--emulate", action="store_true",
                     help="rehearse on this Linux machine: each rank on a core, throttled with a cgroup CPU quota "
                          "to its device type's speed relative to the plan's fastest (needs writable cgroups)")
    run.add_argument("--as-nodes", action="store_true",
                     help="start one torchrun per planned node (launch.sh's), all on loopback: a multi-node rehearsal")
    run.add_argument("--timeout", type=_number(float, positive=True, maximum=1e6), default=600,
                     help="seconds before the run is stopped")
    run.add_argument("--master-port", type=_number(int, minimum=1, maximum=65535), default=None,
                     help="torchrun's rendezvous port on 127.0.0.1 (default: a free one)")
    run.add_argument("--model", default=None, metavar="FILE.py:FUNCTION",
                     help="a file model's plan: the model file to import (its sha256 must be the one plan.json "
                          "recorded at partition time)")
    run.add_argument("--trust-model-file", action="store_true",
                     help="a file model's plan: import the file plan.json names (or --model's, though it differs)")
    run.add_argument("--key", type=Path, default=None, metavar="FILE",
                     help="run only a directory signed with this key (manifest.json.hmac)")
    run.add_argument("--rtol", type=_number(float), default=None,
                     help="--verify: tolerance relative to each element of the model's output (default 1e-5)")
    run.add_argument("--atol", type=_number(float), default=None,
                     help="--verify: tolerance in units of each output's largest |element| (default 1e-5)")

    run.add_argument("--checkpoint-dir", type=Path, default=None, metavar="CK",
                     help="training: write each rank's weights and optimizer state here (safetensors, hashed)")
    run.add_argument("--checkpoint-every", type=_COUNT, default=None, metavar="K", help="a checkpoint every K steps")
    run.add_argument("--keep-checkpoints", type=_COUNT, default=None, metavar="N",
                     help="remove this run's older complete checkpoints beyond the newest N (default: keep all)")
    run.add_argument("--resume", type=Path, default=None, metavar="CK",
                     help="training: start from the newest complete checkpoint in CK (or a CK/step-<N> folder)")
    rep = sub.add_parser("replan", help="re-plan an artifacts directory for a changed device set, moving the "
                         "fewest bytes (no re-trace for the plan)")
    rep.add_argument("old", type=Path, help="the artifacts directory of the old plan")
    rep.add_argument("--out", type=Path, required=True, help="the new artifacts directory")
    rep.add_argument("--cluster", default=None, help="the new device set: TOML file or preset:NAME")
    rep.add_argument("--lose", action="append", default=[], metavar="DEVICE", help="a device of the old cluster gone")
    rep.add_argument("--add", action="append", default=[], metavar="TYPE@MACHINE",
                     help="a device added to a machine of the old cluster")
    rep.add_argument("--slack", type=_number(float, minimum=0, maximum=0.99), default=0.02,
                     help="bottleneck allowed above the from-scratch plan's, as a fraction (default 0.02)")
    rep.add_argument("--time-limit", type=_number(float, positive=True), default=30.0, help="seconds per solve")
    rep.add_argument("--seed", type=_SEED, default=0, help="the solver's seed")
    rep.add_argument("--force", action="store_true", help="replace --out if hetpart wrote it")
    insp = sub.add_parser("inspect", help="print the plan of an artifacts directory")
    insp.add_argument("out", type=Path, help="artifacts directory")
    view = insp.add_mutually_exclusive_group()
    view.add_argument("--stage", type=_number(int, minimum=0), metavar="K",
                      help="print stage K's stage.py with its inputs and outputs")
    view.add_argument("--ir", metavar="N|NAME", help="print an IR dump from DIR/ir by number or pass name")
    view.add_argument("--json", action="store_true", help="print the plan and its derived numbers as JSON")
    insp.add_argument("--key", type=Path, default=None, metavar="FILE",
                      help="read only a directory signed with this key (manifest.json.hmac)")

    place = sub.add_parser("placement", help="solve a device-placement benchmark input (NeurIPS 2020 format)")
    place.add_argument("input", type=Path, help="benchmark JSON (maxSizePerFPGA, maxFPGAs, maxCPUs, nodes, edges)")
    place.add_argument("--time-limit", type=_SECONDS, default=60.0, help="solver time limit in seconds")
    place.add_argument("--workers", type=_PROCESSES, default=1, help="CP-SAT worker threads (1 is deterministic)")
    place.add_argument("--gap", type=_number(float), default=0.0,
                       help="stop once the placement is proven within this fraction of optimal (default 0)")
    place.add_argument("--check-certificate", action=argparse.BooleanOptionalAction, default=None,
                       help="re-prove an OPTIMAL claim by another route (brute force or CP-SAT without presolve) "
                            "and downgrade it if refuted (default: HETPART_CHECK_CERTIFICATE)")

    prof = sub.add_parser("profile", help="measure a model's ops on this machine into a profile table")
    prof.add_argument("model", help="zoo:NAME, hf:TYPE or path/to/file.py:FUNCTION")
    prof.add_argument("--out", required=True, type=Path, help="profile JSON to write")
    prof.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where to run the ops")
    prof.add_argument("--device-type", default="cpu", help="the device type the profile stands for: the catalog's, "
                      "or with --cluster one the cluster file defines")
    prof.add_argument("--speed-scale", type=_number(float, positive=True), default=1.0, metavar="X",
                      help="stand for a device X times as fast as this machine: every time divided by X "
                           "(0.5: half as fast), recorded in the profile (default 1)")
    prof.add_argument("--batch-size", type=_COUNT, default=8, help="traced batch size")
    prof.add_argument("--seq-len", type=_COUNT, default=64, help="sequence length of generated example inputs")
    prof.add_argument("--microbatches", type=_COUNT, default=4,
                      help="ops are measured at --batch-size / --microbatches samples, as partition costs them")
    prof.add_argument("--set", dest="overrides", action="append", type=_key_value, default=[],
                      metavar="KEY=VALUE", help="set a model config field (repeatable)")
    prof.add_argument("--repeats", type=_COUNT, default=20, help="timed runs per op (the median is kept)")
    prof.add_argument("--warmup", type=_number(int, minimum=0), default=3,
                      help="untimed runs per op before the timed ones")
    prof.add_argument("--threads", type=_PROCESSES, default=None,
                      help="torch threads (default: what a `hetpart run` rank uses, OMP_NUM_THREADS or 1)")
    prof.add_argument("--backward", action="store_true",
                      help="also time each op's backward (used by `partition --mode training`)")
    share = prof.add_mutually_exclusive_group()
    share.add_argument("--concurrent", type=_number(int, maximum=PROCESSES_MAX), default=1, metavar="N",
                       help="time the ops while N-1 sibling processes each run 1/N of the graph, as this machine's "
                            "other ranks will: N = the ranks `hetpart run` starts on it (default 1)")
    share.add_argument("--cluster", default=None, metavar="FILE|preset:NAME",
                       help="--concurrent from a cluster: the most devices of --device-type on one of its nodes")
    prof.add_argument("--seed", type=_SEED, default=0, help="seed for weights and inputs")

    shard = sub.add_parser("shard-weights", help="fill the per-rank weights of a plan made with --meta "
                                                 "from a checkpoint, streaming")
    shard.add_argument("out", type=Path, help="artifacts directory of `partition --meta`")
    shard.add_argument("checkpoint", type=Path,
                       help="a .safetensors file, an HF-style *.safetensors.index.json, or a directory with one")
    shard.add_argument("--allow-cast", action="store_true",
                       help="convert tensors whose dtype differs from the traced one (e.g. bf16 -> fp32)")
    shard.add_argument("--sign-key", type=Path, default=None, metavar="FILE",
                       help="check the directory's signature with this key, and sign the updated manifest.json")

    chk = sub.add_parser("check", help="validate a cluster file (or preset:NAME) and print its devices, machines "
                                       "and links")
    chk.add_argument("cluster", help="a cluster TOML file or preset:NAME")

    exp = sub.add_parser("export", help="write a plan as torchtitan, Megatron-LM, DeepSpeed or accelerate config, "
                                        "or a torch.distributed.pipelining schedule CSV")
    exp.add_argument("out", type=Path, help="artifacts directory")
    exp.add_argument("--format", required=True, choices=["torchtitan", "megatron", "deepspeed", "accelerate",
                                                         "schedule-csv"], help="the framework's config to write")
    exp.add_argument("--out", dest="file", type=Path, default=None, metavar="FILE",
                     help="write it here (torchtitan: and its schedule CSV as FILE.schedule.csv); default: stdout")
    exp.add_argument("--key", type=Path, default=None, metavar="FILE",
                     help="read only a directory signed with this key (manifest.json.hmac)")

    sub.add_parser("devices", help="list the device catalog")
    sub.add_parser("models", help="list the model zoo")
    return p


def _model_arg(model: str) -> str:
    """MODEL as recorded in specs: file models by absolute path."""
    if not model.startswith(("zoo:", "hf:")) and ":" in model:
        path, _, fn = model.rpartition(":")
        model = f"{Path(path).resolve()}:{fn}"
    return model


# NOTE [arguments before torch]
# Importing torch takes 5 to 20 s on a busy machine, and a mistyped preset, device type or zoo name
# should not wait for it. `_check_before_torch` checks what needs no torch first: the cluster
# (hetpart.devices is torch-free) and a zoo name (hetpart.names); the commands that take them
# call it before their first import of torch. tests/export/test_fast_cli.py checks that such an
# error leaves torch unimported.
def _check_before_torch(model: str, cluster: str | None) -> None:
    from hetpart.devices import load_cluster
    from hetpart.errors import did_you_mean
    from hetpart.names import ZOO_NAMES

    name = model.removeprefix("zoo:")
    if model.startswith("zoo:") and name not in ZOO_NAMES:
        raise HetpartError(f"unknown model 'zoo:{name}' (known: {', '.join(sorted(ZOO_NAMES))})"
                           f"{did_you_mean(name, ZOO_NAMES, 'zoo:')}; see `hetpart models`")
    if cluster is not None:
        load_cluster(cluster)


def _partition(args: argparse.Namespace, console: Console) -> int:
    _check_before_torch(args.model, args.cluster)  # NOTE [arguments before torch]
    pipelines = _pipelines_before_torch(args)
    from hetpart.compile import CompileOptions, compile_model
    from hetpart.frontend import ModelSpec
    from hetpart.report import print_plan
    from hetpart.report.progress import Progress

    spec = ModelSpec(_model_arg(args.model), dict(args.overrides), args.batch_size, args.seq_len, args.seed)
    opts = CompileOptions(microbatches=args.microbatches, time_limit_s=args.time_limit, gap=args.gap, seed=args.seed,
                          force=args.force, pt2=args.pt2, meta=args.meta, print_ir_after=frozenset(args.print_ir_after),
                          verbose=args.verbose, dump_ir=args.dump_ir, mode=args.mode, schedule=args.schedule,
                          virtual_stages=args.virtual_stages,
                          optimizer_bytes_per_param=args.optimizer_bytes_per_param, profiles=tuple(args.profiles),
                          sign_key=args.sign_key, check_certificate=args.check_certificate,
                          strategy=args.strategy, align=args.align, tensor_parallel=args.tensor_parallel,
                          max_tensor_parallel=args.max_tensor_parallel,
                          **pipelines)
    result = compile_model(spec, args.cluster, args.out, opts,
                           echo=lambda text: console.print(text, markup=False, highlight=False),
                           progress=Progress.for_console(console))
    print_plan(result.report, console)
    if args.strategy != "optimal":  # NOTE [--strategy] in partitioner/baselines.py
        console.print(f"strategy {args.strategy}: the artifacts run this baseline's plan, not the optimised one")
    ranks = sum(len(s.devices) or 1 for s in result.report.stages)  # NOTE [tensor-parallel stages]: a group's
    console.print(f"wrote {args.out}/ (plan.json, manifest.json, rank0..rank{ranks - 1}, ir/, "
                  "report.html)")
    return 0


def _pipelines_before_torch(args: argparse.Namespace) -> dict:
    """CompileOptions' `pipelines`, `pipeline_microbatches` and `parallel`, checked before torch (issue 19)."""
    from hetpart.devices import load_cluster
    from hetpart.pipeline_groups import check_pipeline_options, parse_pipeline_microbatches, parse_pipelines

    groups = (parse_pipelines(args.pipelines, [d.name for d in load_cluster(args.cluster).devices])
              if args.pipelines is not None else None)
    counts = parse_pipeline_microbatches(args.pipeline_microbatches) if args.pipeline_microbatches else None
    check_pipeline_options(groups, counts, args.microbatches, args.parallel)
    return {"pipelines": groups, "pipeline_microbatches": counts, "parallel": args.parallel}


def _run(args: argparse.Namespace, console: Console) -> int:
    from hetpart.runtime import RunOptions, Tolerances, run_pipeline
    from hetpart.runtime.checkpoint import CheckpointFlags

    opts = RunOptions(mode=args.mode, schedule=args.schedule, microbatches=args.microbatches, steps=args.steps,
                      verify=args.verify, timeout_s=args.timeout, as_nodes=args.as_nodes, master_port=args.master_port,
                      measure=args.measure, batch_size=args.batch_size, seq_len=args.seq_len, emulate=args.emulate,
                      model=_model_arg(args.model) if args.model else None, trust_model_file=args.trust_model_file,
                      key=args.key, checkpoints=CheckpointFlags(args.checkpoint_dir, args.checkpoint_every,
                                                                args.keep_checkpoints, args.resume),
                      tolerances=Tolerances(**{k: v for k, v in (("rtol", args.rtol), ("atol", args.atol))
                                               if v is not None}))
    result = run_pipeline(args.out, opts, echo=console.print)
    console.print(f"pipeline step: {result.step_seconds * 1e3:.1f} ms; outputs: {result.described_outputs()}")
    if result.measured is not None:
        _print_measured(result.measured, console)
    if result.verification is None:
        return 0
    for line in result.verification.report():
        print(line)
    return 0 if result.verification.verdict == "PASS" else 1


def _replan(args: argparse.Namespace, console: Console) -> int:
    from hetpart.replan import replan
    from hetpart.report import print_plan

    result = replan(args.old, args.out, cluster=args.cluster, lose=tuple(args.lose), add=tuple(args.add),
                    slack=args.slack, time_limit_s=args.time_limit, seed=args.seed, force=args.force,
                    echo=lambda text: console.print(text, markup=False, highlight=False))
    print_plan(result.report, console)
    console.print(f"wrote {args.out}/ (plan.json with `replan`: the bytes to move per link, beside the from-scratch "
                  "plan's)")
    return 0


def _print_measured(measured: dict, console: Console) -> None:
    table = Table(box=box.SIMPLE_HEAD, title=f"measured vs predicted ({measured['schedule']}, "
                                             f"{measured['microbatches']} microbatches, per microbatch)")
    for col in ("stage", "device", "measured", "CPU time", "predicted compute", "CPU / predicted"):
        table.add_column(col, justify="left" if col == "device" else "right")
    for s in measured["stages"]:
        cpu = s["measured_cpu_time_us"]
        ratio = cpu / s["predicted_compute_us"] if s["predicted_compute_us"] else float("nan")
        table.add_row(str(s["index"]), s["device"], f"{s['measured_time_us']:.1f} us", f"{cpu:.1f} us",
                      f"{s['predicted_compute_us']:.1f} us", f"{ratio:.2f}")
    console.print(table)
    predicted = measured["predicted_step_time_us"]
    console.print(f"step: measured {measured['step_time_us'] / 1e3:.2f} ms"
                  + (f", simulated {predicted / 1e3:.2f} ms" if predicted is not None else ""))


def _inspect(args: argparse.Namespace, console: Console) -> int:
    from hetpart.report import print_plan
    from hetpart.runtime.artifacts import load_manifest, read_plan
    from hetpart.trust import read_key

    manifest = load_manifest(args.out, read_key(args.key, args.out) if args.key is not None else None)
    plan = read_plan(args.out, manifest)
    if args.json:
        import json

        from hetpart.report.inspect import inspect_json

        print(json.dumps(inspect_json(args.out, manifest, plan), indent=1))
    elif args.stage is not None:
        from hetpart.report.inspect import stage_text

        print(stage_text(args.out, manifest, plan, args.stage), end="")
    elif args.ir is not None:
        from hetpart.report.inspect import ir_dump

        print(ir_dump(args.out, args.ir, manifest), end="")
    else:
        print_plan(plan, console)
    return 0


def _profile(args: argparse.Namespace, console: Console) -> int:
    _check_before_torch(args.model, args.cluster)  # NOTE [arguments before torch]
    from hetpart.devices import load_cluster
    from hetpart.frontend import ModelSpec
    from hetpart.profiler.measure import check_profile_type, profile_model
    from hetpart.profiler.siblings import ranks_sharing_a_machine
    from hetpart.profiler.table import check_output_path

    cluster = load_cluster(args.cluster) if args.cluster is not None else None
    check_profile_type(args.device_type, cluster)  # an unknown type is an error that lists the known ones
    check_output_path(args.out)
    spec = ModelSpec(_model_arg(args.model), dict(args.overrides), args.batch_size, args.seq_len, args.seed)
    concurrent = args.concurrent
    if cluster is not None:
        concurrent = ranks_sharing_a_machine(cluster, args.device_type)
    prof = profile_model(spec, args.microbatches, args.device_type, device=args.device, repeats=args.repeats,
                         warmup=args.warmup, threads=args.threads, backward=args.backward, concurrent=concurrent)
    prof = prof.scaled(args.speed_scale)
    prof.save(args.out)
    total_us = sum(prof.forward_ns.values()) / 1e3
    console.print(f"profiled {len(prof.forward_ns)} distinct ops"
                  + (f" ({len(prof.backward_ns)} backwards)" if args.backward else "") + f" of {spec.model} on {args.device} "
                  f"({prof.threads} thread(s)" + (f", {prof.concurrent} processes side by side" if prof.concurrent > 1
                                                   else "") + f") as device type '{prof.device_type}'"
                  + (f" ({prof.speed_scale:g}x this machine's speed)" if prof.speed_scale != 1 else "") + ": "
                  f"{total_us:.1f} us over one of each; wrote {args.out}", markup=False, highlight=False)
    return 0


def _placement(args: argparse.Namespace) -> int:
    import json

    from hetpart.placement import read_placement, solve_placement

    if args.workers < 1:
        raise HetpartError(f"--workers must be at least 1 (got {args.workers})")
    problem = read_placement(args.input)
    result = solve_placement(problem, time_limit_s=args.time_limit, workers=args.workers, gap=args.gap,
                             check_certificate=args.check_certificate)
    if result.certificate is not None and result.certificate.warning:
        print(f"hetpart: warning: {result.certificate.warning}", file=sys.stderr)
    print(json.dumps(result.to_json(problem)))
    return 0


def _shard_weights(args: argparse.Namespace, console: Console) -> int:
    from hetpart.codegen.weights import shard_weights
    from hetpart.runtime.artifacts import check_before_shard

    key = check_before_shard(args.out, args.sign_key)  # what it reads, and the signature it replaces
    result = shard_weights(args.out, args.checkpoint, allow_cast=args.allow_cast, sign_key=key,
                           echo=lambda text: console.print(text, markup=False, highlight=False))
    console.print(f"wrote weights.safetensors for {result.ranks} rank(s): {result.tensors} tensor(s), "
                  f"{result.bytes_written / 1e6:.1f} MB, {result.from_checkpoint} from {args.checkpoint}"
                  + (f" ({result.cast} converted)" if result.cast else ""))
    return 0


def _check(args: argparse.Namespace, console: Console) -> int:
    from hetpart.devices import load_cluster
    from hetpart.devices.show import print_cluster

    print_cluster(load_cluster(args.cluster), console)  # torch-free: NOTE [arguments before torch]
    return 0


def _export(args: argparse.Namespace) -> int:
    from hetpart.export import export_plan

    result = export_plan(args.out, args.format, args.file, args.key)
    for note in result.notes:
        print(note, file=sys.stderr)
    if args.file is None:
        print(result.text, end="")
    else:
        wrote = [str(args.file)] + [str(args.file.with_suffix(s)) for s in result.extra_files]
        print(f"wrote {', '.join(wrote)}", file=sys.stderr)
    return 0


def _devices(console: Console) -> int:
    from hetpart.devices import CATALOG

    table = Table(title="device catalog")
    for col in ("name", "description", "fp32 TFLOP/s", "fp16/bf16 TFLOP/s", "memory GiB", "bandwidth GB/s"):
        table.add_column(col)
    for t in CATALOG.values():
        half = max(t.flops_per_s("fp16"), t.flops_per_s("bf16"))
        table.add_row(t.name, t.description, f"{t.flops_per_s('fp32') / 1e12:g}", f"{half / 1e12:g}",
                      f"{t.mem_bytes / (1 << 30):g}", f"{t.mem_bw_bytes_per_s / 1e9:g}")
    console.print(table)
    return 0


def _models(console: Console) -> int:
    from hetpart.models import ZOO

    for m in ZOO.values():
        print(f"zoo:{m.name:<12} {m.domain:<22} {m.description}")
    return 0


TERMINATING = (signal.SIGTERM, signal.SIGHUP)  # raised as errors.Terminated by _terminate


def _terminate(signum: int, frame: object) -> None:
    for sig in TERMINATING:  # once: a second signal must not cut the cleanup short
        signal.signal(sig, signal.SIG_IGN)
    raise Terminated(signum)


def main(argv: list[str] | None = None) -> int:
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = {}
    if in_main_thread:
        for sig in TERMINATING:
            if signal.getsignal(sig) is not signal.SIG_IGN:  # under nohup SIGHUP stays ignored
                previous[sig] = signal.signal(sig, _terminate)
    try:
        return _main(argv)
    except Terminated as err:
        with contextlib.suppress(OSError):  # the terminal that hung up may be gone
            print("hetpart: terminated" if err.signum == signal.SIGTERM else "hetpart: hangup", file=sys.stderr)
        return 128 + err.signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _main(argv: list[str] | None) -> int:
    # torch's own deprecation notices (pytree LeafSpec) are not the user's to act on.
    warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
    # Tables keep their shape in pipes and logs (rich would wrap them at 80 columns).
    console = Console() if sys.stdout.isatty() else Console(width=160)
    args = None
    try:
        args = _parser().parse_args(argv)
        if args.command == "partition":
            return _partition(args, console)
        if args.command == "run":
            return _run(args, console)
        if args.command == "inspect":
            return _inspect(args, console)
        if args.command == "replan":
            return _replan(args, console)
        if args.command == "profile":
            return _profile(args, console)
        if args.command == "placement":
            return _placement(args)
        if args.command == "shard-weights":
            return _shard_weights(args, console)
        if args.command == "export":
            return _export(args)
        if args.command == "check":
            return _check(args, console)
        if args.command == "devices":
            return _devices(console)
        return _models(console)
    except HetpartError as err:
        print(f"hetpart: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("hetpart: interrupted", file=sys.stderr)
        return 130
    except BaseException as err:
        if isinstance(err, (Exception, Terminated)):
            raise  # a bug in hetpart (its traceback), or SIGTERM for main's cleanup
        if isinstance(err, SystemExit) and args is None:
            raise  # --help, --version
        # The model's own code (its forward, as it is traced) exited: NOTE [user code exits] in frontend/load.py.
        from hetpart.frontend.load import describe_exit, exit_location

        print(f"hetpart: error: {exit_location(err)}: the model's code {describe_exit(err)}; a model must not exit "
              "or raise BaseException while hetpart builds or traces it", file=sys.stderr)
        return 2
