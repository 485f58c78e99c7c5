"""Signed cache tiers: under a team key, only entries written by a key holder are served.

Binding (binding.py) proves an entry is the one its key names wherever that can be recomputed
from the entry itself. Two things cannot: a NEFF (native code for the device, built from the
module by neuronx-cc) and an FX index entry that is consistent with itself but was written for
another graph. Whoever can write a shared tier can plant either. With a team key, every manifest
carries an HMAC-SHA256 (standard library ``hmac``) over everything in it but its checksum; the
manifest lists the sha256 of every file, so the MAC covers the files too. Readers of a covered
tier refuse an entry that is unsigned, signed with another key, or altered after signing.

Settings (parsed here, once, like every cache setting):

- ``NEURON_COMPILE_CACHE_SIGNING_KEY``: path of the key file (at least 32 bytes of secret; make
  one with ``neuron-compile cache keygen PATH``). Not the key itself: environments leak into
  logs and process listings. The file must not be readable or writable by others, nor writable
  by the group.
- ``NEURON_COMPILE_CACHE_SIGNED_TIERS``: ``shared`` (default: the remote tier and ``cache
  import``) or ``all`` (the local tier too).

Writers holding the key sign everything they write, promote or export. A key file that cannot
be used never means "unsigned": the tiers it should cover are not read (fail closed), with one
NC404 warning. Pure stdlib.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_SIGNING_KEY = "NEURON_COMPILE_CACHE_SIGNING_KEY"
ENV_SIGNED_TIERS = "NEURON_COMPILE_CACHE_SIGNED_TIERS"
ALGORITHM = "hmac-sha256"
MIN_KEY_BYTES = 32
_MAX_KEY_FILE = 4096
#: Which tiers each ``NEURON_COMPILE_CACHE_SIGNED_TIERS`` value covers.
TIER_SETS = {
    "shared": frozenset({"remote", "import"}),
    "all": frozenset({"remote", "import", "local"}),
}


@dataclass(frozen=True)
class Signer:
    """A team key and the tiers it covers; ``problem`` names why the key is unusable (then
    nothing is signed and every covered tier is refused)."""

    key: bytes = field(repr=False)
    tiers: frozenset[str]
    path: str
    problem: str | None = None

    @property
    def key_id(self) -> str:
        """Names the key in manifests and messages without revealing it."""
        return hashlib.sha256(b"neuron-compile key id\0" + self.key).hexdigest()[:16]

    def covers(self, tier: str) -> bool:
        return tier in self.tiers

    def signature(self, manifest: dict[str, Any]) -> dict[str, str]:
        return {"alg": ALGORITHM, "key_id": self.key_id, "mac": self._mac(manifest)}

    def refusal(self, manifest: dict[str, Any]) -> str | None:
        """Why ``manifest`` is not signed by this key, or None if it is."""
        if self.problem is not None:
            return f"the signing key is unusable ({self.problem})"
        sig = manifest.get("signature")
        if not isinstance(sig, dict):
            return "unsigned, and this tier requires the team key's signature"
        if sig.get("alg") != ALGORITHM or sig.get("key_id") != self.key_id:
            return f"signed with another key ({sig.get('alg')}, id {sig.get('key_id')})"
        if not hmac.compare_digest(str(sig.get("mac", "")), self._mac(manifest)):
            return "its signature does not match its contents (altered after signing)"
        return None

    def _mac(self, manifest: dict[str, Any]) -> str:
        return hmac.new(self.key, signed_body(manifest), hashlib.sha256).hexdigest()


def signed_body(manifest: dict[str, Any]) -> bytes:
    """What a signature covers: the whole manifest (key, components, every file's sha256, ...)
    except its checksum and the signature itself."""
    body = {k: v for k, v in manifest.items() if k not in ("checksum", "signature")}
    return json.dumps(body, sort_keys=True).encode()


def read_key(path: Path) -> bytes:
    """The secret in ``path``; ValueError saying what is wrong with the file."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise ValueError(f"cannot open it ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("it is not a regular file")
        if st.st_mode & 0o027:
            raise ValueError(
                f"its mode {oct(st.st_mode & 0o777)} lets others read it or others change it "
                "(chmod 600, or 640 for a team group)"
            )
        if st.st_uid not in (os.geteuid(), 0):
            raise ValueError(f"it is owned by uid {st.st_uid}, not by you or root")
        data = os.read(fd, _MAX_KEY_FILE + 1)
    finally:
        os.close(fd)
    secret = data.strip()
    if len(data) > _MAX_KEY_FILE or len(secret) < MIN_KEY_BYTES:
        raise ValueError(f"it must hold {MIN_KEY_BYTES} to {_MAX_KEY_FILE} bytes of secret")
    return secret


def make_signer(path: str, tiers: str) -> Signer:
    """The signer of the settings; an unusable key file gives a signer that refuses (``problem``)."""
    covered = TIER_SETS[tiers]
    try:
        return Signer(read_key(Path(path).expanduser()), covered, path)
    except (ValueError, RuntimeError) as exc:  # RuntimeError: '~nobody' in the path
        return Signer(b"", covered, path, problem=f"{ENV_SIGNING_KEY}={path}: {exc}")


def write_new_key(path: Path) -> str:
    """Create ``path`` (mode 600, never overwritten) holding a fresh 256-bit key; its key id."""
    secret = secrets.token_hex(32).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, secret + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    return Signer(secret, frozenset(), str(path)).key_id
