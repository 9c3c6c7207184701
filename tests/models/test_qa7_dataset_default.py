"""The default epoch is WikiText-2's training split in samples of the model's length (qa7 F11).

Without ``--dataset-samples`` (a model ``perfsim run`` has no data set for), an epoch was 2359
samples whatever the sequence length -- WikiText-2's training split in 1024-token samples, so
llama2-7b's 4096-token samples made an epoch of 9.7 M tokens, four passes over the split:
``--epochs`` and ``epoch_s`` read 4 x too long (15628 s instead of 4013 s an epoch, pp 4: 74 iterations of 32 samples instead of 19), and
AQ-SGD's uncompressed first epoch 4 x too long. gpt2-xl --seq-len 512: half a pass."""

import math

import perfsim
from perfsim.models.datasets import WIKITEXT2_TOKENS


def _row(**kw):
    return perfsim.predict(pp=4, allow_oom=True, **kw).row()


def test_the_default_epoch_is_one_pass_over_the_splits_tokens():
    assert WIKITEXT2_TOKENS == 2359 * 1024
    for model, seq in (("gpt2-xl", None), ("gpt2-xl", 512), ("llama2-7b", None), ("bert-large", None)):
        kw = dict(model=model, **({"seq_len": seq} if seq else {}))
        r = _row(**kw)
        tokens = r["throughput_tokens_per_s"] / r["throughput_samples_per_s"]
        assert r["dataset_samples"] == math.ceil(WIKITEXT2_TOKENS / tokens), kw
    assert _row(model="gpt2-xl")["dataset_samples"] == 2359  # 1024-token samples: as before
    assert _row(model="llama2-7b", dataset_samples=2359)["dataset_samples"] == 2359  # a given size wins

