"""Signed bundles (issue 27, scope 4): export signs the manifest with an ed25519 key; a machine that
trusts keys (``devices trust-key`` on a board) accepts only bundles signed by one of them, in deploy,
bench, the runner and ``load_policy``; a flipped byte in a signed manifest is refused.

The ed25519 arithmetic is the ``cryptography`` package's; keys are made by ``ssh-keygen`` as the docs
say. The board is this machine through a real sshd with a login directory of its own (conftest ``board``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import SSHD, Board, assert_one_error, keygen

from quarl_edge.deploy import DEPLOYED, deploy
from quarl_edge.devices.profiles import load_profile
from quarl_edge.devices.remote import SSHTransport
from quarl_edge.devices.ssh import SSHConnection, sh
from quarl_edge.runtimes import load_policy
from quarl_edge.runtimes.board import stream_bundle
from quarl_edge.runtimes.errors import InputError, IntegrityError, QuarlError
from quarl_edge.runtimes.signer import sign_bundle
from quarl_edge.runtimes.signing import (
    TRUST_FILE,
    check_signature,
    public_key_line,
    signed_by,
    trust_file,
)


def _fingerprint(pub: Path) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True).stdout
    return out.split()[1]


def _trust(home: Path, *pubs: Path) -> None:
    path = home / TRUST_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# keys this machine trusts\n" + "".join(p.read_text() for p in pubs))


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    return h


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    """(trusted, untrusted) private keys made by ssh-keygen; KEY.pub beside each."""
    return keygen(tmp_path / "signing_key", "release"), keygen(tmp_path / "other_key", "someone")


def _flip(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_a_machine_that_trusts_keys_loads_only_bundles_they_signed(
    home: Path, keys: tuple[Path, Path], cartpole_bundle: Path, tmp_path: Path
) -> None:
    good, other = keys
    signed = Path(shutil.copytree(cartpole_bundle, tmp_path / "signed"))
    assert sign_bundle(signed, good) == _fingerprint(Path(f"{good}.pub")) == signed_by(signed)
    doc = json.loads((signed / "manifest.sig").read_text())
    assert doc["format"] == "quarl-edge/signature" and doc["algorithm"] == "ed25519"
    by_other = Path(shutil.copytree(cartpole_bundle, tmp_path / "by-other"))
    sign_bundle(by_other, other)
    unsigned = cartpole_bundle
    obs = np.zeros(4, np.float32)

    # no trusted keys: everything loads; asking for a signature is refused (nothing to check it with)
    assert not trust_file().exists()
    for b in (unsigned, signed, by_other):
        load_policy(b, model="onnx-int8").act(obs)
    with pytest.raises(IntegrityError, match="this machine trusts no key"):
        load_policy(signed, model="onnx-int8", require_signature=True)

    _trust(home, Path(f"{good}.pub"))
    for b in (signed,):
        for required in (False, True):
            assert load_policy(b, model="onnx-int8", require_signature=required).act(obs) in (0, 1)
    refusals = {
        unsigned: "is not signed, and this machine accepts signed bundles only",
        by_other: f"is signed by '{_fingerprint(Path(f'{other}.pub'))}', a key this machine does not trust",
    }
    for b, why in refusals.items():
        for required in (False, True):
            with pytest.raises(IntegrityError) as e:
                load_policy(b, model="onnx-int8", require_signature=required)
            assert why in str(e.value) and "\n" not in str(e.value)

    # a flipped byte in the signed manifest, with its sha256 in manifest.sig made to match: the
    # signature itself refuses it; a flipped byte in the signature too
    tampered = Path(shutil.copytree(signed, tmp_path / "tampered"))
    _flip(tampered / "manifest.json", '"created": "2', '"created": "3')
    with pytest.raises(IntegrityError, match="manifest.sig signs another manifest.json"):
        load_policy(tampered, model="onnx-int8")
    data = (tampered / "manifest.json").read_bytes()
    sig = json.loads((tampered / "manifest.sig").read_text())
    sig["manifest_sha256"] = hashlib.sha256(data).hexdigest()
    (tampered / "manifest.sig").write_text(json.dumps(sig))
    with pytest.raises(IntegrityError, match="the signature does not match its manifest.json"):
        check_signature(tampered, data)
    sig_bad = Path(shutil.copytree(signed, tmp_path / "sig-bad"))
    doc["signature"] = ("A" if doc["signature"][0] != "A" else "B") + doc["signature"][1:]
    (sig_bad / "manifest.sig").write_text(json.dumps(doc))
    with pytest.raises(IntegrityError, match="the signature does not match"):
        load_policy(sig_bad, model="onnx-int8")
    # a typo in the trust file is an error, never a silently open machine
    (home / TRUST_FILE).write_text("ssh-ed25519 not-base64!\n")
    with pytest.raises(InputError, match="is not an ed25519 public key line"):
        load_policy(unsigned, model="onnx-int8")


def test_keys_other_tools_make_and_keys_that_cannot_sign(
    home: Path, keys: tuple[Path, Path], cartpole_bundle: Path, tmp_path: Path
) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

    # a PEM key pair (what `openssl genpkey -algorithm ed25519` writes) signs and is trusted as well
    pem = ed25519.Ed25519PrivateKey.generate()
    (tmp_path / "k.pem").write_bytes(pem.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))  # fmt: skip
    (tmp_path / "k.pem").chmod(0o600)
    (tmp_path / "k.pub.pem").write_bytes(pem.public_key().public_bytes(serialization.Encoding.PEM,
                                                                       serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    b = Path(shutil.copytree(cartpole_bundle, tmp_path / "b"))
    fp = sign_bundle(b, tmp_path / "k.pem")
    assert public_key_line(tmp_path / "k.pub.pem")[0] == fp
    (home / TRUST_FILE).parent.mkdir(parents=True)
    (home / TRUST_FILE).write_text(public_key_line(tmp_path / "k.pub.pem")[1] + "\n")
    assert check_signature(b, (b / "manifest.json").read_bytes()) == fp

    good, _ = keys
    locked = tmp_path / "locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(locked)], check=True)
    rsa_key = tmp_path / "rsa"
    rsa_key.write_bytes(rsa.generate_private_key(65537, 2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))  # fmt: skip
    rsa_key.chmod(0o600)
    loose = Path(shutil.copy(good, tmp_path / "loose"))
    loose.chmod(0o644)
    for key, why in ((locked, "protected by a passphrase"), (rsa_key, "is not an ed25519 private key"),
                     (loose, "accessible by others (mode 0644); chmod 600"), (tmp_path / "none", "does not exist")):  # fmt: skip
        before = (b / "manifest.sig").read_bytes()
        with pytest.raises(InputError, match=re.escape(why)) as e:
            sign_bundle(b, key)
        assert "\n" not in str(e.value) and (b / "manifest.sig").read_bytes() == before
    with pytest.raises(InputError, match="is a private key; it never leaves this machine"):
        public_key_line(good)


def test_export_sign_writes_the_signature_with_the_bundle(
    cli: Any, keys: tuple[Path, Path], cartpole_policy: Path, cartpole_calib: Path, tmp_path: Path
) -> None:
    good, _ = keys
    p = cli("export", "--policy", cartpole_policy, "--calibration", cartpole_calib, "--to", "onnx-int8",
            "--out", "b", "--sign", good)  # fmt: skip
    assert p.returncode == 0, p.stderr
    fp = _fingerprint(Path(f"{good}.pub"))
    assert f"signed by {fp} (manifest.sig)" in p.stderr
    doc = json.loads((tmp_path / "b" / "manifest.sig").read_text())
    assert doc["key"] == fp and doc["manifest_sha256"] == _sha(tmp_path / "b" / "manifest.json")
    # a bad key fails before anything is exported, and leaves no bundle
    line = assert_one_error(cli("export", "--policy", cartpole_policy, "--calibration", cartpole_calib,
                                "--to", "onnx-int8", "--out", "c", "--sign", f"{good}.pub"))  # fmt: skip
    assert "is a public key; it cannot sign" in line and not (tmp_path / "c").exists()


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


# ---- a board that requires signatures, over a real sshd ----------------------------------------------

board_tier = pytest.mark.skipif(
    not SSHD.is_file(), reason="needs OpenSSH's sshd (apt-get install openssh-server)"
)


@board_tier
@pytest.mark.ssh
def test_a_board_set_up_with_trust_key_accepts_only_signed_bundles(
    cli: Any, board: Board, on_board: str, keys: tuple[Path, Path], cartpole_bundle: Path, tmp_path: Path
) -> None:
    good, other = keys
    signed = Path(shutil.copytree(cartpole_bundle, tmp_path / "signed"))
    sign_bundle(signed, good)
    by_other = Path(shutil.copytree(cartpole_bundle, tmp_path / "by-other"))
    sign_bundle(by_other, other)
    tampered = Path(shutil.copytree(signed, tmp_path / "tampered"))
    _flip(tampered / "manifest.json", '"created": "2', '"created": "3')
    fresh = Path(shutil.copytree(cartpole_bundle, tmp_path / "fresh"))  # unsigned, not cached there yet
    manifest = json.loads((fresh / "manifest.json").read_text())
    manifest["models"] = [m for m in manifest["models"] if m["name"] != "onnx-fp16"]
    (fresh / "manifest.json").write_text(json.dumps(manifest))
    # cached on the board before it required signatures: its runner and deploy's check must refuse it later
    early = cli(
        "deploy", "--bundle", cartpole_bundle, "--device", on_board, "--model", "onnx-int8", "--name", "early"
    )
    assert early.returncode == 0, early.stderr
    try:
        line = assert_one_error(cli("devices", "trust-key", on_board, good))
        assert "is a private key; it never leaves this machine" in line
        p = cli("devices", "trust-key", on_board, f"{good}.pub")
        assert p.returncode == 0, p.stderr
        fp = _fingerprint(Path(f"{good}.pub"))
        assert (
            f"{fp} added; the board now accepts only bundles signed by one of its 1 trusted key(s)"
            in p.stderr
        )
        assert Path(f"{good}.pub").read_text().split()[1] in (board.home / TRUST_FILE).read_text()
        assert "was already there" in cli("devices", "trust-key", on_board, f"{good}.pub").stderr

        why = {fresh: "is not signed, and board accepts signed bundles only", cartpole_bundle: "is not signed",
               by_other: "a key board does not trust", tampered: "manifest.sig signs another manifest.json"}  # fmt: skip
        for bundle, reason in why.items():
            for args in (("deploy", "--bundle", bundle, "--device", on_board, "--model", "onnx-int8"),
                         ("bench", "--bundle", bundle, "--device", on_board, "--episodes", "1",
                          "--latency-samples", "10", "--models", "onnx-int8")):  # fmt: skip
                line = assert_one_error(cli(*args))
                assert reason in line, (args[0], line)
        assert not list((board.home / ".cache/quarl-edge/bundles").glob(f"{_sha(fresh / 'manifest.json')}*"))
        # the board is the authority, whatever a host checks ahead: its receive, its runner on a bundle it
        # cached before it required signatures, and its load_policy refuse them too
        with SSHTransport(load_profile(on_board)) as t:
            t.prepare()
            for bundle, reason in ((fresh, "is not signed, and this machine accepts signed bundles only"),
                                   (tampered, "manifest.sig signs another manifest.json")):  # fmt: skip
                cb = t.describe(bundle)
                files = [(r, (bundle / r).read_bytes()) for r in cb.files]
                cmd = sh(t.python, t.runner_path, "receive", "--dest", cb.remote, *cb.key_args())
                with pytest.raises(QuarlError, match=reason):
                    t.board_command(cmd, "store the bundle", stdin=stream_bundle(files))
            cached = t.describe(cartpole_bundle).remote
            r = t.ssh.run(sh(t.python, t.runner_path, "run", "--bundle", cached, "--model", "onnx-int8"))
            assert r.exit_status == 2 and "is not signed" in r.stdout and "Traceback" not in r.stderr
            code = ("import sys; from quarl_edge.runtimes import load_policy\n"
                    "try:\n    load_policy(sys.argv[1], model='onnx-int8')\n"
                    "except Exception as e:\n    print(type(e).__name__, e); sys.exit(2)\n")  # fmt: skip
            r = t.ssh.run(sh(t.python, "-I", "-c", code, str(board.home / DEPLOYED / "early")))
            assert (
                r.exit_status == 2 and r.stdout.startswith("IntegrityError") and "is not signed" in r.stdout
            )

        d = deploy(signed, on_board, "onnx-int8", name="signed")
        with SSHConnection(load_profile(on_board)) as c:
            r = c.run(d.usage()[0].split(": ", 1)[1])  # the printed line, pasted on the board
        assert r.exit_status == 0 and r.stdout.strip() in ("0", "1"), r.stderr
        p = cli(
            "bench",
            "--bundle",
            signed,
            "--device",
            on_board,
            "--episodes",
            "1",
            "--latency-samples",
            "10",
            "--json",
        )
        assert p.returncode == 0, p.stderr
        assert all(m["latency"]["count"] == 10 for m in json.loads(p.stdout)["models"])
    finally:
        (board.home / TRUST_FILE).unlink(missing_ok=True)


BLOCK = """
import sys
class _NoCrypto:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "cryptography":
            raise ModuleNotFoundError("No module named 'cryptography' (blocked by the test)", name=name)
sys.meta_path.insert(0, _NoCrypto())
"""


def test_the_device_side_imports_cryptography_only_to_check_a_signature(
    home: Path, keys: tuple[Path, Path], cartpole_bundle: Path, tmp_path: Path
) -> None:
    """runtimes/ imports cryptography lazily: a board without it loads bundles as before; one that
    requires signatures says in one line how to install it."""
    import ast

    for f in (Path(__file__).resolve().parent.parent / "runtimes").glob("*.py"):
        top = [n for n in ast.parse(f.read_text()).body if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = [a.name for n in top for a in n.names] + [
            n.module or "" for n in top if isinstance(n, ast.ImportFrom)
        ]
        assert not [n for n in names if n.split(".")[0] == "cryptography"], f
    signed = Path(shutil.copytree(cartpole_bundle, tmp_path / "signed"))
    sign_bundle(signed, keys[0])
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK)
    code = ("import sys; from quarl_edge.runtimes import load_policy\n"
            "from quarl_edge.runtimes.errors import QuarlError\n"
            "try:\n    load_policy(sys.argv[1], model='onnx-int8'); print('loaded')\n"
            "except QuarlError as e:\n    print(f'error: {e}', file=sys.stderr); sys.exit(e.exit_code)\n")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(site), "HOME": str(home)}
    run = [sys.executable, "-c", code, str(signed)]
    p = subprocess.run(run, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "loaded", p.stderr  # no trusted keys: never imported
    _trust(home, Path(f"{keys[0]}.pub"))
    p = subprocess.run(run, capture_output=True, text=True, env=env, timeout=300)
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert (
        "no `cryptography`" in lines[0]
        or "`cryptography` package, which this Python does not have" in lines[0]
    )
    assert "pip install cryptography" in lines[0]


@pytest.mark.slow
def test_tune_sign_measures_and_ships_signed_bundles_where_signatures_are_required(
    home: Path, keys: tuple[Path, Path], cartpole_policy: Path, cartpole_calib: Path, tmp_path: Path
) -> None:
    """On a machine that trusts a key (this one, through HOME), an unsigned tune is refused in one line
    at its first measurement; `tune --sign KEY` measures the signed candidates and ships a bundle signed
    by that key, which load_policy there accepts."""
    from test_tune_inputs import small

    from quarl_edge.tune.search import run_tune

    trusted, _ = keys
    _trust(home, trusted.with_name(trusted.name + ".pub"))
    with pytest.raises(IntegrityError, match="not signed") as e:
        run_tune(small(cartpole_policy, tmp_path / "unsigned", cartpole_calib))
    assert "\n" not in str(e.value)
    out = tmp_path / "signed"
    result = run_tune(small(cartpole_policy, out, cartpole_calib, sign_key=trusted))
    assert result.choice is not None
    assert signed_by(out / "bundle") == _fingerprint(trusted.with_name(trusted.name + ".pub"))
    assert signed_by(result.bundle) == signed_by(out / "bundle")  # the candidates it measured, signed too
    policy = load_policy(out / "bundle", require_signature=True)
    assert policy.info.model == result.choice.name
