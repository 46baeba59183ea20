"""Gradients of the RepOps training graph against torch autograd.

Tolerance (documented in docs/training.md): every gradient element within 1e-4 * max|torch grad|
+ 1e-6 of torch's, the loss within 1e-5 relative. torch sums in other orders (and uses libm), so
agreement cannot be bitwise; the RepOps result itself is bit-reproducible (test_executor.py).
"""

from __future__ import annotations

import gmpy2
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from tests.support.graph import Attention, Mixed, build, close, grad_of, one_step, torch_grads
from verde_chain.graph.backend import make_runner
from verde_chain.graph.executor import StepExecutor


@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
def test_mlp_relu_gradients(loss: str) -> None:
    torch.manual_seed(1)
    m = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    y = rng.integers(0, 3, 6).astype(np.float32) if loss == "cross_entropy" else rng.standard_normal((6, 3)).astype(np.float32)
    prog = build(m, torch.tensor(x), loss)
    res = one_step(prog, x, y)
    tl, tg = torch_grads(m, x, y, loss)
    assert abs(float(res.output(prog.graph, "loss")) - tl) <= 1e-5 * abs(tl)
    for name, g in tg.items():
        assert close(grad_of(prog, res, m, name), g), name


def _chain_meansq(d: np.ndarray) -> np.float32:
    """The spec's mean square of one row, evaluated with MPFR at binary32: MUL(d0, d0), then
    FMA(d_k, d_k, acc) for k ascending (one rounding each), / fl32(len)."""
    ctx = gmpy2.ieee(32)
    with gmpy2.context(ctx):
        acc = gmpy2.mpfr(float(d[0])) * gmpy2.mpfr(float(d[0]))
        for v in d[1:]:
            acc = gmpy2.fma(gmpy2.mpfr(float(v)), gmpy2.mpfr(float(v)), acc)
        return np.float32(float(acc)) / np.float32(len(d))


def test_mse_loss_is_row_chains_then_their_mean() -> None:
    """MSE = the mean of the rows' mean squares (docs/training.md): each row a dot chain along the
    last axis, then one chain of row values; not one chain over all N elements (which no thread
    or vector lane could share). Checked bit for bit against MPFR on the step's own difference
    node, on the C++ and the reference backends, and the one-chain value differs on this data."""
    torch.manual_seed(1)
    m = nn.Sequential(nn.Linear(5, 48))
    rng = np.random.default_rng(3)
    x = rng.standard_normal((37, 5)).astype(np.float32)
    y = rng.standard_normal((37, 48)).astype(np.float32)
    prog = build(m, torch.tensor(x), "mse")
    graph = prog.graph
    loss_node = graph.nodes[graph.named["loss"]]
    rows_node = graph.nodes[loss_node.inputs[0].index]
    assert (rows_node.desc.out_shape, rows_node.desc.K, loss_node.desc.K) == ((37,), 48, 37)
    diff_index = rows_node.inputs[0].index
    for backend in ("cpu", "reference"):
        ex = StepExecutor(graph, make_runner(backend, 2))
        res = ex.run_step(ex.initial_state(prog.initial_state()), prog.batch(1, {"x": x}, y))
        diff = res.outputs[diff_index].reshape(37, 48)
        rows = [_chain_meansq(r) for r in diff]
        acc = rows[0]
        for r in rows[1:]:
            acc = np.float32(acc + r)
        want = np.float32(acc / np.float32(37))
        got = np.float32(res.output(graph, "loss"))
        assert got.tobytes() == want.tobytes(), backend
        assert _chain_meansq(diff.reshape(-1)).tobytes() != want.tobytes()
    tl, _ = torch_grads(m, x, y, "mse")
    assert abs(float(got) - tl) <= 1e-5 * abs(tl)


@pytest.mark.parametrize("fuse", [True, False], ids=["gelu_erf", "erf-decomposed"])
def test_mixed_ops_gradients(fuse: bool) -> None:
    torch.manual_seed(3)
    m = Mixed()
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 6)).astype(np.float32)
    y = rng.integers(0, 4, 5).astype(np.float32)
    prog = build(m, torch.tensor(x), fuse=fuse)
    fns = {op.attrs.get("fn") for op in prog.model.ops if op.op == "unary"}
    assert {"tanh", "sigmoid", "gelu_erf" if fuse else "erf"} <= fns
    assert ("erf" in fns) != fuse
    assert {op.op for op in prog.model.ops} >= {"gemm", "layer_norm", "reduce", "scalar", "binary"}
    res = one_step(prog, x, y)
    tl, tg = torch_grads(m, x, y, "cross_entropy")
    assert abs(float(res.output(prog.graph, "loss")) - tl) <= 1e-5 * abs(tl)
    for name, g in tg.items():
        assert close(grad_of(prog, res, m, name), g), name


def test_attention_gradients() -> None:
    torch.manual_seed(5)
    m = Attention()
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 5, 4)).astype(np.float32)
    y = rng.standard_normal((2, 5, 3)).astype(np.float32)
    prog = build(m, torch.tensor(x), "mse")
    res = one_step(prog, x, y)
    tl, tg = torch_grads(m, x, y, "mse")
    assert abs(float(res.output(prog.graph, "loss")) - tl) <= 1e-5 * abs(tl)
    for name, g in tg.items():
        assert close(grad_of(prog, res, m, name), g), name


def test_embedding_gradient_scatter_add() -> None:
    torch.manual_seed(7)
    m = nn.Sequential(nn.Embedding(6, 4), nn.Linear(4, 6))
    tokens = np.array([[0, 3, 3, 5], [1, 3, 0, 0]], dtype=np.int64)
    target = np.array([[3, 3, 5, 1], [3, 0, 0, 2]], dtype=np.float32)
    from verde_chain.graph.onnx_import import import_torch
    from verde_chain.graph.training import LossSpec, OptimizerSpec, build_training_graph

    model, _ = import_torch(m, torch.tensor(tokens), ["x"])
    assert model.integer_inputs["x"]
    prog = build_training_graph(model, LossSpec("cross_entropy"), OptimizerSpec("sgd", lr=0.1))
    from verde_chain.graph.executor import StepExecutor

    ex = StepExecutor(prog.graph)
    res = ex.run_step(ex.initial_state(prog.initial_state()), prog.batch(1, {"x": tokens.astype(np.float32)}, target))
    m.zero_grad()
    out = m(torch.tensor(tokens))
    l = torch.nn.functional.cross_entropy(out.reshape(-1, 6), torch.tensor(target).long().reshape(-1))
    l.backward()
    emb = res.output(prog.graph, "grad:0.weight")
    assert close(emb, m[0].weight.grad.numpy())
    # rows of tokens never used get exactly +0 (scatter-add of no terms)
    assert np.all(emb.reshape(6, 4)[[2, 4]].view(np.uint32) == 0)


# ----------------------------------------------------------------------------- hand-made ONNX graphs


def _grads_of_onnx(nodes, x: np.ndarray, params: dict[str, np.ndarray], out_shape, torch_fn) -> None:  # type: ignore[no-untyped-def]
    """Train-graph gradients (MSE against 0) of a hand-built ONNX graph vs torch on the same formula."""
    from onnx import TensorProto, helper, numpy_helper

    from verde_chain.graph.executor import StepExecutor
    from verde_chain.graph.onnx_import import import_onnx
    from verde_chain.graph.training import LossSpec, OptimizerSpec, build_training_graph

    inits = [numpy_helper.from_array(v, k) for k, v in params.items()]
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))], inits,
    )
    model = import_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    prog = build_training_graph(model, LossSpec("mse"), OptimizerSpec("sgd", lr=0.1))
    ex = StepExecutor(prog.graph)
    target = np.zeros(out_shape, dtype=np.float32)
    res = ex.run_step(ex.initial_state(prog.initial_state()), prog.batch(1, {"x": x}, target))
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    y = torch_fn(torch.tensor(x), tp)
    loss = (y * y).mean()
    loss.backward()
    assert abs(float(res.output(prog.graph, "loss")) - loss.item()) <= 1e-5 * loss.item()
    for k, v in tp.items():
        assert close(res.output(prog.graph, f"grad:{k}"), v.grad.numpy()), k


@pytest.mark.parametrize("ta,tb,alpha,beta", [(0, 0, 1.0, 1.0), (1, 0, 0.5, 2.0), (0, 1, 1.0, 0.5), (1, 1, 2.0, 1.0)])
def test_gemm_transposes_alpha_beta(ta: int, tb: int, alpha: float, beta: float) -> None:
    from onnx import helper

    rng = np.random.default_rng(ta * 2 + tb)
    M, K, N = 3, 4, 5
    x = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
    params = {"B": rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32),
              "C": rng.standard_normal((N,)).astype(np.float32)}
    node = helper.make_node("Gemm", ["x", "B", "C"], ["y"], transA=ta, transB=tb, alpha=alpha, beta=beta)

    def ref(xt: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
        a = xt.T if ta else xt
        b = p["B"].T if tb else p["B"]
        return alpha * (a @ b) + beta * p["C"]

    _grads_of_onnx([node], x, params, (M, N), ref)


@pytest.mark.parametrize(
    "op,pshape",
    [("Add", (3, 1, 4)), ("Sub", (1, 5, 1)), ("Mul", (4,)), ("Div", (3, 1, 1))],
)
def test_broadcast_binary_gradients_sum_over_broadcast_axes(op: str, pshape: tuple[int, ...]) -> None:
    """Parameter gradients reduce over broadcast axes, including non-adjacent ones (transpose path)."""
    from onnx import helper

    rng = np.random.default_rng(len(pshape))
    x = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    p = rng.standard_normal(pshape).astype(np.float32)
    if op == "Div":
        p = np.abs(p) + 0.5
    fn = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div}[op]
    nodes = [helper.make_node(op, ["P", "x"] if op in ("Sub", "Div") else ["x", "P"], ["y"])]
    out = np.broadcast_shapes(x.shape, pshape)
    _grads_of_onnx(nodes, x, {"P": p}, out, lambda xt, tp: fn(tp["P"], xt) if op in ("Sub", "Div") else fn(xt, tp["P"]))


ACTS = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "gelu": nn.GELU, "gelu_tanh": lambda: nn.GELU("tanh")}


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=st.integers(1, 5), d_in=st.integers(1, 6), hidden=st.integers(1, 9), classes=st.integers(2, 5),
    act=st.sampled_from(sorted(ACTS)), seed=st.integers(0, 2**16),
)
def test_random_mlps_match_autograd(batch: int, d_in: int, hidden: int, classes: int, act: str, seed: int) -> None:
    """Property: for any small MLP shape and activation, loss and gradients track torch."""
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(d_in, hidden), ACTS[act](), nn.Linear(hidden, classes))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, d_in)).astype(np.float32)
    y = rng.integers(0, classes, batch).astype(np.float32)
    prog = build(m, torch.tensor(x))
    res = one_step(prog, x, y)
    tl, tg = torch_grads(m, x, y, "cross_entropy")
    assert abs(float(res.output(prog.graph, "loss")) - tl) <= 1e-5 * abs(tl) + 1e-7
    for name, g in tg.items():
        assert close(grad_of(prog, res, m, name), g), name


class TwoHeads(nn.Module):
    """The second head never reaches the loss (torch leaves its grad None); ReduceMax on the path."""

    def __init__(self, through_max: bool) -> None:
        super().__init__()
        self.a, self.unused = nn.Linear(3, 4), nn.Linear(3, 4)
        self.through_max = through_max

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.a(x)
        if self.through_max:
            y = y - y.amax(-1, keepdim=True)
        return y, self.unused(x)


def test_unreached_parameters_are_carried_and_max_has_no_gradient() -> None:
    from verde_chain.graph.errors import NotDifferentiableError

    x = np.ones((2, 3), dtype=np.float32)
    prog = build(TwoHeads(False), torch.tensor(x))
    carries = {n.label for n in prog.graph.nodes if n.label.startswith("carry:")}
    assert carries == {"carry:unused.weight", "carry:unused.bias"}
    res = one_step(prog, x, np.array([0, 1], dtype=np.float32))
    init = prog.initial_state()
    for slot in prog.graph.states:
        if slot.name.startswith("unused.") and slot.role == "param":
            assert np.array_equal(res.state.tensors[slot.producer], init[slot.name].reshape(-1))
    with pytest.raises(NotDifferentiableError, match="reduce 'max'"):
        build(TwoHeads(True), torch.tensor(x))


def test_close_is_relative_to_the_largest_reference_element() -> None:
    assert close(np.array([1.0, 0.00005]), np.array([1.0, 0.0]))
    assert not close(np.array([1.0, 0.001]), np.array([1.0, 0.0]))
