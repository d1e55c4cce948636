"""MODEL specs -> (nn.Module, example inputs): `zoo:NAME`, `hf:MODEL_TYPE` or `path/to/file.py:FUNCTION`.

A file model's FUNCTION returns `(module, example_inputs_tuple)`; `--set KEY=VALUE`
values are passed to it as keyword arguments (strings), so it must accept them.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from hetpart.errors import HetpartError, Terminated
from hetpart.trust import sha256_bytes
from hetpart.models import build_zoo
from hetpart.models.meta import params_on_meta


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to build the same model and inputs again (recorded in plan.json)."""

    model: str  # "zoo:gpt-small", "hf:llama" or "path/to/file.py:fn"
    overrides: dict[str, str] = field(default_factory=dict)
    batch_size: int = 8
    seq_len: int = 32
    seed: int = 0

    def to_json(self) -> dict:
        return {"model": self.model, "overrides": dict(sorted(self.overrides.items())),
                "batch_size": self.batch_size, "seq_len": self.seq_len, "seed": self.seed}

    @classmethod
    def from_json(cls, data: dict) -> ModelSpec:
        return cls(data["model"], dict(data["overrides"]), data["batch_size"], data["seq_len"], data["seed"])


# NOTE [model file bytes]
# The sha256 that plan.json records and `run` compares must be of the code that runs. An
# import by file name does not run the file: SourceFileLoader executes a cached
# `__pycache__/*.pyc` whose recorded mtime and size match the source, so a planted .pyc ran
# other code past a matching sha256. A model file is therefore read once per process
# (`model_file_source`), its bytes hashed, and exactly those bytes compiled and executed in a
# fresh module: no bytecode cache is read or written. The bytes are kept by resolved path
# while the file's inode, size, mtime and ctime stay the same, so `partition`'s import and
# hash, and `run`'s hash and import, see the same bytes even where a writer resets the mtime
# (as the .pyc attack did; ctime cannot be set back). Left open: a file rewritten between
# `run`'s hash and its import is read again, and the new bytes run.
_MODEL_FILE_BYTES: dict[str, tuple[tuple[int, ...], bytes]] = {}


def model_file_source(path: Path) -> bytes:
    """The bytes of a model file, read once while it is unchanged (NOTE [model file bytes])."""
    key = str(path.resolve())
    st = os.stat(key)
    stamp = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _MODEL_FILE_BYTES or _MODEL_FILE_BYTES[key][0] != stamp:
        _MODEL_FILE_BYTES[key] = (stamp, Path(key).read_bytes())
    return _MODEL_FILE_BYTES[key][1]


def model_file_sha256(spec: ModelSpec) -> str | None:
    """The sha256 of a file model's file (plan.json records it: NOTE [model files] in runtime/artifacts.py),
    of the bytes that are imported (NOTE [model file bytes]); None for zoo: and hf: models, or a file
    that does not exist."""
    if spec.model.startswith(("zoo:", "hf:")):
        return None
    path = Path(spec.model.rpartition(":")[0])
    return sha256_bytes(model_file_source(path)) if path.is_file() else None


# NOTE [user code exits]
# A model file is the user's code, run at import and when its function builds the model: it
# may call sys.exit() (a script's habit), raise KeyboardInterrupt or another BaseException.
# None of those may end `hetpart partition` silently with status 0 and no output: each becomes
# a HetpartError naming the file and line. A real Ctrl-C is told apart from a KeyboardInterrupt
# the code raised itself by the SIGINT handler installed while it runs; the real one stays an
# interrupt (status 130). What escapes later, from the model's forward while it is traced, the
# CLI reports the same way (`hetpart.cli.main`).


@contextlib.contextmanager
def user_code(what: str) -> Iterator[None]:
    """Run the user's code (`what`: "importing the model file", ...): SystemExit, KeyboardInterrupt it
    raises itself and other BaseExceptions become HetpartError (NOTE [user code exits])."""
    interrupted = []

    def on_sigint(signum, frame):  # noqa: ANN001 - signal's handler signature
        interrupted.append(signum)
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # not the main thread: signals cannot be watched here
        previous = None
    try:
        yield
    except KeyboardInterrupt as err:
        if interrupted or previous is None:
            raise
        raise HetpartError(f"{exit_location(err)}: {what} raised KeyboardInterrupt; remove it from the model "
                           "file (hetpart runs the file's code to build the model)") from None
    except (Exception, Terminated):  # hetpart's own SIGTERM handler: the CLI cleans up and exits 143
        raise
    except BaseException as err:  # SystemExit, GeneratorExit, the user's own BaseException subclasses
        raise HetpartError(f"{exit_location(err)}: {what} {describe_exit(err)}; a model file must not exit or raise "
                           "BaseException: return (nn.Module, tuple_of_example_inputs) instead") from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def describe_exit(err: BaseException) -> str:
    """"called sys.exit(0)" for a SystemExit, "raised Boom: why" otherwise."""
    if isinstance(err, SystemExit):
        return f"called sys.exit({err.code!r})"
    return f"raised {type(err).__name__}" + (f": {err}" if str(err) else "")


def exit_location(err: BaseException) -> str:
    """file:line of the innermost frame `err` went through (where the code exited or raised)."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else "the model"


# NOTE [model file folder]
# A model file may import a module beside it (`from blocks import Block`), as a script run from
# its folder can: while hetpart runs the file's code (its import and FUNCTION's call, at partition
# and at run alike) the file's folder is first on sys.path, and bytecode is not written there. Only
# the model file itself is read as hashed bytes (NOTE [model file bytes]); what it imports is
# imported by Python as usual and is not hashed (README, "Trust model").
@contextlib.contextmanager
def model_folder_on_path(path: Path) -> Iterator[None]:
    """`path`'s folder first on sys.path, and no .pyc written, while the block runs (NOTE [model file folder])."""
    folder = str(path.resolve().parent)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    no_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        yield
    finally:
        sys.dont_write_bytecode = no_bytecode
        if added and folder in sys.path:
            sys.path.remove(folder)


def _load_file_model(spec: ModelSpec) -> tuple[nn.Module, tuple]:
    path_text, sep, func_name = spec.model.rpartition(":")
    if not sep or not path_text or not func_name:
        raise HetpartError(f"model '{spec.model}': expected zoo:NAME, hf:MODEL_TYPE or path/to/file.py:FUNCTION")
    path = Path(path_text)
    if path.is_dir():
        raise HetpartError(f"model file '{path}' is a directory (model '{spec.model}'); give "
                           "path/to/file.py:FUNCTION, zoo:NAME or hf:MODEL_TYPE")
    if not path.is_file():
        raise HetpartError(f"model file '{path}' not found (model '{spec.model}'); give an existing "
                           "path/to/file.py:FUNCTION, zoo:NAME or hf:MODEL_TYPE")
    mod_name = f"hetpart_user_model_{abs(hash(str(path.resolve())))}"
    module = types.ModuleType(mod_name)  # the hashed bytes, no bytecode cache: NOTE [model file bytes]
    module.__file__ = str(path)
    sys.modules[mod_name] = module
    try:
        source = model_file_source(path)
        with user_code("importing the model file"), model_folder_on_path(path):
            exec(compile(source, str(path), "exec", dont_inherit=True), module.__dict__)  # noqa: S102
    except HetpartError:
        raise
    except Exception as err:
        raise HetpartError(f"{path}: importing the model file failed: {type(err).__name__}: {err}") from None
    fn = getattr(module, func_name, None)
    if not callable(fn):
        found = [n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")]
        raise HetpartError(f"{path}: no function '{func_name}' (functions in the file: {', '.join(found) or 'none'})")
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        params = {}
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for key in spec.overrides:
        if key not in params and not accepts_any:
            raise HetpartError(
                f"--set {key}: {path}:{func_name}() has no parameter '{key}' (parameters: {', '.join(params) or 'none'})"
            )
    kwargs: dict[str, object] = dict(spec.overrides)
    if "batch_size" in params and "batch_size" not in kwargs:  # NOTE [file model batch]
        kwargs["batch_size"] = spec.batch_size
    torch.manual_seed(spec.seed)
    try:
        with user_code(f"{func_name}()"), model_folder_on_path(path):
            result = fn(**kwargs)
    except HetpartError:
        raise
    except Exception as err:  # the user's own code failed: show its line, not a traceback
        from hetpart.frontend.export import model_source_line

        where = model_source_line(err) or f"{path}:{func_name}()"
        raise HetpartError(f"{where}: building the model failed: {type(err).__name__}: {err}") from None
    if (not isinstance(result, tuple) or len(result) != 2 or not isinstance(result[0], nn.Module)
            or not isinstance(result[1], tuple)):
        got = type(result).__name__ if not isinstance(result, tuple) else (
            f"a tuple of {len(result)}: ({', '.join(type(r).__name__ for r in result[:4])})")
        raise HetpartError(f"{path}:{func_name}() must return (nn.Module, tuple_of_example_inputs) (got {got})")
    return result[0].eval(), result[1]


# NOTE [file model batch]
# The plan's costs, its microbatches and `hetpart run`'s split of the inputs all follow
# --batch-size, but a file model's FUNCTION builds its example inputs at a batch of its own:
# a mismatch would plan fine and crash the first rank at run time (pipelining's "Expecting 4
# arg_mbs but got 2"). A FUNCTION with a `batch_size` parameter is called with --batch-size
# (as an int; an explicit `--set batch_size=...` wins), so it builds its inputs at any batch,
# `hetpart run --batch-size` too; otherwise dim 0 of every example input must be --batch-size,
# checked after tracing (a model that cannot be traced says so first).
def check_example_batch(spec: ModelSpec, inputs: tuple[torch.Tensor, ...], flag: str = "--batch-size") -> None:
    """Refuse a file model whose example inputs are not at the spec's batch (NOTE [file model batch])."""
    if spec.model.startswith(("zoo:", "hf:")):
        return  # their inputs are built at spec.batch_size
    batches = [(i, x.shape[0]) for i, x in enumerate(inputs) if x.dim() > 0]
    wrong = [(i, b) for i, b in batches if b != spec.batch_size]
    if not wrong:
        return
    path, _, fn = spec.model.rpartition(":")
    found = ", ".join(f"input {i}: {b}" for i, b in wrong)
    same = {b for _, b in batches}
    fix = f"pass {flag} {same.pop()}" if len(same) == 1 else "give every example input the same batch (dim 0)"
    raise HetpartError(f"{path}:{fn}() returns example inputs whose batch (dim 0) is not {flag} {spec.batch_size} "
                       f"({found}): the plan and `hetpart run` split the inputs by {flag}; {fix}, or give {fn}() a "
                       f"`batch_size` parameter (hetpart calls it with {flag})")


def param_bytes(module: nn.Module) -> int:
    """Bytes of the module's parameters, each shared one counted once."""
    return sum(p.numel() * p.element_size() for p in module.parameters())


def available_memory_bytes() -> int:
    """Memory this machine can still give (MemAvailable), or the physical size where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def load_for_tracing(spec: ModelSpec, meta: bool | None = None) -> tuple[nn.Module, tuple[torch.Tensor, ...], bool]:
    """The model to trace, its example inputs, and whether its parameters are on meta.

    `meta=None` decides: the model is first built on meta (no weight memory); if its
    parameters would take more than half of the memory available, it stays there
    (tracing and the passes roughly double what the weights take), else it is built
    for real. Zoo models that are meta-only always stay on meta.
    """
    if meta is False:
        module, inputs = load_model(spec)
        return module, inputs, any(p.is_meta for p in module.parameters())
    module, inputs = load_model(spec, meta=True)
    if meta is None and param_bytes(module) <= available_memory_bytes() // 2:
        real, inputs = load_model(spec)
        if not any(p.is_meta for p in real.parameters()):
            return real, inputs, False
    return module, inputs, True


def checkpoint_names(module: nn.Module) -> dict[str, list[str]]:
    """Each parameter and buffer name -> the names a checkpoint may store it under.

    Tied weights have several names and a checkpoint keeps one of them; a wrapper
    (`HFModel`) adds a prefix (`checkpoint_prefix`) that the model's own checkpoints lack.
    """
    prefix = getattr(module, "checkpoint_prefix", "")
    by_tensor: dict[int, list[str]] = {}
    for name, t in [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]:
        by_tensor.setdefault(id(t), []).append(name)
    names: dict[str, list[str]] = {}
    for aliases in by_tensor.values():
        keys = [a.removeprefix(prefix) for a in aliases if prefix and a.startswith(prefix)] + aliases
        for a in aliases:
            names[a] = list(dict.fromkeys(keys))
    return names


def load_model(spec: ModelSpec, meta: bool = False) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Build the model of `spec` (deterministic for its seed) and its example inputs.

    `meta`: parameters on the meta device, no weight memory (NOTE [meta build]);
    buffers and example inputs are real.
    """
    if meta:
        with params_on_meta():
            return load_model(spec)
    if spec.batch_size < 2:
        raise HetpartError(f"--batch-size must be at least 2 (got {spec.batch_size}): a batch of 1 cannot be traced as dynamic")
    if spec.seq_len < 1:
        raise HetpartError(f"--seq-len must be positive (got {spec.seq_len})")
    if spec.model.startswith("zoo:"):
        module, inputs = build_zoo(spec.model.removeprefix("zoo:"), spec.overrides, spec.batch_size, spec.seq_len, spec.seed)
    elif spec.model.startswith("hf:"):
        from hetpart.frontend.hf import build_hf  # imports transformers: only when asked for

        module, inputs = build_hf(spec.model.removeprefix("hf:"), spec.overrides, spec.batch_size, spec.seq_len,
                                  spec.seed)
    else:
        module, inputs = _load_file_model(spec)
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor):
            raise HetpartError(f"model '{spec.model}': example input {i} is {type(x).__name__!r}, not a tensor; "
                               "return the example inputs as a tuple of tensors")
    return module, inputs


# Config fields that bound the sequence length (position tables, RoPE caches), across the zoo and HF.
SEQ_LIMIT_FIELDS = ("max_position_embeddings", "n_positions", "max_seq_len", "block_size", "max_position")


@dataclass(frozen=True)
class SequenceAxes:
    """Which of a model's example inputs have the sequence length as dim 1, and its bounds.

    `inputs[i]` is True where input i's dim 1 follows `--seq-len`; `max` is the longest
    sequence the model's config allows (None: unbounded). `why` says why no input has one.
    """

    inputs: tuple[bool, ...]
    max: int | None = None
    why: str | None = None


def _inputs_only(spec: ModelSpec, seq_len: int) -> tuple[tuple[torch.Tensor, ...], object] | None:
    """The example inputs of `spec` at `seq_len` and the model's config, without building the model."""
    if spec.model.startswith("zoo:"):
        from hetpart.models import apply_overrides, zoo_model

        entry = zoo_model(spec.model.removeprefix("zoo:"))
        cfg = apply_overrides(entry.config_cls(), spec.overrides, spec.model)
        return entry.example_inputs(cfg, spec.batch_size, seq_len), cfg
    if spec.model.startswith("hf:"):
        from hetpart.frontend.hf import _config, choose_head, example_inputs

        model_type = spec.model.removeprefix("hf:")
        config = _config(model_type, spec.overrides)
        named = example_inputs(config, choose_head(model_type, config), spec.batch_size, seq_len,
                               torch.Generator().manual_seed(spec.seed))
        return tuple(named.values()), config
    return None


def sequence_axes(spec: ModelSpec, inputs: tuple[torch.Tensor, ...]) -> SequenceAxes:
    """Which inputs of `spec` (traced with `inputs`) have a sequence dimension: the input factory is
    asked for inputs one token longer (or shorter, at the model's limit), and the inputs whose dim 1
    changed with it have one. File models have no `--seq-len`: none."""
    none = (False,) * len(inputs)
    if spec.seq_len < 2:
        return SequenceAxes(none, why=f"traced at --seq-len {spec.seq_len} (a length of 1 is specialized)")
    with torch.random.fork_rng(devices=[]):  # zoo factories draw from the global generator
        probe = _inputs_only(spec, spec.seq_len)
    if probe is None:
        return SequenceAxes(none, why="a file model's inputs do not follow --seq-len")
    cfg = probe[1]
    limits = [getattr(cfg, k) for k in SEQ_LIMIT_FIELDS if isinstance(getattr(cfg, k, None), int)]
    limit = min(limits) if limits else None
    other = spec.seq_len + 1 if limit is None or spec.seq_len < limit else spec.seq_len - 1
    if other < 2:
        return SequenceAxes(none, why=f"the model takes sequences of at most {limit}")
    with torch.random.fork_rng(devices=[]):
        longer = _inputs_only(spec, other)[0]
    axes = tuple(len(a.shape) >= 2 and len(b.shape) == len(a.shape) and a.shape[1] == spec.seq_len
                 and b.shape[1] == other and a.shape[:1] + a.shape[2:] == b.shape[:1] + b.shape[2:]
                 for a, b in zip(inputs, longer))
    if not any(axes):
        return SequenceAxes(none, why="no input has a sequence dimension (dim 1 does not follow --seq-len)")
    return SequenceAxes(axes, max=limit)
