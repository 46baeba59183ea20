"""Language models from Hugging Face transformers, as users have them: GPT2LMHeadModel,
LlamaForCausalLM and BertForSequenceClassification with random weights, exported by torch's
dynamo exporter and trained (AdamW) or run (inference) as RepOps jobs.

Export (``export_hf``): ``use_cache=False``, fixed batch and sequence, ``torch.onnx.export(...,
dynamo=True, optimize=False)``. The exporter's optimizer is left off on purpose: it folds each
weight's transpose into a new constant and merges equal initializers (every LayerNorm's ones
and zeros become one tensor), so the parameters of the ONNX file would no longer be the model's
parameters (a tied embedding would be untied, all LayerNorm weights shared). Without it, every
initializer is a parameter or a buffer; the buffers are frozen, and everything computed from
constants and shapes alone (the causal mask, position ids, the rotary tables, shape arithmetic)
is folded when the model is imported (``graph/folding.py``), so it never reaches the graph.

Data: the characters of ``corpus.txt`` as token ids (ASCII, below the vocabulary of 128).
Causal LMs learn the next token: labels are the inputs shifted left, the last position of each
sequence -100 (ignored), which is what ``model(input_ids, labels=input_ids)`` computes inside
transformers. BERT classifies each sequence into ``NUM_LABELS`` classes (the sum of its ids mod
``NUM_LABELS``).
"""

from __future__ import annotations

import io
import logging
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from verde_chain.examples.transformer import CORPUS
from verde_chain.graph.data import Dataset
from verde_chain.graph.errors import JobSpecError
from verde_chain.graph.training import LossSpec, OptimizerSpec
from verde_chain.job import Job, make_job

ARCHS = ("gpt2", "llama", "bert")
IGNORE_INDEX = -100  # torch's and transformers' default
NUM_LABELS = 3
OPSET = 18


@dataclass(frozen=True)
class LMConfig:
    """The model's shape: the issue's tiny models are the defaults (2 layers, hidden 64,
    vocabulary 128, sequence 16); ``hidden=256`` is the larger size the tests also train."""

    arch: str = "llama"
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    vocab: int = 128
    seq: int = 16
    batch: int = 2

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise JobSpecError(f"unknown language model {self.arch!r}; choose one of {', '.join(ARCHS)}")

    @property
    def causal(self) -> bool:
        return self.arch != "bert"


def _transformers() -> Any:
    """``import transformers``, refusing a torchvision that cannot load: transformers imports
    torchvision whenever it is installed (for image utilities these models never use), and a
    torchvision wheel built for another torch (e.g. a CUDA build beside torch's CPU build) fails
    at import. Such a torchvision is then treated as absent."""
    import importlib.util

    import transformers
    import transformers.utils as tu
    import transformers.utils.import_utils as iu

    if importlib.util.find_spec("torchvision") is not None:
        try:
            import torchvision  # noqa: F401
        except (ImportError, OSError, RuntimeError):
            iu.is_torchvision_available = tu.is_torchvision_available = lambda: False

    return transformers


def hf_model(cfg: LMConfig, seed: int = 0) -> Any:
    """A transformers model with random weights (dropout off, no KV cache)."""
    import torch

    tf = _transformers()

    torch.manual_seed(seed)
    h, n = cfg.hidden, cfg.layers
    model: Any
    if cfg.arch == "gpt2":
        model = tf.GPT2LMHeadModel(tf.GPT2Config(
            n_layer=n, n_embd=h, n_head=cfg.heads, vocab_size=cfg.vocab, n_positions=cfg.seq, use_cache=False,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=cfg.vocab - 1, eos_token_id=cfg.vocab - 1))
    elif cfg.arch == "llama":  # grouped-query attention (2 key/value heads), as the real ones have
        model = tf.LlamaForCausalLM(tf.LlamaConfig(
            num_hidden_layers=n, hidden_size=h, intermediate_size=2 * h, num_attention_heads=cfg.heads,
            num_key_value_heads=max(1, cfg.heads // 2), vocab_size=cfg.vocab, max_position_embeddings=cfg.seq,
            use_cache=False))
    else:
        model = tf.BertForSequenceClassification(tf.BertConfig(
            num_hidden_layers=n, hidden_size=h, intermediate_size=2 * h, num_attention_heads=cfg.heads,
            vocab_size=cfg.vocab, max_position_embeddings=cfg.seq, num_labels=NUM_LABELS, use_cache=False,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    return model.eval()


def export_hf(model: Any, batch: int, seq: int) -> bytes:
    """The ONNX bytes of ``model(input_ids)`` for a (batch, seq) int64 input (logits out)."""
    import torch

    class Logits(torch.nn.Module):  # the model's first output alone (no ModelOutput wrapper)
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=input_ids).logits

    ids = torch.zeros(batch, seq, dtype=torch.long)
    with warnings.catch_warnings(), _quiet():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(Logits().eval(), (ids,), dynamo=True, optimize=False, opset_version=OPSET,
                                 verbose=False, input_names=["input_ids"], output_names=["logits"])
    if prog is None:  # the dynamo exporter always returns its program
        raise JobSpecError("torch.onnx.export returned no program")
    return prog.model_proto.SerializeToString()


class _quiet:
    """Silence the exporter's progress lines and warnings (logging and stdout)."""

    def __enter__(self) -> None:
        import contextlib

        self._stack = contextlib.ExitStack()
        self._stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        logging.disable(logging.WARNING)

    def __exit__(self, *exc: object) -> None:
        logging.disable(logging.NOTSET)
        self._stack.close()


def frozen_names(model: Any) -> tuple[str, ...]:
    """The buffers of the exported module (``Logits`` prefixes every name with ``model.``)."""
    return tuple(f"model.{name}" for name, _ in model.named_buffers())


def lm_dataset(cfg: LMConfig, samples: int | None = None) -> Dataset:
    """Windows of the corpus as token ids: next-token labels (causal) or sequence classes."""
    text = np.array([ord(c) % cfg.vocab for c in " ".join(CORPUS.read_text().split())], dtype=np.int64)
    n = (len(text) - 1) // cfg.seq if samples is None else samples
    X = np.stack([text[(i * cfg.seq) % (len(text) - cfg.seq):][: cfg.seq] for i in range(n)])
    if cfg.causal:
        Y = np.concatenate([X[:, 1:], np.full((n, 1), IGNORE_INDEX)], axis=1)
    else:
        Y = X.sum(axis=1) % NUM_LABELS
    return Dataset(X.astype(np.float32), Y.astype(np.float32), "input_ids")


def lm_loss(cfg: LMConfig) -> LossSpec:
    return LossSpec("cross_entropy", ignore_index=IGNORE_INDEX) if cfg.causal else LossSpec("cross_entropy")


def lm_job(cfg: LMConfig | None = None, kind: str = "train", steps: int = 4, lr: float = 1e-3,
           checkpoint_interval: int = 2, seed: int = 0, model: Any = None) -> Job:
    """A training (AdamW) or inference job of the model ``cfg`` describes (``model`` overrides
    the random one)."""
    cfg = cfg or LMConfig()
    module = model if model is not None else hf_model(cfg, seed)
    onnx_bytes = export_hf(module, cfg.batch, cfg.seq)
    name = f"{cfg.arch}-{'inference' if kind == 'inference' else 'train'}-h{cfg.hidden}"
    return make_job(name, onnx_bytes, lm_dataset(cfg), lm_loss(cfg),
                    OptimizerSpec("adamw", lr=lr, weight_decay=0.01), steps, cfg.batch, seed, checkpoint_interval,
                    frozen_names(module), kind=kind)
