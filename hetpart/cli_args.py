"""The command line's arguments: every subcommand's flags and the argparse types that check them.

`hetpart/cli.py` dispatches; this module only describes. A mistake in an argument is a HetpartError
(one `hetpart: error:` line, exit status 2), raised by `_Parser`.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from hetpart import __version__
from hetpart.errors import HetpartError
from hetpart.time_limit import TIME_LIMIT_MAX_S

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
# A solver's --time-limit: at most the cap the solvers apply (hetpart/time_limit.py), refused above it rather
# than cut silently. `run --timeout` takes the same cap.
_TIME_LIMIT = _number(float, positive=True, maximum=TIME_LIMIT_MAX_S)
_SEED = _number(int, minimum=0, maximum=SEED_MAX)
_PROCESSES = _number(int, minimum=1, maximum=PROCESSES_MAX)


def _count_or_auto(text: str) -> int | str:
    """`--microbatches`: a count, or "auto" (NOTE [schedule choice] in partitioner/schedule_choice.py)."""
    if text == "auto":
        return text
    try:
        return _COUNT(text)
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(str(err).replace("an integer", "an integer or auto", 1)) from None


class _Parser(argparse.ArgumentParser):
    """argparse whose mistakes are HetpartErrors: one `hetpart: error:` line, status 2."""

    def error(self, message: str) -> NoReturn:
        # "argument --timeout: must be positive (got 0)" -> "--timeout must be positive (got 0)"
        flag, sep, rest = message.removeprefix("argument ").partition(": ")
        if message.startswith("argument ") and sep and rest.startswith("must "):
            message = f"{flag} {rest}"
        command = self.prog.removeprefix("hetpart").strip()
        raise HetpartError(f"{command + ': ' if command else ''}{message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
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
    part.add_argument("--schedule", default="gpipe",
                      choices=["gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb", "auto"],
                      help="training: GPipe stashes all microbatches, 1F1B stage k of S min(S-k, M); the interleaved "
                           "ones plan --virtual-stages per device (README: Schedules); auto: the one of least "
                           "simulated step (README: Choosing the schedule)")
    part.add_argument("--virtual-stages", type=_COUNT, default=None, metavar="V",
                      help="with an interleaved --schedule: stages per device, V*D in all (default 2)")
    part.add_argument("--memory-reserve", type=_number(float, minimum=0), default=0.0, metavar="GIB",
                      help="plan with GIB of every device's memory left free, for what the plan does not count (the "
                           "CUDA context, NCCL's buffers, the allocator's slack; default 0)")
    part.add_argument("--optimizer-bytes-per-param", type=_number(int, minimum=0, maximum=1024), default=8, metavar="N",
                      help="training: optimizer state per parameter (default 8: Adam's two fp32 moments)")
    part.add_argument("--profile", dest="profiles", action="append", type=Path, default=[], metavar="FILE",
                      help="measured op times from `hetpart profile` for its device type (repeatable, one per type)")
    part.add_argument("--batch-size", type=_COUNT, default=8, help="traced batch size (dynamic in the artifacts)")
    part.add_argument("--seq-len", type=_COUNT, default=64, help="sequence length of generated example inputs")
    part.add_argument("--microbatches", type=_count_or_auto, default=4,
                      help="microbatches per step; costs are per microbatch; auto: the count, dividing --batch-size, "
                           "of least simulated step")
    part.add_argument("--max-microbatches", type=_COUNT, default=None, metavar="N",
                      help="with --microbatches auto: try at most N microbatches (default: up to --batch-size)")
    part.add_argument("--set", dest="overrides", action="append", type=_key_value, default=[],
                      metavar="KEY=VALUE", help="set a model config field (repeatable)")
    part.add_argument("--time-limit", type=_TIME_LIMIT, default=30.0, help="solver time limit in seconds")
    part.add_argument("--gap", type=_number(float), default=0.0, metavar="FRACTION",
                      help="stop once the plan is certified within this relative gap of optimal "
                           "(e.g. 0.01 for 1%%; default 0: prove optimal or use the whole time limit)")
    part.add_argument("--seed", type=_SEED, default=0, help="seed for weights, inputs and the solver")
    part.add_argument("--strategy", default="optimal", metavar="NAME",
                      help="optimal (default), or write a baseline's plan instead: equal-layers, "
                           "equal-layers-best-order, parameters, dp-topo-order, fx-size-based; with --parallel "
                           "data: megatron, metis, one-pipeline")
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
    part.add_argument("--tensor-parallel", default="1", metavar="T|MACHINE=T,...",
                      help="run every stage tensor-parallel on T devices of one type in one machine (Megatron-style "
                           "sharding found on the graph; default 1: off), with --pipelines or --parallel data every "
                           "stage of every pipeline; MACHINE=T,... (a machine or a device type each): those machines "
                           "at T, the others at 1, in one pipeline")
    part.add_argument("--max-tensor-parallel", type=int, default=1, metavar="N",
                      help="let the solve choose each plan's tensor-parallel degree, up to N (1, 2, 4, 8: each solved, "
                           "the best kept, its bound the least of theirs; with --parallel data, each searched); "
                           "default 1: off")
    part.add_argument("--tensor-parallel-per-machine", action="store_true",
                      help="with --max-tensor-parallel on several machines: also search degrees chosen per machine "
                           "(up to 13 more solves) and write the best plan, mixed or uniform")

    run = sub.add_parser("run", help="run the artifacts under torchrun (one CPU process per stage)")
    run.add_argument("out", type=Path, help="artifacts directory")
    run.add_argument("--verify", action="store_true", help="compare outputs (and gradients) with the unpartitioned model")
    run.add_argument("--mode", choices=["inference", "training"], default="inference",
                     help="training: MSE loss on the first output, an optimizer step on every rank (--optimizer)")
    run.add_argument("--schedule", choices=["gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb"], default=None,
                     help="pipeline schedule (default: the plan's; gpipe in inference unless the plan is interleaved)")
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
    run.add_argument("--emulate-by", choices=["quota", "sleep"], default="quota",
                     help="with --emulate: quota (cgroup CPU quotas, the default) or sleep (each forward and backward "
                          "padded to its device's speed; no cgroups needed)")
    run.add_argument("--as-nodes", action="store_true",
                     help="start one torchrun per planned node (launch.sh's), all on loopback: a multi-node rehearsal")
    run.add_argument("--timeout", type=_TIME_LIMIT, default=600,
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

    run.add_argument("--optimizer", choices=["sgd", "adamw"], default=None,
                     help="training: the optimizer every rank steps, and --verify's reference (default sgd; on a "
                          "--resume, the checkpoint's)")
    run.add_argument("--lr", type=_number(float, positive=True), default=None,
                     help="training: the learning rate (default 0.001; on a --resume, the checkpoint's)")
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
                     help="bottleneck (data-parallel pipelines: step time) allowed above the best plan found, as a "
                     "fraction (default 0.02)")
    rep.add_argument("--time-limit", type=_TIME_LIMIT, default=30.0,
                     help="seconds for the whole re-plan: every solve shares them (default 30)")
    rep.add_argument("--seed", type=_SEED, default=0, help="the solver's seed")
    rep.add_argument("--force", action="store_true", help="replace --out if hetpart wrote it")
    rep.add_argument("--model", default=None, metavar="FILE.py:FUNCTION",
                     help="a file model's file (as `run --model`): writing NEW_DIR traces the model again")
    rep.add_argument("--trust-model-file", action="store_true",
                     help="import the model file plan.json names (or a --model that differs) as `run` does")
    rep.add_argument("--checkpoint", type=Path, default=None, metavar="CK",
                     help="a checkpoint a run of OLD_DIR wrote (its --checkpoint-dir or a step-<N> folder): count the "
                     "bytes to move from what it holds (default: as the plan costs them, --optimizer-bytes-per-param)")
    rep.add_argument("--sign-key", type=Path, default=None, metavar="FILE",
                     help="sign NEW_DIR's manifest.json with this secret key (as `partition --sign-key`); a signed "
                     "OLD_DIR's signature is checked with it first")
    insp = sub.add_parser("inspect", help="print the plan of an artifacts directory")
    insp.add_argument("out", type=Path, help="artifacts directory")
    view = insp.add_mutually_exclusive_group()
    view.add_argument("--stage", type=_number(int, minimum=0), metavar="K",
                      help="print stage K's stage.py with its inputs and outputs")
    view.add_argument("--ir", metavar="N|NAME", help="print an IR dump from DIR/ir by number or pass name")
    view.add_argument("--json", action="store_true", help="print the plan and its derived numbers as JSON")
    insp.add_argument("--tp-rank", type=_number(int, minimum=0), metavar="R", default=None,
                      help="with --stage K of a tensor-parallel stage: print TP rank R of its group (default 0)")
    insp.add_argument("--key", type=Path, default=None, metavar="FILE",
                      help="read only a directory signed with this key (manifest.json.hmac)")

    place = sub.add_parser("placement", help="solve a device-placement benchmark input (NeurIPS 2020 format)")
    place.add_argument("input", type=Path, help="benchmark JSON (maxSizePerFPGA, maxFPGAs, maxCPUs, nodes, edges)")
    place.add_argument("--time-limit", type=_TIME_LIMIT, default=60.0, help="solver time limit in seconds")
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

    link = sub.add_parser("profile-link", help="time gloo collectives between local processes and fit the "
                                               "cluster file's `link = {...}` to them (NOTE [measured links])")
    link.add_argument("--op", choices=["all-reduce", "send-recv"], default="all-reduce",
                      help="all-reduce: a tensor-parallel group's or a gradient sync's ring; send-recv: a stage "
                           "boundary's transfer (default all-reduce)")
    link.add_argument("--ranks", type=_number(int, minimum=2, maximum=64), default=2, help="processes (default 2)")
    link.add_argument("--sizes", type=_number(int, minimum=4), nargs="+", default=None, metavar="BYTES",
                      help="tensor sizes to time (default 4 KiB to 4 MiB)")
    link.add_argument("--repeats", type=_number(int, minimum=1, maximum=10_000), default=20,
                      help="timed runs per size; the median counts (with --gap-us, the mean)")
    link.add_argument("--gap-us", type=_number(int, minimum=0, maximum=1_000_000), default=0, metavar="US",
                      help="time each call after US microseconds of matmuls on every rank, as a tensor-parallel "
                           "rank calls its all-reduces between its ops (NOTE [collectives between work]); "
                           "default 0: back to back")

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
                     help="write it here (torchtitan: and its schedule CSV as FILE.schedule.csv; schedule-csv of "
                          "several pipelines: FILE.pipeline0.csv, ... instead); default, or `-`: stdout")
    exp.add_argument("--force", action="store_true",
                     help="replace FILE (and its companion) if it exists; never a file of an artifacts directory")
    exp.add_argument("--key", type=Path, default=None, metavar="FILE",
                     help="read only a directory signed with this key (manifest.json.hmac)")

    sub.add_parser("devices", help="list the device catalog")
    sub.add_parser("models", help="list the model zoo")
    return p
