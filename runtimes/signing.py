"""Signed bundles: an ed25519 signature over a bundle's manifest, and the keys a machine trusts.

``manifest.sig``, beside ``manifest.json`` (JSON)::

    {"format": "quarl-edge/signature", "schema_version": 1, "algorithm": "ed25519",
     "key": "SHA256:...", "manifest_sha256": "...", "signature": "<base64, 64 bytes>"}

The signature is over ``PREFIX + the exact bytes of manifest.json``; the prefix is ours, so a signature
made with the key can never pass for another protocol's message (an SSH login signed with the same key).
The manifest names the sha256 of every file, so signing it signs the whole bundle. ``key`` is the
public key's fingerprint as OpenSSH prints it (``ssh-keygen -lf KEY.pub``); a verifier looks the key up
by it among the keys it trusts, never trusting a key the signature file brings.

Keys: ``ssh-keygen -t ed25519 -N '' -f KEY`` (KEY signs, KEY.pub is what boards trust); a PEM key from
``openssl genpkey -algorithm ed25519`` works too. The trusted keys of a machine are the ``ssh-ed25519``
lines of ``~/.config/quarl-edge/trusted_keys`` (``quarl-edge devices trust-key DEVICE KEY.pub`` writes
them on a board); a machine with at least one there accepts only bundles signed by one of them:
``load_manifest`` checks, so the runner, ``load_policy`` and the board's cache commands all do.

The ed25519 arithmetic is the ``cryptography`` package's, imported only inside the functions that sign
or verify: the device side otherwise stays numpy + a runtime.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import shlex
import stat
from pathlib import Path
from typing import Any

from .artifact import parse_artifact
from .bundlepath import read_file
from .errors import InputError, IntegrityError, MissingDependencyError

SIGNATURE_FORMAT = "quarl-edge/signature"
SIGNATURE_VERSION = 1
SIGNATURE_NAME = "manifest.sig"
PREFIX = b"quarl-edge bundle manifest signature v1\x00"
KEY_TYPE = "ssh-ed25519"
MAX_KEY_FILE = 64 * 1024
TRUST_FILE = ".config/quarl-edge/trusted_keys"
"""under the home folder: the keys this machine trusts"""
INSTALL = (
    "pip install cryptography (on a host: pip install 'quarl-edge[sign]'; for a board: quarl-edge devices "
    "trust-key DEVICE KEY.pub installs it there)"
)


def trust_file() -> Path:
    """Where this machine's trusted keys are: ``~/.config/quarl-edge/trusted_keys`` (HOME's, whatever
    XDG_CONFIG_HOME says, so every process of the user sees the same requirement)."""
    return Path.home() / TRUST_FILE


def _ssh_string(data: bytes, at: int) -> tuple[bytes, int]:
    if at + 4 > len(data):
        raise ValueError("truncated")
    n = int.from_bytes(data[at : at + 4], "big")
    if at + 4 + n > len(data):
        raise ValueError("truncated")
    return data[at + 4 : at + 4 + n], at + 4 + n


def parse_public_line(line: str, where: str) -> tuple[str, str]:
    """``(fingerprint, "ssh-ed25519 BASE64")`` of an OpenSSH ed25519 public key line; InputError else.
    Its wire form is two length-prefixed strings: the key type and the 32-byte key."""
    parts = line.strip().split()
    try:
        if len(parts) < 2 or parts[0] != KEY_TYPE:
            raise ValueError("not ssh-ed25519")
        blob = base64.b64decode(parts[1], validate=True)
        kind, at = _ssh_string(blob, 0)
        raw, at = _ssh_string(blob, at)
        if kind != KEY_TYPE.encode() or len(raw) != 32 or at != len(blob):
            raise ValueError("not an ed25519 key")
    except (ValueError, binascii.Error):
        raise InputError(f"{where} is not an ed25519 public key line ('ssh-ed25519 AAAA...')",
                         "make keys with: ssh-keygen -t ed25519 -N '' -f KEY (trust KEY.pub)") from None  # fmt: skip
    return fingerprint(blob), f"{KEY_TYPE} {parts[1]}"


def fingerprint(blob: bytes) -> str:
    """OpenSSH's fingerprint of a public key blob: ``SHA256:`` + base64 of its sha256, no padding."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def trusted_keys(path: Path | None = None) -> dict[str, str]:
    """``{fingerprint: key line}`` of the trust file (none: an empty dict). A line that is not an
    ed25519 key is an error, not skipped: a typo must not silently leave a board open."""
    path = path or trust_file()
    try:
        text = path.read_bytes()[: MAX_KEY_FILE + 1]
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise IntegrityError(
            f"cannot read the trusted keys {str(path)!r} ({e.strerror})", "check its permissions"
        ) from None
    if len(text) > MAX_KEY_FILE:
        raise IntegrityError(f"{str(path)!r} is larger than {MAX_KEY_FILE} bytes", "keep one key per line")
    keys = {}
    for i, line in enumerate(text.decode("utf-8", "replace").splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            fp, key = parse_public_line(line, f"line {i} of {str(path)!r}")
            keys[fp] = key
    return keys


def requires_signature() -> bool:
    """True when this machine trusts at least one key: then it accepts signed bundles only."""
    return bool(trusted_keys())


def check_signature(bundle: Path, manifest_bytes: bytes, required: bool = False,
                    trusted: dict[str, str] | None = None, machine: str = "this machine") -> str | None:  # fmt: skip
    """When signatures are ``required`` or this machine requires them: the fingerprint of the trusted
    key whose signature over ``manifest_bytes`` is ``bundle/manifest.sig``; an IntegrityError otherwise.
    None when no signature is required (nothing is read). ``trusted``/``machine``: another machine's
    keys (the host checking ahead for a board: devices/remote.py), named so in the messages."""
    keys = trusted_keys() if trusted is None else trusted
    if not required and not keys:
        return None
    where = f"bundle {str(bundle)!r}"
    store = f"{len(keys)} trusted key(s) in {trust_file() if trusted is None else '~/' + TRUST_FILE}"
    if not keys:
        raise IntegrityError(f"{where} must be signed, but {machine} trusts no key ({store})",
                             "trust one on the board: quarl-edge devices trust-key DEVICE KEY.pub")  # fmt: skip
    try:
        doc = parse_artifact(read_file(bundle, SIGNATURE_NAME, MAX_KEY_FILE), f"{bundle}/{SIGNATURE_NAME}",
                             SIGNATURE_FORMAT, SIGNATURE_VERSION, "bundle signature", "sign the bundle again",
                             error=IntegrityError)  # fmt: skip
    except FileNotFoundError:
        raise IntegrityError(f"{where} is not signed, and {machine} accepts signed bundles only ({store})",
                             "sign it on the host: quarl-edge export ... --sign KEY") from None  # fmt: skip
    key, sig = doc.get("key"), doc.get("signature")
    if doc.get("algorithm") != "ed25519" or not isinstance(key, str) or not isinstance(sig, str):
        raise IntegrityError(f"{where}: manifest.sig is not an ed25519 signature", "sign the bundle again")
    if key not in keys:
        raise IntegrityError(f"{where} is signed by {key[:60]!r}, a key {machine} does not trust",
                             "sign it with a trusted key, or trust that key: quarl-edge devices trust-key DEVICE KEY.pub")  # fmt: skip
    if doc.get("manifest_sha256") != hashlib.sha256(manifest_bytes).hexdigest():
        raise IntegrityError(f"{where}: manifest.sig signs another manifest.json", "sign the bundle again")
    crypto = _crypto()
    try:
        raw = base64.b64decode(keys[key].split()[1])[-32:]
        crypto.Ed25519PublicKey.from_public_bytes(raw).verify(
            base64.b64decode(sig, validate=True), PREFIX + manifest_bytes
        )
    except (crypto.InvalidSignature, ValueError, binascii.Error):
        raise IntegrityError(f"{where}: the signature does not match its manifest.json (changed after signing?)",
                             "re-export the bundle and sign it again") from None  # fmt: skip
    return key


class _Crypto:
    def __init__(self) -> None:
        from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

        self.InvalidSignature, self.UnsupportedAlgorithm = InvalidSignature, UnsupportedAlgorithm
        self.serialization = serialization
        self.Ed25519PrivateKey, self.Ed25519PublicKey = Ed25519PrivateKey, Ed25519PublicKey


def _crypto() -> _Crypto:
    try:
        return _Crypto()
    except ImportError:
        raise MissingDependencyError("signed bundles are checked with the `cryptography` package, which this "
                                     "Python does not have", INSTALL) from None  # fmt: skip


# ---- the host's side: keys and signing --------------------------------------------------------------


def _read_key_file(path: Path, what: str) -> bytes:
    try:
        st = path.stat()
        if st.st_size > MAX_KEY_FILE:
            raise InputError(
                f"{what} {str(path)!r} is larger than {MAX_KEY_FILE} bytes: not a key", "pass the key file"
            )
        return path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{what} {str(path)!r} does not exist",
                         "make a key pair with: ssh-keygen -t ed25519 -N '' -f KEY") from None  # fmt: skip
    except OSError as e:
        raise InputError(
            f"cannot read {what} {str(path)!r} ({e.strerror})", "check its permissions"
        ) from None


def load_private_key(path: str | os.PathLike[str]) -> Any:
    """The ed25519 private key in ``path`` (OpenSSH or PEM, unencrypted, readable by its owner only)."""
    path = Path(path)
    data = _read_key_file(path, "signing key")
    if data.lstrip().startswith((KEY_TYPE.encode(), b"-----BEGIN PUBLIC KEY")):
        raise InputError(f"{str(path)!r} is a public key; it cannot sign",
                         "sign with the private key (KEY, beside KEY.pub); boards trust KEY.pub")  # fmt: skip
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise InputError(
            f"signing key {str(path)!r} is accessible by others (mode {mode:04o})",
            f"chmod 600 {shlex.quote(str(path))}",
        )
    c = _crypto()
    key = None
    for load in (c.serialization.load_ssh_private_key, c.serialization.load_pem_private_key):
        try:
            key = load(data, password=None)
        except TypeError:  # "password was not given but private key is encrypted"
            raise InputError(f"signing key {str(path)!r} is protected by a passphrase",
                             "sign with an unencrypted key kept on the build host: ssh-keygen -t ed25519 -N '' -f KEY") from None  # fmt: skip
        except (ValueError, c.UnsupportedAlgorithm):
            continue
        break
    if not isinstance(key, c.Ed25519PrivateKey):
        raise InputError(f"{str(path)!r} is not an ed25519 private key",
                         "make one with: ssh-keygen -t ed25519 -N '' -f KEY (sign with KEY, trust KEY.pub)")  # fmt: skip
    return key


def public_key_line(path: str | os.PathLike[str]) -> tuple[str, str]:
    """``(fingerprint, "ssh-ed25519 BASE64")`` of the public key in ``path`` (KEY.pub, or a PEM public
    key). A private key is refused: it never leaves the host."""
    path = Path(path)
    data = _read_key_file(path, "public key")
    text = data.decode("utf-8", "replace")
    if "PRIVATE KEY" in text:
        raise InputError(f"{str(path)!r} is a private key; it never leaves this machine",
                         f"pass its public half: {path}.pub")  # fmt: skip
    if "BEGIN PUBLIC KEY" in text:
        c = _crypto()
        try:
            pub = c.serialization.load_pem_public_key(data)
        except ValueError:
            pub = None
        if not isinstance(pub, c.Ed25519PublicKey):
            raise InputError(f"{str(path)!r} is not an ed25519 public key", "pass KEY.pub of an ed25519 key")
        text = pub.public_bytes(
            c.serialization.Encoding.OpenSSH, c.serialization.PublicFormat.OpenSSH
        ).decode()
    return parse_public_line(
        text.strip().splitlines()[0] if text.strip() else "", f"public key {str(path)!r}"
    )


def signature_document(manifest_bytes: bytes, key: Any) -> bytes:
    """The bytes of manifest.sig for these manifest bytes, signed with ``key`` (load_private_key)."""
    c = _crypto()
    pub = key.public_key().public_bytes(
        c.serialization.Encoding.OpenSSH, c.serialization.PublicFormat.OpenSSH
    )
    fp, _ = parse_public_line(pub.decode(), "the signing key's public half")
    doc = {"format": SIGNATURE_FORMAT, "schema_version": SIGNATURE_VERSION, "algorithm": "ed25519", "key": fp,
           "manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest(),
           "signature": base64.b64encode(key.sign(PREFIX + manifest_bytes)).decode()}  # fmt: skip
    return (json.dumps(doc, indent=2) + "\n").encode()


def signed_by(bundle: str | os.PathLike[str]) -> str | None:
    """The fingerprint manifest.sig names (None: unsigned). Informational: check_signature verifies."""
    try:
        doc = json.loads(read_file(Path(bundle), SIGNATURE_NAME, MAX_KEY_FILE))
    except (FileNotFoundError, ValueError):
        return None
    key = doc.get("key") if isinstance(doc, dict) else None
    return key if isinstance(key, str) else None
