"""Any policy in, on the emulated Raspberry Pi 4 (docs/emulated-pi.md): a Dict-observation HER agent
deployed there and driven from a user script by ``load_policy(...).act(obs_dict)``, and an rsl_rl-style
recurrent ONNX (+ io.yaml, a recorded observation file) benched there (latency and action error, reward
"not measured"), gated by --max-action-error, deployed and acting with its state through the runtime API.
Uses the running rpi4-emu when there is one (and leaves it running), else starts it and stops it."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from quarl_edge.devices import emulate, profiles
from quarl_edge.runtimes import load_policy as load_runtime
from quarl_edge.runtimes.fsutil import sha256_file
from quarl_edge.runtimes.trace import load_trace

pytestmark = [pytest.mark.emulated, pytest.mark.slow, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def board() -> Iterator[emulate.Status]:
    from test_devices_emulate import _can_emulate, _emulate

    reason = _can_emulate()
    if reason:
        pytest.skip(reason)
    if emulate.status("rpi4").running:  # someone's board: used, not stopped
        yield emulate.status("rpi4")
        return
    st = _emulate("up")
    try:
        yield st
    finally:
        if emulate.status("rpi4").running:
            emulate.down("rpi4", log=print)


def _deploy(bundle: Path, model: str) -> dict:
    from test_devices_emulate import _qe

    r = _qe("deploy", "--bundle", bundle, "--device", "rpi4-emu", "--model", model, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["check"]["torch_imported"] is False
    return d


def _run_script(board: emulate.Status, script: str, *args: str) -> dict:
    from test_devices_emulate import _ssh

    py = shlex.quote(str(profiles.load_profile("rpi4-emu").python))
    r = _ssh(board, f"{py} -I -c {shlex.quote(script)} {' '.join(shlex.quote(a) for a in args)}")
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _cleanup(board: emulate.Status, bundle: Path, path: str) -> None:
    from test_devices_emulate import _ssh

    sha = sha256_file(bundle / "manifest.json")
    _ssh(board, f"rm -rf {shlex.quote(path)} .cache/quarl-edge/bundles/{sha}")


def test_dict_obs_agent_deployed_and_driven_by_act_obs_dict(board: emulate.Status, tmp_path: Path) -> None:
    pytest.importorskip("gymnasium_robotics")
    from test_dict_obs import make_her  # the same agent as the local tests

    her = make_her(tmp_path)
    d = _deploy(her.bundle, "onnx-int8")
    host = load_runtime(her.bundle, model="onnx-int8")
    env = host.make_env()
    obs, _ = env.reset(seed=11)
    dicts, expected = [], []
    for _ in range(20):
        dicts.append({k: np.asarray(v).tolist() for k, v in obs.items()})
        a = host.act(obs)
        expected.append(a.tolist())
        obs, *_ = env.step(a)
    env.close()
    script = (
        "import json, sys\n"
        "import numpy as np\n"
        "from quarl_edge.runtimes import load_policy\n"
        "p = load_policy(sys.argv[1], model='onnx-int8')\n"
        "p.reset()\n"
        "acts = [p.act({k: np.asarray(v) for k, v in o.items()}).tolist() for o in json.loads(sys.argv[2])]\n"
        "missing = ''\n"
        "try:\n"
        "    p.act({k: v for k, v in json.loads(sys.argv[2])[0].items() if k != 'desired_goal'})\n"
        "except Exception as e:\n"
        "    missing = f'{type(e).__name__}: {e}'\n"
        "print(json.dumps({'actions': acts, 'keys': list(p.info.observation_keys), 'missing': missing,\n"
        "                  'torch': 'torch' in sys.modules}))\n"
    )
    out = _run_script(board, script, d["path"].replace("~/", "", 1), json.dumps(dicts))
    assert out["torch"] is False and out["keys"] == ["achieved_goal", "desired_goal", "observation"]
    assert out["missing"].startswith("InputError: observation dict has no key 'desired_goal'")
    diff = np.abs(np.asarray(out["actions"]) - np.asarray(expected)).max()
    assert diff < 0.05, diff  # the board's int8 kernels (cortex-a72) against the host's
    print(f"\n[emulated rpi4] HER dict-obs agent, 20 act(obs_dict) on the board: max |Δa| vs host {diff:.2g}")
    _cleanup(board, her.bundle, d["path"].replace("~/", "", 1))


def test_recurrent_onnx_benched_gated_and_acting_with_state(board: emulate.Status, tmp_path: Path) -> None:
    from test_devices_emulate import _qe
    from test_onnx_io import make_isaac

    _, _, _, bundle = make_isaac(tmp_path)
    report = tmp_path / "emu.json"
    r = _qe("bench", "--bundle", bundle, "--device", "rpi4-emu", "--latency-samples", "100", "--out", report)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "reward: not measured" in r.stderr and "action error vs fp32" in r.stderr
    data = json.loads(report.read_text())
    assert data["device"]["emulated"] is True and data["reward_not_measured"]
    int8 = next(m for m in data["models"] if m["name"] == "onnx-int8")
    err = int8["agreement"]["max_abs_diff"]
    assert int8["latency"]["p50_us"] > 0 and 0 < err < 0.2
    ok = _qe("gate", report, "--max-action-error", "0.2")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = _qe("gate", report, "--max-action-error", f"{err / 2:.6f}")
    assert bad.returncode == 1
    print(f"\n[emulated rpi4] recurrent ONNX int8: p50 {int8['latency']['p50_us']:.0f} us (emulated), "
          f"action error max {err:.3g}, reward not measured")  # fmt: skip
    d = _deploy(bundle, "onnx-int8")
    trace = load_trace(bundle / "trace.npz")
    n = 60  # the first episode's first steps, in order, with the state carried
    script = (
        "import json, sys\n"
        "import numpy as np\n"
        "from quarl_edge.runtimes import load_policy\n"
        "p = load_policy(sys.argv[1], model='onnx-int8')\n"
        "p.reset()\n"
        "acts = [p.act(np.asarray(o, np.float32)).tolist() for o in json.loads(sys.argv[2])]\n"
        "print(json.dumps({'actions': acts, 'state': [list(s.shape) for s in p.recurrent_state]}))\n"
    )
    out = _run_script(board, script, d["path"].replace("~/", "", 1), json.dumps(trace.obs[:n].tolist()))
    host = load_runtime(bundle, model="onnx-int8")
    host.reset()
    expected = np.asarray([host.act(o) for o in trace.obs[:n]])
    assert out["state"] == [[1, 1, 16], [1, 1, 16]]
    assert np.abs(np.asarray(out["actions"]) - expected).max() < 0.05
    _cleanup(board, bundle, d["path"].replace("~/", "", 1))
