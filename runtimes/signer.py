"""Signing a bundle in place (``export --sign`` on a fresh one, ``tune --sign``, or by hand): it sits above
both what is signed (runtimes/manifest.py, which checks signatures when it loads a bundle) and the
signature's format and keys (runtimes/signing.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .fsutil import atomic_write_bytes
from .manifest import check_plain, parse_manifest, read_manifest_bytes, verify_files
from .signing import SIGNATURE_NAME, load_private_key, signature_document


def sign_bundle(bundle: str | os.PathLike[str], private_key: str | os.PathLike[str]) -> str:
    """Sign ``bundle`` in place: its manifest.sig (written atomically) over the manifest, after every
    path and file of the bundle was checked against it. Returns the key's fingerprint. ``export --sign``
    calls this (and ``tune --sign`` is meant to)."""
    key = load_private_key(private_key)  # before the bundle is read: a bad key is the cheap failure
    bundle = Path(bundle)
    data = read_manifest_bytes(bundle)
    verify_files(bundle, parse_manifest(data, bundle))  # a signature vouches for what is there
    check_plain(bundle)
    doc = signature_document(data, key)
    atomic_write_bytes(bundle / SIGNATURE_NAME, doc)
    return str(json.loads(doc)["key"])
