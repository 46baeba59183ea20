"""Every IR operator in one place per family: its ONNX import, its forward lowering to RepOps
nodes and its backward rule, registered in ``registry`` by decorator.

    elementwise   unary (relu tanh exp log sqrt erf sigmoid neg gelu), binary, scalar
    linalg        matmul, gemm
    activations   clip, activation (hard_sigmoid hard_swish softplus)
    nn            softmax, log_softmax, layer_norm, batch_norm, dropout
    conv          conv, max_pool, avg_pool (GlobalAveragePool: reduce mean)
    reductions    reduce (sum mean max)
    movement      transpose, reshape (Reshape Flatten Squeeze Unsqueeze Identity Cast), concat, pad
    indexing      gather

The families mirror the operator library's modules (``verde_chain/repops/library``): an operator
is added in the family module of both, plus its name in ``ir.OPS`` (docs/repops-spec.md,
"Adding an operator"). Importing this package registers everything.
"""

from verde_chain.graph.operators import (  # noqa: F401
    activations,
    conv,
    elementwise,
    indexing,
    linalg,
    movement,
    nn,
    reductions,
)
from verde_chain.graph.operators.registry import LOWERINGS, ONNX_IMPORTERS, VJPS, Grads, Saved

__all__ = ["LOWERINGS", "ONNX_IMPORTERS", "VJPS", "Grads", "Saved"]
