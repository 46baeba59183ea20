"""Errors of the training-graph layer: import, differentiation, execution and checkpoints."""

from __future__ import annotations

from verde_chain.errors import VerdeError


class GraphError(VerdeError):
    """Root of the graph-layer errors; ``fields`` carries the structured details."""

    def __init__(self, message: str, **fields: object) -> None:
        self.fields = fields
        super().__init__(message)


class UnsupportedModelError(GraphError):
    """An ONNX model uses an op, attribute, dtype or dynamic shape that we do not support.

    ``node`` names the offending ONNX node (or graph input), ``supported`` lists what is.
    """

    def __init__(self, node: str, message: str, supported: object = None) -> None:
        text = f"{node}: {message}"
        if supported is not None:
            text += f" (supported: {supported})"
        super().__init__(text, node=node, supported=supported)
        self.node = node
        self.supported = supported


class ShapeMismatchError(GraphError):
    """Shapes of tensors fed to an op (or a job's data) do not fit together."""


class NotDifferentiableError(GraphError):
    """A gradient would have to flow through an op that has no backward rule."""


class CheckpointError(GraphError):
    """A stored checkpoint is missing, corrupt (its commitment does not verify) or does not match the job."""


class JobSpecError(GraphError):
    """A job spec is malformed or does not match the model, data or initial state it names."""
