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
    ``problems`` holds every such error of one model (the import goes on past the first so a
    user sees them all at once, see ``UnsupportedModelError.of``); a single error lists itself.
    """

    def __init__(self, node: str, message: str, supported: object = None) -> None:
        text = f"{node}: {message}"
        if supported is not None:
            text += f" (supported: {supported})"
        super().__init__(text, node=node, supported=supported)
        self.node = node
        self.message = message
        self.supported = supported
        self.problems: tuple[UnsupportedModelError, ...] = (self,)

    @classmethod
    def of(cls, problems: list[UnsupportedModelError]) -> UnsupportedModelError:
        """One error naming every problem; the supported lists are said once, at the end."""
        if len(problems) == 1:
            return problems[0]
        parts = [f"{p.node}: {p.message}" for p in problems]
        lists = list(dict.fromkeys(str(p.supported) for p in problems if p.supported is not None))
        text = f"{len(problems)} unsupported nodes: " + "; ".join(parts)
        err = cls("model", text, " / ".join(lists) if lists else None)
        err.problems = tuple(problems)
        return err


class ShapeMismatchError(GraphError):
    """Shapes of tensors fed to an op (or a job's data) do not fit together."""


class NotDifferentiableError(GraphError):
    """A gradient would have to flow through an op that has no backward rule."""


class CheckpointError(GraphError):
    """A stored checkpoint is missing, corrupt (its commitment does not verify) or does not match the job."""


class JobSpecError(GraphError):
    """A job spec is malformed or does not match the model, data or initial state it names."""


class ModelExportError(JobSpecError):
    """torch could not export a module to ONNX (``export_torch``); names the module and torch's reason."""


class DataError(JobSpecError):
    """A job's dataset cannot be used as given: ``tensor`` is ``X`` or ``Y`` (or a model input),
    ``index`` the flat position of the first offending value, ``value`` that value."""


class NonFiniteDataError(DataError):
    """The dataset holds NaN or an infinity where the job reads numbers."""


class IntegerRangeError(DataError):
    """An integer (token id, class label, integer sample) that binary32 cannot hold exactly
    (magnitude 2**24 and beyond), or a negative or fractional value where ids are read."""


class LabelRangeError(DataError):
    """A class label the loss cannot read: outside [0, classes) (other than the loss's ignore
    index) or not an integer."""
