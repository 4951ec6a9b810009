"""Signed bundles on the emulated Raspberry Pi 4 (marker ``emulated``; the session's board from conftest):
`devices trust-key` installs the aarch64 wheels of cryptography offline and pins a key, then the board runs
only bundles signed by it. The host-side and loopback-sshd tests are in tests/test_trust_signing.py."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_one_error, emu_scp, emu_ssh, keygen, qe
from test_trust_signing import _fingerprint, _flip, _sha

from quarl_edge.devices.profiles import load_profile
from quarl_edge.runtimes.signer import sign_bundle


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    """(trusted, untrusted) private keys made by ssh-keygen; KEY.pub beside each."""
    return keygen(tmp_path / "signing_key", "release"), keygen(tmp_path / "other_key", "someone")


@pytest.mark.emulated
@pytest.mark.timeout(1800)
def test_an_emulated_pi_gets_cryptography_from_trust_key_and_runs_only_signed_bundles(
    emu_board: Any, keys: tuple[Path, Path], cartpole_bundle: Path, tmp_path: Path
) -> None:
    good, _ = keys
    signed = Path(shutil.copytree(cartpole_bundle, tmp_path / "signed"))
    sign_bundle(signed, good)
    py = shlex.quote(load_profile("rpi4-emu").python)
    freeze = f"{py} -m pip list --format=freeze --disable-pip-version-check"
    before = set(emu_ssh(emu_board, freeze).stdout.split())
    try:
        r = qe("devices", "trust-key", "rpi4-emu", f"{good}.pub", "--json")
        assert r.returncode == 0, r.stderr[-2000:]
        t = json.loads(r.stdout)
        assert (
            t["added"]
            and t["fingerprint"] == _fingerprint(Path(f"{good}.pub"))
            and t["trusted"] == [t["fingerprint"]]
        )
        print(f"\n[emulated rpi4] trust-key: cryptography {t['installed'] or 'was there'}")
        r = qe("deploy", "--bundle", cartpole_bundle, "--device", "rpi4-emu", "--model", "onnx-int8")
        assert "is not signed, and rpi4-emu accepts signed bundles only" in assert_one_error(r)
        r = qe(
            "deploy",
            "--bundle",
            signed,
            "--device",
            "rpi4-emu",
            "--model",
            "onnx-int8",
            "--name",
            "signed",
            "--json",
        )
        assert r.returncode == 0, r.stderr[-2000:]
        d = json.loads(r.stdout)
        run = emu_ssh(emu_board, d["usage"].split(": ", 1)[1])  # the printed line, pasted on the board
        assert run.returncode == 0 and run.stdout.strip() in ("0", "1"), run.stderr[-2000:]
        # the board itself, for a bundle whose manifest changed after signing (the host not asked)
        tampered = Path(shutil.copytree(signed, tmp_path / "tampered"))
        _flip(tampered / "manifest.json", '"created": "2', '"created": "3')
        emu_scp(emu_board, [tampered], "/tmp/")
        code = ("import sys; from quarl_edge.runtimes import load_policy\n"
                "try:\n    load_policy('/tmp/tampered', model='onnx-int8')\n"
                "except Exception as e:\n    print(type(e).__name__, e); sys.exit(2)\n")  # fmt: skip
        r = emu_ssh(emu_board, f"{py} -I -c {shlex.quote(code)}")
        assert (
            r.returncode == 2
            and r.stdout.startswith("IntegrityError")
            and "signs another manifest" in r.stdout
        )
    finally:  # the cached rootfs stays as it was built
        key = _sha(signed / "manifest.json")
        emu_ssh(emu_board, f"rm -rf /tmp/tampered .config/quarl-edge/trusted_keys .local/share/quarl-edge/bundles/signed "
                            f".cache/quarl-edge/bundles/{key}*")  # fmt: skip
        added = set(emu_ssh(emu_board, freeze).stdout.split()) - before
        names = [p.split("==")[0] for p in added]
        if names:
            emu_ssh(emu_board, f"{py} -m pip uninstall -y -q {' '.join(map(shlex.quote, names))}")
