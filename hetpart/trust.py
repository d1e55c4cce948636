"""Integrity of an artifacts directory: sha256 of plain files, and HMAC-SHA256 signatures of manifest.json.

NOTE [artifacts are code]
An artifacts directory is code: `run` executes every rank's `stage.py`, and
`torch.export.load` on a `stage.pt2` unpickles. So `run` reads nothing that
manifest.json does not list with its sha256 (plan.json included), and the
manifest is the root of trust:

- the launcher checks the manifest's structure and every listed file before
  torchrun starts; each rank checks its own files again before it executes its
  `stage.py`, and executes the very bytes it hashed (never a cached `.pyc`);
- a file in a rank directory that the manifest does not list is refused, and so
  is a listed file that is missing, a symbolic link, or not a regular file (a
  link could point anywhere, and could change after the check);
- plan.json's model is a path on the partitioning machine: `run` imports a model
  file only when the user names it (`--model FILE.py:FN`, compared with the
  sha256 plan.json recorded, or `--trust-model-file`);
- `weights.safetensors` is hashed, then read by `stage.py` from its path: a file
  swapped in between is data (safetensors holds no code), never code;
- hashes catch a corrupted or partly edited directory, not one rewritten whole
  (the manifest re-hashed): that needs a signature. `partition --sign-key FILE`
  writes `manifest.json.hmac`, the HMAC-SHA256 of manifest.json's bytes under a
  secret key; `run --key FILE` refuses a directory whose signature is missing or
  wrong. It proves that someone holding the key wrote this manifest (origin), and
  through its hashes every file run reads. It proves nothing about what the key's
  holder partitioned, nor that the directory is the latest one signed (an older
  signed directory still verifies), and anyone who can check it can also sign.

This module imports only the stdlib, `errors` and `fsio` (its one write goes through
`atomic_write`), so codegen (which writes) and the runtime (which reads) share it.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import stat
from pathlib import Path

from hetpart.errors import HetpartError
from hetpart.fsio import atomic_write

# manifest.json's format; 2: the top-level `files` hashes plan.json, launch.sh and ir/ (1 hashed rank files only)
MANIFEST_FORMAT_VERSION = 2
# 3: a plan whose tensor-parallel stages have different degrees (NOTE [mixed-degree pipeline] in
# runtime/tp_pipeline.py); written only for such plans, so every other directory stays version 2 and an
# earlier hetpart refuses a version-3 one by its version instead of misreading its mesh.
MIXED_FORMAT_VERSION = 3
SIGNATURE_NAME = "manifest.json.hmac"  # beside manifest.json
SIGNATURE_SCHEME = "hmac-sha256"
MIN_KEY_BYTES = 32  # HMAC-SHA256's block of security: a shorter key is easier to guess than the hash
MAKE_A_KEY = "make one with `python -c \"import secrets; print(secrets.token_hex(32))\" > KEY`"


class NotAPlainFile(Exception):
    """A path that is missing, a symbolic link, or not a regular file: `reason` says which."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _open_plain(path: Path) -> int:
    """A read-only descriptor of `path`, refusing a symbolic link as its last part and anything
    but a regular file (O_NONBLOCK: a FIFO would block the open)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        if err.errno in (errno.ENOENT, errno.ENOTDIR):
            raise NotAPlainFile("missing") from None
        if err.errno == errno.ELOOP:
            raise NotAPlainFile("a symbolic link") from None
        raise NotAPlainFile(f"unreadable ({err.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotAPlainFile("not a regular file")
    return fd


def read_plain(path: Path) -> bytes:
    """The bytes of a regular file that is not a symbolic link (else NotAPlainFile)."""
    with os.fdopen(_open_plain(path), "rb") as f:
        return f.read()


def sha256_file(path: Path) -> str:
    """The sha256 of a regular file that is not a symbolic link, read in 1 MiB chunks (else NotAPlainFile)."""
    h = hashlib.sha256()
    with os.fdopen(_open_plain(path), "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_sha256(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def read_key(path: Path, out: Path | None = None, role: str = "it signs") -> bytes:
    """A signing key from `path`: its bytes less a trailing newline, at least MIN_KEY_BYTES of them.

    A key inside `out` (the directory it signs or checks, as `role` says) is refused: whoever can
    change the directory could then re-sign it.
    """
    if out is not None:
        check_key_outside(path, out, role)
    try:
        key = read_plain(path).rstrip(b"\r\n")
    except NotAPlainFile as err:
        raise HetpartError(f"key file '{path}' is {err.reason}; pass a file holding a secret key ({MAKE_A_KEY})"
                           ) from None
    if len(key) < MIN_KEY_BYTES:
        raise HetpartError(f"key file '{path}' holds {len(key)} byte(s); a signing key needs at least "
                           f"{MIN_KEY_BYTES} ({MAKE_A_KEY})")
    return key


def check_key_outside(path: Path, directory: Path, role: str = "it signs") -> None:
    """Refuse a key file inside `directory` (the one it signs or checks, as `role` says): whoever can change the
    directory could then re-sign it."""
    if path.resolve().is_relative_to(directory.resolve()):
        raise HetpartError(f"key file '{path}' is inside '{directory}', the directory {role}: anyone who can change "
                           "the directory could re-sign it; keep the key elsewhere")


def signature(data: bytes, key: bytes) -> str:
    """The signature line of `data`: `hmac-sha256 <hex digest>`."""
    return f"{SIGNATURE_SCHEME} {hmac.new(key, data, hashlib.sha256).hexdigest()}"


def write_signature(out: Path, key: bytes) -> None:
    """Sign `out/manifest.json` into `out/manifest.json.hmac` (written beside it and renamed into place)."""
    atomic_write(out / SIGNATURE_NAME, signature(read_plain(out / "manifest.json"), key) + "\n")


RUN_ADVICE = "do not run it, partition again and sign it"


def check_signature(out: Path, manifest_bytes: bytes, key: bytes, advice: str = RUN_ADVICE) -> None:
    """Refuse `out` unless manifest.json.hmac is the signature of `manifest_bytes` under `key`; `advice`: what the
    refusal says to do (the command's: `replan` reads OLD_DIR to plan from it, it runs nothing)."""
    path = out / SIGNATURE_NAME
    try:
        recorded = read_plain(path).decode("ascii", errors="replace").strip()
    except NotAPlainFile as err:
        raise HetpartError(f"'{path}' is {err.reason}: '{out}' is not signed, and --key asks for a signed "
                           "directory; sign it with `hetpart partition ... --sign-key KEY` (or shard-weights "
                           "--sign-key), or leave --key out to run it unsigned") from None
    # Two lines while shard-weights commits: the old manifest's and the new one's (NOTE [shard-weights commit]).
    expected = signature(manifest_bytes, key).encode()
    if not any([hmac.compare_digest(line.strip().encode(), expected) for line in recorded.splitlines()[:2]]):
        raise HetpartError(f"'{path}': the signature of manifest.json does not match this key: the directory "
                           f"was changed after it was signed, or signed with another key; {advice}")


def is_signed(out: Path) -> bool:
    return os.path.lexists(out / SIGNATURE_NAME)
