"""Property-based fuzzing of every artifact quarl-edge reads (issue 15): manifests, checkpoints, traces,
bench reports, partial bench files and SB3 zips are mutated (a value anywhere replaced by another type,
an absurd number, hostile text, deep nesting, or deleted) and fed to the library call the CLI makes.

Bundle paths (issue 27) are generated instead: any text as a manifest path, paths with a hostile segment
(``..``, ``.``, empty, backslash, NUL and control characters, unicode confusables of ``..`` such as
U+2025 and fullwidth U+FF0E), absolute paths, symlinks at any segment, and hostile or cut upload streams
fed to the board's receiver: each is refused, never accepted.

The contract: the call succeeds or raises a QuarlError (the CLI's exit 2, or 1 for a failed gate) whose
message is one line; never another exception (the CLI's traceback), and nothing outside the case's own
folder is written. Cases per artifact: `--fuzz-examples N` (default 200, ~10 s here); the counts print at the end.
"""

from __future__ import annotations

import copy
import io
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quarl_edge.bench.partial import PartialBench
from quarl_edge.bench.report import read_report
from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.bench.transport import LocalTransport
from quarl_edge.gate import GateConfig, evaluate, junit_xml, markdown_summary
from quarl_edge.policy.net import load_checkpoint
from quarl_edge.policy.sb3_zip import load_sb3_zip
from quarl_edge.runtimes.bundlepath import rel_path, sha256_of
from quarl_edge.runtimes.errors import QuarlError
from quarl_edge.runtimes.manifest import load_manifest
from quarl_edge.runtimes.runner import PolicyRunner
from quarl_edge.runtimes.trace import _ARRAYS, content_hash, load_trace

COUNTS: dict[str, int] = {}
DEEP, HUGE, BIGINT = "\x00deep\x00", "\x00huge\x00", "\x00bigint\x00"
RAW = {DEEP: "[" * 100_000 + "]" * 100_000, HUGE: "1e999", BIGINT: "9" * 5000}

hostile_text = st.sampled_from(["", "[red]x[/red]", "[/x]", "\x1b[2J", "a\nb", "../../etc/passwd", "x" * 5000,
                                "💥", "onnx-fp32", "-1", "nan"])  # fmt: skip
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | hostile_text
    | st.text(max_size=12)
    | st.sampled_from([DEEP, HUGE, BIGINT])
)
json_values = st.recursive(
    scalars, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
    max_leaves=6,
)  # fmt: skip


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:4]):
            yield from _paths(v, (*prefix, i))


@st.composite
def mutations(draw: Any, doc: Any) -> Any:
    """``doc`` with one value somewhere replaced (or deleted); a few nested mutations at times."""
    out = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(_paths(out))))
        if not path:
            continue
        parent = out
        for k in path[:-1]:
            parent = parent[k]
        if isinstance(parent, dict) and draw(st.booleans()) and draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(json_values)
    return out


def dumps(doc: Any) -> str:
    text = json.dumps(doc)
    for marker, raw in RAW.items():
        text = text.replace(json.dumps(marker), raw)
    return text


def fuzz_settings(request: pytest.FixtureRequest) -> Any:
    n = int(request.config.getoption("--fuzz-examples"))
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))  # fmt: skip


def contract(artifact: str, call: Callable[[], Any]) -> None:
    """The call succeeds or fails as one QuarlError line."""
    COUNTS[artifact] = COUNTS.get(artifact, 0) + 1
    try:
        call()
    except QuarlError as e:
        assert e.exit_code in (1, 2), e.exit_code
        assert "\n" not in str(e) and "\r" not in str(e), repr(str(e))
        assert 0 < len(str(e)) < 20_000


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def case_dir() -> Iterator[Callable[[], Path]]:
    """A fresh folder per hypothesis example (pytest's tmp_path is one per test)."""
    dirs: list[str] = []

    def new() -> Path:
        dirs.append(tempfile.mkdtemp(prefix="quarl-fuzz-"))
        return Path(dirs[-1])

    yield new
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


# ---- manifests and checkpoints ---------------------------------------------------------------------


def test_fuzzed_manifests_load_or_fail_in_one_line(
    request: pytest.FixtureRequest, cartpole_bundle: Path, case_dir: Callable[[], Path]
) -> None:
    doc = json.loads((cartpole_bundle / "manifest.json").read_text())
    before = _snapshot(cartpole_bundle)

    @fuzz_settings(request)
    @given(mutations(doc))
    def run(mutated: Any) -> None:
        bundle = Path(shutil.copytree(cartpole_bundle, case_dir() / "b"))
        (bundle / "manifest.json").write_text(dumps(mutated))

        def use() -> None:
            manifest = load_manifest(bundle)
            runner = PolicyRunner(bundle, manifest.models[0].name, threads=1)
            runner.act(np.zeros(manifest.policy.observation_space.shape, np.float32))

        contract("manifest", use)

    run()
    assert _snapshot(cartpole_bundle) == before


def test_fuzzed_checkpoints_load_or_fail_in_one_line(
    request: pytest.FixtureRequest, cartpole_policy: Path, case_dir: Callable[[], Path]
) -> None:
    doc = json.loads((cartpole_policy / "policy.json").read_text())

    @fuzz_settings(request)
    @given(mutations(doc))
    def run(mutated: Any) -> None:
        ckpt = Path(shutil.copytree(cartpole_policy, case_dir() / "p"))
        (ckpt / "policy.json").write_text(dumps(mutated))

        def use() -> None:
            policy = load_checkpoint(ckpt)
            policy.act(np.zeros(policy.spec.observation_space.shape, np.float32))

        contract("checkpoint", use)

    run()


# ---- traces ----------------------------------------------------------------------------------------

array_edits = st.sampled_from(["empty", "strings", "objects_as_bytes", "wrong_shape", "scalar", "nan", "huge_dim",
                               "int_obs", "bool", "complex"])  # fmt: skip


def _edit_array(a: np.ndarray, how: str) -> np.ndarray:
    if how == "empty":
        return a[:0]
    if how == "strings":
        return np.array(["x"] * len(a))
    if how == "objects_as_bytes":
        return np.frombuffer(b"\x00" * 16, dtype=np.uint8)
    if how == "wrong_shape":
        return a.reshape(len(a), -1)[:, :1] if a.ndim > 1 else np.stack([a, a], axis=1)
    if how == "scalar":
        return np.array(7)
    if how == "nan":
        return np.full(a.shape, np.nan)
    if how == "huge_dim":
        return np.zeros((1, 1, 1, 1, 1, 1, 1, 1), np.float32)
    if how == "int_obs":
        return a.astype(np.int64)
    if how == "bool":
        return a.astype(bool)
    return a.astype(np.complex64)


def test_fuzzed_traces_replay_or_fail_in_one_line(
    request: pytest.FixtureRequest, cartpole_bundle: Path, case_dir: Callable[[], Path]
) -> None:
    src = cartpole_bundle / "trace.npz"
    with np.load(src, allow_pickle=False) as z:
        arrays = {k: z[k] for k in _ARRAYS}
        meta = json.loads(str(z["meta"][()]))

    @fuzz_settings(request)
    @given(st.sampled_from(_ARRAYS), array_edits, st.one_of(st.none(), mutations(meta)))
    def run(name: str, how: str, new_meta: Any) -> None:
        edited = dict(arrays, **{name: _edit_array(arrays[name], how)})
        meta_json = json.dumps(meta if new_meta is None else new_meta)
        path = case_dir() / "t.npz"
        buf = io.BytesIO()  # re-hashed, so the reader gets past its integrity check to the content
        np.savez(
            buf, **edited, meta=np.array(meta_json), content_sha256=np.array(content_hash(edited, meta_json))
        )
        path.write_bytes(buf.getvalue())
        contract(
            "trace", lambda: PolicyRunner(cartpole_bundle, "onnx-fp32", threads=1).replay(load_trace(path))
        )

    run()


# ---- reports and partial bench files ---------------------------------------------------------------


@pytest.fixture(scope="module")
def report_doc(cartpole_bundle: Path) -> dict[str, Any]:
    """A report with every optional block: in-loop latency (--hz) and a sustained loop (--duration)."""
    return bench(
        cartpole_bundle, BenchConfig(episodes=2, latency_samples=20, max_steps=50, hz=500, duration_s=0.2)
    ).to_dict()


def test_fuzzed_reports_gate_or_fail_in_one_line(
    request: pytest.FixtureRequest, report_doc: dict[str, Any], case_dir: Callable[[], Path]
) -> None:
    doc = json.loads(json.dumps(report_doc))

    @fuzz_settings(request)
    @given(mutations(doc))
    def run(mutated: Any) -> None:
        path = case_dir() / "r.json"
        path.write_text(dumps(mutated))

        def use() -> None:
            report = read_report(path)
            checks = evaluate(
                report,
                GateConfig(
                    max_reward_drop_pct=2.0, min_agreement=0.5, max_p99_ms=100.0, max_miss_rate_pct=1.0
                ),
            )
            junit_xml(report, checks)
            markdown_summary(report, checks)

        contract("report", use)

    run()


@pytest.fixture(scope="module")
def partial_case(
    cartpole_bundle: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, Any]]:
    """A real partial bench file: the bench stops after the second model's first episode."""
    path = tmp_path_factory.mktemp("partial") / "r.partial.json"
    cfg = BenchConfig(episodes=3, latency_samples=20)
    seen = {"episodes": 0}

    class Flaky(LocalTransport):
        def __call__(self, bundle: Path, args: list[str]) -> Iterator[dict[str, Any]]:
            for ev in super().__call__(bundle, args):
                yield ev
                if ev.get("event") == "episode":
                    seen["episodes"] += 1
                    if seen["episodes"] == 4:
                        raise QuarlError("the link dropped", "run again with --resume")

    with pytest.raises(QuarlError):
        bench(cartpole_bundle, cfg, transport=Flaky(), partial=path)
    doc = json.loads(path.read_text())
    return path, doc


def test_fuzzed_partial_bench_files_resume_or_fail_in_one_line(
    request: pytest.FixtureRequest, partial_case: tuple[Path, dict[str, Any]], case_dir: Callable[[], Path]
) -> None:
    _, doc = partial_case
    names, seeds = list(doc["models"]), [1000, 1001, 1002]

    @fuzz_settings(request)
    @given(mutations(doc))
    def run(mutated: Any) -> None:
        path = case_dir() / "r.partial.json"
        path.write_text(dumps(mutated))

        def use() -> None:
            state = PartialBench.resume(path, doc["key"], names, seeds)
            state.summary()
            for n in names:
                state.seeds_left(n)
                if state.models[n].measured is not None:
                    state.finish(n, None)

        contract("partial bench file", use)

    run()


# ---- SB3 zips ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sb3_zip_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stable_baselines3 import PPO

    path = tmp_path_factory.mktemp("sb3") / "ppo-CartPole-v1.zip"
    PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, policy_kwargs={"net_arch": [8]}).save(path)
    return path


def test_fuzzed_sb3_zips_load_or_fail_in_one_line(
    request: pytest.FixtureRequest, sb3_zip_path: Path, case_dir: Callable[[], Path]
) -> None:
    with zipfile.ZipFile(sb3_zip_path) as z:
        members = {i.filename: z.read(i.filename) for i in z.infolist()}
    doc = json.loads(members["data"])

    @fuzz_settings(request)
    @given(mutations(doc))
    def run(mutated: Any) -> None:
        path = case_dir() / "ppo-CartPole-v1.zip"
        with zipfile.ZipFile(path, "w") as z:
            for name, data in members.items():
                z.writestr(name, dumps(mutated) if name == "data" else data)
        contract("SB3 zip", lambda: load_sb3_zip(path))

    run()


# ---- VecNormalize pickles (byte-level damage) ------------------------------------------------------


@pytest.fixture(scope="module")
def vecnorm_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    from quarl_edge.policy.registry import env_config
    from quarl_edge.runtimes.envs import make_env

    vn = VecNormalize(DummyVecEnv([lambda: make_env(env_config("Pendulum-v1"))]))
    vn.reset()
    for _ in range(20):
        vn.step(np.array([vn.action_space.sample()]))
    path = tmp_path_factory.mktemp("vn") / "vec_normalize.pkl"
    vn.save(str(path))
    return path


def test_fuzzed_vecnormalize_pickles_load_or_fail_in_one_line(
    request: pytest.FixtureRequest, vecnorm_path: Path, case_dir: Callable[[], Path]
) -> None:
    from quarl_edge.policy.vecnormalize import load_vecnormalize

    data = vecnorm_path.read_bytes()
    edits = st.lists(st.tuples(st.integers(0, len(data) - 1), st.sampled_from(["flip", "drop", "dup", "max"])),
                     min_size=1, max_size=4)  # fmt: skip

    @fuzz_settings(request)
    @given(edits)
    def run(changes: list[tuple[int, str]]) -> None:
        b = bytearray(data)
        for i, how in changes:
            i = min(i, len(b) - 1)
            if how == "flip":
                b[i] ^= 0xFF
            elif how == "drop":
                del b[i]
            elif how == "dup":
                b[i:i] = b[i : i + 8]
            else:
                b[i] = 0xFF
        path = case_dir() / "vec_normalize.pkl"
        path.write_bytes(bytes(b))
        contract("VecNormalize pickle", lambda: load_vecnormalize(path))

    run()


# ---- device profiles (the user's devices.toml) -------------------------------------------------------

toml_scalars = (
    st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | hostile_text
    | st.text(max_size=12)
)
PROFILE_FIELDS = ("transport", "host", "user", "port", "identity", "python", "cores", "default_threads",
                  "preferred_runtime", "connect_timeout", "command_timeout", "keepalive_interval",
                  "keepalive_count_max", "emulated", "extends", "cache_dir", "arch", "known_hosts")  # fmt: skip


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return (
            "nan"
            if v != v
            else ("inf" if v > 0 else "-inf")
            if v in (float("inf"), float("-inf"))
            else repr(v)
        )
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return json.dumps(v) if isinstance(v, str) else str(v)


def test_fuzzed_device_profiles_load_or_fail_in_one_line(
    request: pytest.FixtureRequest, case_dir: Callable[[], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from quarl_edge.devices.profiles import load_profile

    def write(home: Path, body: str) -> None:
        (home / "quarl-edge").mkdir(exist_ok=True)
        (home / "quarl-edge" / "devices.toml").write_text(f'[fuzzed]\nhost = "127.0.0.1"\n{body}')
        monkeypatch.setenv("XDG_CONFIG_HOME", str(home))

    sane = case_dir()  # the fuzz reaches the profile's fields: a well-formed one loads
    write(sane, "port = 2222\n")
    assert load_profile("fuzzed").port == 2222

    @fuzz_settings(request)
    @given(st.dictionaries(st.sampled_from(PROFILE_FIELDS), toml_scalars | st.lists(toml_scalars, max_size=3),
                           min_size=1, max_size=4))  # fmt: skip
    def run(fields: dict[str, Any]) -> None:
        write(case_dir(), "".join(f"{k} = {_toml(v)}\n" for k, v in fields.items() if k != "host"))
        contract("device profile", lambda: load_profile("fuzzed"))

    run()


# ---- bundle paths (issue 27): what a manifest names can never leave the bundle ----------------------

SAFE_SEGMENTS = st.from_regex(r"[a-z0-9_][a-z0-9._-]{0,7}", fullmatch=True).filter(
    lambda s: s not in (".", "..")
)
HOSTILE_SEGMENTS = st.sampled_from(
    ["..", ".", "", "\\", "a\\..\\b", "\u2025", "\uff0e\uff0e", "\uff0e", "\u2024\u2024", "..\u200b", "\x00",
     "a\x00b", "\n", "\x1b", "-rf", ".ssh", "é", "\u0430", " ", "a b", "%2e%2e", "~"]
)  # fmt: skip


def refused(artifact: str, call: Callable[[], Any], match: str | None = None) -> None:
    """The call fails as one QuarlError line (a bundle path case is never accepted)."""
    COUNTS[artifact] = COUNTS.get(artifact, 0) + 1
    with pytest.raises(QuarlError, match=match) as e:
        call()
    assert e.value.exit_code == 2 and "\n" not in str(e.value) and "\r" not in str(e.value), repr(
        str(e.value)
    )


@st.composite
def hostile_paths(draw: Any) -> str:
    """A relative path of safe segments with one hostile segment somewhere, or made absolute."""
    segs = draw(st.lists(SAFE_SEGMENTS, min_size=1, max_size=4))
    if draw(st.integers(0, 5)) == 0:
        return "/" + "/".join(segs)
    segs.insert(draw(st.integers(0, len(segs))), draw(HOSTILE_SEGMENTS))
    return "/".join(segs)


def test_any_text_is_a_plain_path_inside_the_bundle_or_refused_in_one_line(
    request: pytest.FixtureRequest,
) -> None:
    @fuzz_settings(request)
    @given(st.text(alphabet=st.sampled_from("ab./\\-_\x00\u2025\uff0e~é \n"), max_size=24) | hostile_paths())
    def run(p: str) -> None:
        COUNTS["bundle path text"] = COUNTS.get("bundle path text", 0) + 1
        try:
            rel_path(p, "model file", "re-export the bundle")
        except QuarlError as e:
            assert "\n" not in str(e) and e.exit_code == 2
            return
        # accepted: ASCII of the safe alphabet, relative, no '.' / '..' / empty segment, stays inside
        assert p.isascii() and p.isprintable() and "\\" not in p and not p.startswith("/")
        assert all(s and s not in (".", "..") and s[0] not in ".-" for s in p.split("/"))
        assert os.path.normpath(os.path.join("/bundle", p)).startswith("/bundle/")

    run()


def test_manifests_naming_hostile_paths_are_refused(
    request: pytest.FixtureRequest, cartpole_bundle: Path, case_dir: Callable[[], Path]
) -> None:
    doc = json.loads((cartpole_bundle / "manifest.json").read_text())

    @fuzz_settings(request)
    @given(hostile_paths(), st.sampled_from(["model", "trace"]))
    def run(path: str, where: str) -> None:
        root = case_dir()
        bundle = Path(shutil.copytree(cartpole_bundle, root / "b"))
        mutated = copy.deepcopy(doc)
        if where == "model":
            mutated["models"][0]["file"] = path
        else:
            mutated["trace"]["file"] = path
        (bundle / "manifest.json").write_text(json.dumps(mutated))
        before = _snapshot(root)
        refused(
            "bundle path", lambda: load_manifest(bundle, verify=False), "not a plain path inside the bundle"
        )
        assert _snapshot(root) == before

    run()


def test_a_symlink_at_any_segment_of_a_bundle_is_refused(
    request: pytest.FixtureRequest, cartpole_bundle: Path, case_dir: Callable[[], Path]
) -> None:
    """The model file moved to a nested path; a link put at one of its segments (pointing at a real
    folder or file of the same content, inside the bundle or out) is refused; so is a link the
    manifest does not name."""
    doc = json.loads((cartpole_bundle / "manifest.json").read_text())

    @fuzz_settings(request)
    @given(st.lists(SAFE_SEGMENTS, min_size=1, max_size=3, unique=True), st.data())
    def run(folders: list[str], data: Any) -> None:
        root = case_dir()
        bundle = Path(shutil.copytree(cartpole_bundle, root / "b"))
        entry = doc["models"][0]
        rel = "/".join([*folders, "model.onnx"])
        at = data.draw(st.integers(0, len(folders)), label="link at segment")
        outside = data.draw(st.booleans(), label="target outside the bundle")
        real = (root / "elsewhere" if outside else bundle / "real") / rel
        real.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(bundle / entry["file"], real)
        link = bundle.joinpath(*rel.split("/")[: at + 1])
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(real.parents[len(folders) - at - 1] if at < len(folders) else real)
        mutated = copy.deepcopy(doc)
        mutated["models"][0]["file"] = rel
        (bundle / "manifest.json").write_text(json.dumps(mutated))
        refused("bundle symlink", lambda: load_manifest(bundle), "is a symlink or lies under one")
        # the second line of defence, for a link made after the scan: every segment opened O_NOFOLLOW
        refused("bundle symlink", lambda: sha256_of(bundle, rel), "is a symlink or lies under one")

    run()


def test_the_boards_receiver_refuses_hostile_streams_and_leaves_nothing(
    request: pytest.FixtureRequest, cartpole_bundle: Path, case_dir: Callable[[], Path]
) -> None:
    """runtimes/board.receive (what a board runs after an upload), fed a stream that names a hostile
    path, or is cut anywhere: refused in one line, nothing written outside the cache, no temp folder."""
    import io

    from quarl_edge.runtimes.board import receive, stream_bundle
    from quarl_edge.runtimes.fsutil import sha256_file

    files = [
        (r, (cartpole_bundle / r).read_bytes()) for r in ("manifest.json", "trace.npz", "policy.int8.onnx")
    ]
    sha = sha256_file(cartpole_bundle / "manifest.json")

    @fuzz_settings(request)
    @given(hostile_paths(), st.integers(0, 2), st.floats(0.0, 1.0), st.booleans())
    def run(path: str, at: int, cut: float, hostile: bool) -> None:
        root = case_dir()
        cache = root / "home" / "cache" / "bundles"
        sent = list(files)
        if hostile:
            sent.insert(at, (path, b"ssh-ed25519 AAAA attacker\n"))
        stream = stream_bundle(sent)
        if not hostile:
            stream = stream[: int(len(stream) * cut * 0.999)]
        before = _snapshot(root)
        refused("board stream", lambda: receive(cache / sha, io.BytesIO(stream), sha))
        assert _snapshot(root) == before and not (cache.exists() and list(cache.iterdir()))

    run()
