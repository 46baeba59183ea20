"""The RepOps operator library: every operator as primitive kernels and their compositions.

The canonical semantics — the instruction set (``isa``), its arithmetic (``fp32``), the kernel
descriptor and its interpreter (``program``), the transcendental programs — live one level up in
``verde_chain.repops``. This package builds operators *out of* them: a primitive is one
:class:`~verde_chain.repops.program.KernelDesc` (one node of a training graph), a high-level
operator a :class:`Composite` of primitives, exactly as it is committed. ``docs/repops-spec.md``
lists every program and composition; this package is the executable form of that document.

Modules, by unit (primitives return a ``KernelDesc``, compositions a ``Composite``)::

    shapes       strides, broadcasting, axes                          (helpers)
    asm          instruction helpers for hand-written programs        (helpers)
    exact        exact rational constants rounded to binary32 once    (helpers)
    maps         elementwise: unary / binary / comparison / logic / where / pow / their gradients
    reductions   sum mean max min prod sumsq l1 l2 meansq, dot reductions
    linalg       matmul, Gemm
    movement     strided copy, transpose, reshape, expand, slice (+ grad), concat, trilu, pad
    indexing     gather, gather_elements, scatter_add (their backward)
    composite    Node, Composite, Builder; reductions over any axes (reduce_nodes)
    conv         convolution (+ both gradients), per-channel reductions, pooling (windowed loads)
    nn           softmax, log_softmax, layer_norm, rms_norm, batch_norm (+ backward)
    losses       NLL, softmax cross-entropy (+ backward)
    optimizers   SGD, Adam/AdamW, ONNX Momentum/Adam
    backward     backward of broadcasting binaries and matmul

Adding an operator is a change to the module of its unit (and a line in this file's exports);
see "Adding an operator" in docs/repops-spec.md for the whole list (graph layer, tests).

Everything public is re-exported here, so callers write ``from verde_chain.repops import
library`` and ``library.matmul(...)``, ``library.softmax(...)``.
"""

from verde_chain.repops.library.asm import I, const, coord, load, loadidx, transcendental
from verde_chain.repops.library.backward import binary_backward, matmul_backward, sum_to_shape
from verde_chain.repops.library.composite import (
    Builder,
    Composite,
    Node,
    Runner,
    reduce_composite,
    reduce_nodes,
    single,
)
from verde_chain.repops.library.conv import (
    ConvGeometry,
    avg_pool,
    avg_pool_grad_scale,
    channel_centered_meansq,
    channel_dot_xhat,
    channel_mean,
    channel_sum,
    conv_grad_input,
    conv_grad_weight,
    convolution,
    max_pool,
    max_pool_argmax,
    max_pool_backward,
    window_sum_backward,
)
from verde_chain.repops.library.exact import f32_of_fraction, f32_of_sqrt_fraction, f32q
from verde_chain.repops.library.indexing import gather, gather_elements, gather_elements_grad, gather_grad, scatter_add
from verde_chain.repops.library.linalg import GradMatmul, addend_epilogue, gemm, matmul, matmul_grads
from verde_chain.repops.library.losses import nll_loss, softmax_cross_entropy, softmax_cross_entropy_backward
from verde_chain.repops.library.maps import (
    BINARY_CODE,
    GRAD_CODE,
    TRANSCENDENTAL_GRAD,
    TRANSCENDENTAL_UNARY,
    UNARY_CODE,
    binary,
    clip,
    clip_code,
    clip_grad,
    dropout_apply,
    elementwise,
    gelu,
    hard_sigmoid,
    hard_sigmoid_grad,
    hard_swish,
    hard_swish_grad,
    leaky_relu,
    log1p_exp_log,
    map_affine,
    map_unary,
    minmax_grad,
    pow_const,
    pow_const_code,
    sigmoid_times,
    softplus_tail,
    unary_code,
    unary_grad,
    where,
    where_grad,
)
from verde_chain.repops.library.movement import (
    concat,
    expand,
    onnx_pads,
    pad,
    reshape,
    slice_,
    slice_grad,
    strided_copy,
    transpose,
    trilu,
    write_row,
)
from verde_chain.repops.library.nn import (
    BnTail,
    batch_norm_backward,
    batch_norm_inference,
    batch_norm_training,
    layer_norm,
    layer_norm_backward,
    log_softmax,
    log_softmax_backward,
    rms_norm,
    rms_norm_backward,
    softmax,
    softmax_backward,
)
from verde_chain.repops.library.optimizers import AdamConstants, adam, adam_constants, onnx_adam, onnx_momentum, sgd
from verde_chain.repops.library.reductions import REDUCE_KINDS, reduce, reduce_dot
from verde_chain.repops.library.shapes import (
    Shape,
    as_shape,
    broadcast_axes,
    broadcast_map,
    broadcast_shapes,
    c_strides,
    linear_k_stride,
    normalize_axes,
    numel,
    reduced_shape,
)

__all__ = [
    "BINARY_CODE", "GRAD_CODE", "REDUCE_KINDS", "TRANSCENDENTAL_GRAD", "TRANSCENDENTAL_UNARY", "UNARY_CODE",
    "AdamConstants", "BnTail", "Builder", "Composite", "ConvGeometry", "GradMatmul", "I", "Node", "Runner", "Shape", "adam",
    "adam_constants", "addend_epilogue", "as_shape", "avg_pool", "avg_pool_grad_scale", "batch_norm_backward", "batch_norm_inference",
    "batch_norm_training", "binary", "binary_backward", "broadcast_axes", "broadcast_map", "broadcast_shapes",
    "c_strides", "channel_centered_meansq", "channel_dot_xhat", "channel_mean", "channel_sum", "clip", "clip_code",
    "clip_grad",
    "concat", "const", "conv_grad_input", "conv_grad_weight", "convolution", "coord", "dropout_apply", "elementwise",
    "expand", "f32_of_fraction", "f32_of_sqrt_fraction", "f32q", "gather", "gather_elements", "gather_elements_grad",
    "gather_grad", "gelu", "gemm", "hard_sigmoid", "hard_sigmoid_grad", "hard_swish", "hard_swish_grad",
    "layer_norm", "layer_norm_backward", "leaky_relu", "linear_k_stride", "load", "loadidx", "log1p_exp_log",
    "log_softmax", "log_softmax_backward", "map_affine", "map_unary", "matmul", "matmul_backward", "matmul_grads", "max_pool",
    "max_pool_argmax", "max_pool_backward", "minmax_grad", "nll_loss", "normalize_axes", "numel", "onnx_adam",
    "onnx_momentum", "onnx_pads", "pad", "pow_const", "pow_const_code", "reduce", "reduce_composite", "reduce_dot",
    "reduce_nodes", "reduced_shape", "reshape", "rms_norm", "rms_norm_backward", "scatter_add", "sgd",
    "sigmoid_times", "single", "slice_", "slice_grad", "softmax", "softmax_backward", "softmax_cross_entropy",
    "softmax_cross_entropy_backward", "softplus_tail", "strided_copy", "sum_to_shape", "transcendental", "transpose",
    "trilu", "unary_code", "unary_grad", "where", "where_grad", "window_sum_backward", "write_row",
]  # fmt: skip
