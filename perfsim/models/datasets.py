"""The data set each model trains on, and its size, without torch.

``perfsim run`` trains on real data that ships with installed software
(:mod:`perfsim.runtime.data` loads it); ``perfsim predict`` needs only how many samples an
epoch has, so that ``--epochs`` means the same number of optimizer steps in both commands
(:func:`perfsim.job.training_steps`). This module is the one place that says which data set
a model trains on and how many samples it holds:

* text (a GPT preset with a byte-level vocabulary of 256): the English help texts of
  Python's own documentation, ``pydoc_data.topics.topics`` (stdlib), concatenated in
  sorted-key order as UTF-8 bytes; sample ``i`` is the window ``[i*T, i*T + T + 1)`` of a
  model of sequence length ``T``: ``(len(bytes) - 1) // T`` samples;
* digits (an MLP of 64 inputs and 10 classes, ``digits-mlp``): scikit-learn's bundled 8x8
  handwritten digits, 1797 samples (the UCI "Optical Recognition of Handwritten Digits" test
  set; scikit-learn's ``load_digits`` documentation, "Samples total: 1797").

Any other model (a Hugging Face config, a vocabulary of GPT-2 tokens, a workload file) has
no data set perfsim knows: None, and predict takes ``--dataset-samples``, by default one pass
over WikiText-2's training split (:data:`WIKITEXT2_TOKENS`) in samples of the model's length
(:func:`wikitext2_samples`).
"""

from __future__ import annotations

from functools import lru_cache

from perfsim.errors import ConfigError
from perfsim.models.specs import MLPSpec, ModelSpec
from perfsim.models.transformer import TransformerSpec

#: tokens of WikiText-2's training split (GPT-2's tokenizer): the 2359 samples of 1024 tokens of
#: the AQ-SGD paper's GPT2-1.5B fine-tuning (arXiv:2206.01299), the default epoch of a model
#: perfsim has no data set for
WIKITEXT2_TOKENS = 2359 * 1024

#: the text corpus of the byte-level GPT presets
TEXT = "pydoc-topics"
#: scikit-learn's digits
DIGITS = "sklearn-digits"
#: samples of scikit-learn's digits (``sklearn.datasets.load_digits``: "Samples total 1797")
DIGITS_SAMPLES = 1797


@lru_cache(maxsize=1)
def corpus_bytes() -> bytes:
    """The stdlib pydoc topics, joined by blank lines in sorted-key order, as UTF-8."""
    from pydoc_data.topics import topics  # lazy: pydoc_data is large, needed only here

    return "\n\n".join(topics[k] for k in sorted(topics)).encode("utf-8")


def why_not(spec: ModelSpec) -> str | None:
    """Why ``spec`` has no data set the runtime trains it on (one line), or None when it has."""
    if isinstance(spec, TransformerSpec):
        if spec.vocab != 256:
            return (f"model {spec.name!r}: the runtime's text data is byte-level (vocab 256), "
                    f"the preset has vocab {spec.vocab}")
        return None
    if isinstance(spec, MLPSpec):
        if spec.sizes[0] != 64 or spec.sizes[-1] != 10:
            return f"model {spec.name!r}: digits need 64 inputs and 10 classes"
        return None
    return f"model {getattr(spec, 'name', spec)!r}: no runtime dataset"


def dataset_name(spec: ModelSpec) -> str | None:
    """:data:`TEXT` or :data:`DIGITS`, the data set ``spec`` trains on; None where it has none."""
    if why_not(spec) is not None:
        return None
    return TEXT if isinstance(spec, TransformerSpec) else DIGITS


def text_samples(seq_len: int) -> int:
    """Windows of ``seq_len`` tokens (and the next one, the last target) in the corpus."""
    return (len(corpus_bytes()) - 1) // seq_len


def dataset_samples(spec: ModelSpec, limit: int | None = None) -> int | None:
    """Samples in one epoch of the data set ``spec`` trains on (``limit`` keeps the first N:
    ``perfsim run --dataset-limit``), or None where perfsim knows no data set for it."""
    if limit is not None and limit < 1:
        raise ConfigError(f"dataset limit={limit}: must be >= 1")
    name = dataset_name(spec)
    if name is None:
        return None
    n = text_samples(spec.seq_len) if name == TEXT else DIGITS_SAMPLES
    return min(n, limit) if limit else n


def wikitext2_samples(tokens_per_sample: int) -> int:
    """Samples of ``tokens_per_sample`` tokens in one pass over WikiText-2's training split
    (:data:`WIKITEXT2_TOKENS`, the last one completed): 2359 of 1024 tokens, 590 of 4096 (qa7:
    2359 whatever the length made an epoch of 4096-token samples four passes)."""
    return -(-WIKITEXT2_TOKENS // max(1, tokens_per_sample))
