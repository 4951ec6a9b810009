"""The ONNX importer: a policy exported by another framework (Isaac Lab's rsl_rl exporter, LEAPP-style
tools) with an I/O description (``--io io.yaml``, policy/iodesc.py). The ONNX file itself is the fp32
model: it is not rebuilt as a torch module; the exporters copy it (its observation input renamed ``obs``,
its action output ``action``, the recurrent state inputs/outputs in the io.yaml's order) and quantize it
with ONNX Runtime. A recurrent graph (``obs, h_in, c_in -> actions, h_out, c_out``) must name its state
in the io.yaml. TFLite exports need a torch module and are refused for these.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from quarl_edge.policy.importers import LoadOptions, Source, register
from quarl_edge.policy.iodesc import external_env, read_io
from quarl_edge.policy.net import NetArch, Policy
from quarl_edge.runtimes.errors import InputError, IntegrityError
from quarl_edge.runtimes.spec import PolicySpec, SpaceSpec, StateSpec

_MAX_BYTES = 512 * 2**20


def _dims(v: Any) -> list[int | None]:
    return [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]


class OnnxNet(nn.Module):
    """The foreign ONNX graph behind PolicyNet's calling convention (obs, *state) -> (action, *state),
    run by onnxruntime on CPU: what record, parity and the int8 calibration states use on the host."""

    def __init__(self, model_bytes: bytes, inputs: list[str], outputs: list[str]) -> None:
        super().__init__()
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        self._sess = ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"])
        self._inputs, self._outputs = inputs, outputs

    def forward(self, obs: torch.Tensor, *state: torch.Tensor) -> Any:
        feeds = [obs, *state]
        rows = []
        for i in range(obs.shape[0]):  # such graphs are often batch 1 (Isaac Lab: opset 11, batch 1)
            feed = {n: np.ascontiguousarray(t[i : i + 1] if k == 0 else t.numpy(), np.float32)
                    for k, (n, t) in enumerate(zip(self._inputs, feeds, strict=True))}  # fmt: skip
            rows.append(self._sess.run(self._outputs, feed))
        action = torch.as_tensor(np.concatenate([r[0] for r in rows]))
        if not state:
            return action
        return (action, *(torch.as_tensor(rows[-1][k]) for k in range(1, len(self._outputs))))


def normalized_model(
    path: Path, obs: str, action: str, state_in: tuple[str, ...], state_out: tuple[str, ...]
) -> bytes:
    """The graph with its observation input named ``obs``, its action output ``action``, and inputs /
    outputs in the order (obs, *state_in) / (action, *state_out): the order the runtime feeds them."""
    import onnx

    model = onnx.load(str(path))
    g = model.graph
    rename = {obs: "obs", action: "action"}
    for node in g.node:
        node.input[:] = [rename.get(n, n) for n in node.input]
        node.output[:] = [rename.get(n, n) for n in node.output]
    for v in list(g.input) + list(g.output):
        v.name = rename.get(v.name, v.name)
    by_in = {v.name: v for v in g.input}
    by_out = {v.name: v for v in g.output}
    ins = [by_in["obs"], *(by_in[n] for n in state_in)] + [
        v for v in g.input if v.name not in ("obs", *state_in)
    ]
    outs = [by_out["action"], *(by_out[n] for n in state_out)]
    g.ClearField("input")
    g.input.extend(ins)
    g.ClearField("output")
    g.output.extend(outs)
    return model.SerializeToString()


def load_onnx(path: Path, opts: LoadOptions) -> Policy:
    import onnx

    if opts.vecnormalize:
        raise InputError(
            "--vecnormalize applies to SB3 .zip files", "bake the normalization into the ONNX graph"
        )
    io = read_io(opts.io, opts.env_id)
    where = str(path)
    if path.stat().st_size > _MAX_BYTES:
        raise IntegrityError(f"{where!r} is too large to be a policy", "pass the policy's own .onnx file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # onnx raises its own decode errors
        raise IntegrityError(
            f"{where!r} is not a readable ONNX model ({type(e).__name__})", "re-export it"
        ) from None
    g = model.graph
    inits = {i.name for i in g.initializer}
    inputs = [v for v in g.input if v.name not in inits]
    outputs = list(g.output)
    if not inputs or not outputs:
        raise InputError(f"{where!r} has no inputs or no outputs", "pass the policy's own .onnx file")
    obs = io.names.get("observation", inputs[0].name)
    action = io.names.get("action", outputs[0].name)
    names_in, names_out = [v.name for v in inputs], [v.name for v in outputs]
    if obs not in names_in or action not in names_out:
        raise InputError(f"{where!r} has no input {obs!r} or no output {action!r} (inputs {names_in}, outputs "
                         f"{names_out})", "name them in the io.yaml: onnx: {observation: ..., action: ...}")  # fmt: skip
    others = [n for n in names_in if n != obs]
    if others and not io.state_inputs:
        raise InputError(f"{where!r} takes {', '.join(others)} beside the observation, and "
                         f"{io.path or 'no io.yaml'} names no recurrent state",
                         f"add to the io.yaml: recurrent: {{inputs: [{', '.join(others)}], outputs: [...]}}")  # fmt: skip
    if sorted(others) != sorted(io.state_inputs) or len(io.state_outputs) != len(io.state_inputs) or not set(
        io.state_outputs
    ) <= set(names_out):  # fmt: skip
        raise InputError(f"the io.yaml's recurrent state (inputs {list(io.state_inputs)}, outputs "
                         f"{list(io.state_outputs)}) does not match {where!r} (inputs {names_in}, outputs {names_out})",
                         "list the graph's state inputs and, in the same order, its state outputs")  # fmt: skip
    by_name = {v.name: v for v in inputs}
    obs_dims, act_dims = _dims(by_name[obs]), _dims(next(v for v in outputs if v.name == action))
    if len(obs_dims) != 2 or obs_dims[1] is None or len(act_dims) != 2 or act_dims[1] is None:
        raise InputError(f"{where!r}: observation {obs_dims} and action {act_dims} are not [batch, size]",
                         "export the policy with a flat observation vector and a flat action")  # fmt: skip
    io.check_dims(int(obs_dims[1]), int(act_dims[1]))
    state = []
    for n_in, n_out in zip(io.state_inputs, io.state_outputs, strict=True):
        dims = _dims(by_name[n_in])
        if len(dims) != 3 or None in (dims[0], dims[2]):
            raise InputError(f"{where!r}: state {n_in!r} of shape {dims} is not [layers, batch, hidden]",
                             "export the state as [layers, 1, hidden] (Isaac Lab's layout)")  # fmt: skip
        state.append(StateSpec(n_in, n_out, (int(dims[0] or 1), 1, int(dims[2] or 1))))
    cell = {0: None, 1: "gru", 2: "lstm"}.get(len(state), "lstm")
    arch = NetArch(model="mlp", hidden=(), activation="elu", out_dim=int(act_dims[1]), head=io.head(),
                   recurrent=cell, rnn_hidden=state[0].shape[2] if state else 0,
                   rnn_layers=state[0].shape[0] if state else 1)  # fmt: skip
    spec = PolicySpec(
        name=path.stem, algo="onnx", model="onnx", env=io.env or external_env(path.stem),
        observation_space=SpaceSpec("box", (int(obs_dims[1]),), "float32", "-inf", "inf"),
        action_space=io.action_space(int(act_dims[1])), graph_steps=("onnx",), source=f"onnx:{path.name}",
        train={"imported_from": path.name, "io": io.path, "control_hz": io.control_hz,
               "env_from": "io.yaml" if io.env else None},
        state=tuple(StateSpec("h_in" if i == 0 else "c_in", "h_out" if i == 0 else "c_out", s.shape)
                    for i, s in enumerate(state)),
    )  # fmt: skip
    data = normalized_model(path, obs, action, io.state_inputs, io.state_outputs)
    # the normalized graph's state names are the manifest's (h_in, c_in -> h_out, c_out)
    data = _rename_state(data, io.state_inputs, io.state_outputs, spec.state)
    net = OnnxNet(data, ["obs", *(s.input for s in spec.state)], ["action", *(s.output for s in spec.state)])
    policy = Policy(spec=spec, arch=arch, net=net)  # type: ignore[arg-type]
    policy.source_model = data
    policy.reference_name = "the ONNX file itself (onnxruntime)"
    return policy


def _rename_state(
    data: bytes, ins: tuple[str, ...], outs: tuple[str, ...], spec: tuple[StateSpec, ...]
) -> bytes:
    import onnx

    model = onnx.load_from_string(data)
    g = model.graph
    rename = {a: s.input for a, s in zip(ins, spec, strict=True)} | {
        a: s.output for a, s in zip(outs, spec, strict=True)
    }
    for node in g.node:
        node.input[:] = [rename.get(n, n) for n in node.input]
        node.output[:] = [rename.get(n, n) for n in node.output]
    for v in list(g.input) + list(g.output):
        v.name = rename.get(v.name, v.name)
    return model.SerializeToString()


register(Source("onnx", "an .onnx policy with an I/O description (--io io.yaml)",
                lambda p: p.is_file() and p.suffix == ".onnx", load_onnx))  # fmt: skip
