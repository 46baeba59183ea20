"""Training programs: ONNX model -> forward IR -> training graph of RepOps nodes -> executor.

``onnx_import`` (ONNX/torch -> ``ir.Model``), ``fusion`` (pattern rewrites after import),
``operators/`` (per IR op family: ONNX import, forward lowering, backward rule), ``autodiff``
(lowering and reverse mode), ``builder`` (graph construction), ``training`` (loss, optimizer,
the committed step graph), ``structure`` (graph root, C_0, input sources), ``executor`` (steps,
commitments, recomputation), ``backend`` (which RepOps backend runs the nodes), ``checkpoint``
(verified state on disk), ``data`` (batch schedule), ``world`` (a job as the dispute game's
World). The ``verde-chain train`` command is ``verde_chain/train_cli.py``. See docs/training.md.
"""

from verde_chain.graph.structure import GraphNode, Source, SourceKind, TrainingGraph

__all__ = ["GraphNode", "Source", "SourceKind", "TrainingGraph"]
