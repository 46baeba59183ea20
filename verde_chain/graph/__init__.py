"""Training programs: ONNX model -> forward IR -> training graph of RepOps nodes -> executor.

``onnx_import`` (ONNX/torch -> ``ir.Model``), ``autodiff`` (lowering and reverse mode),
``training`` (loss, optimizer, the committed step graph), ``structure`` (graph root, C_0,
input sources), ``executor`` (steps, commitments, recomputation), ``checkpoint`` (verified
state on disk), ``data`` (batch schedule), ``train_cli`` (``verde-chain train``).
See docs/training.md.
"""

from verde_chain.graph.structure import GraphNode, Source, SourceKind, TrainingGraph

__all__ = ["GraphNode", "Source", "SourceKind", "TrainingGraph"]
