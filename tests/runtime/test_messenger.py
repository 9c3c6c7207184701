"""Execute mode's message path (perfsim.runtime.pipeline.Messenger) over real gloo.

Two ranks are spawned on 127.0.0.1; each writes what it saw to a file and the
checks run in the parent. The protocol under test: a link's first message
describes itself; later ones are one buffer whose size the receiver computed
and whose receive it posted before the sender sent.
"""

from __future__ import annotations

import json

import pytest
import torch

from perfsim.compression import make_pipeline_pair
from perfsim.compression.base import Payload

from _helpers import gloo_group, spawn_ranks


def _batches(n: int):
    g = torch.Generator().manual_seed(7)
    # ids 0..7, then 8..15, then 0..7 again: AQ-SGD's first visits, then deltas
    return [(torch.randn(8, 4, 32, generator=g), torch.arange(8) + 8 * (i % 2)) for i in range(n)]


def _aqsgd_worker(rank: int, port: int, out: str) -> None:
    from perfsim.runtime.pipeline import Messenger, header_capacity

    with gloo_group(rank, 2, port):
        msg = Messenger(torch.device("cpu"), header_capacity(8))
        comp = make_pipeline_pair("aqsgd:fw4bw8", seed=3)[0]
        batches = _batches(4)
        seen = []
        if rank == 0:
            for x, ids in batches:
                msg.send(comp.compress(x, key=ids), ids, 1)
            msg.wait_all()
        else:
            first, first_ids, _ = msg.recv(0)  # self-describing: no size needed
            got = [(comp.decompress(first, key=first_ids), first_ids)]
            shape = msg.shapes[0]
            # batches 1 (new ids: in full) and 2 (batch 0's ids: a 4-bit delta) posted
            # before reading, sized from this side's compressor state
            sizes = [comp.payload_nbytes(shape, key=ids) for _, ids in batches[1:3]]
            for n in sizes:
                msg.post(0, n)
            for _ in range(2):
                payload, got_ids, _ = msg.recv(0)
                got.append((comp.decompress(payload, key=got_ids), got_ids))
            # batch 3 repeats batch 1's ids, known only once batch 1 is decoded: posted now
            sizes.append(comp.payload_nbytes(shape, key=batches[3][1]))
            payload, got_ids, _ = msg.recv(0, sizes[-1])
            got.append((comp.decompress(payload, key=got_ids), got_ids))
            for (x, ids), (y, got_ids) in zip(batches, got):
                seen.append({"ids_equal": bool(torch.equal(ids, got_ids)),
                             "rel_err": float((x - y).norm() / x.norm())})
            seen.append({"sizes": sizes, "posted_left": len(msg.posted[0])})
            with open(out, "w") as f:
                json.dump(seen, f)


def test_posted_receives_carry_aqsgd_in_order(tmp_path):
    out = tmp_path / "seen.json"
    spawn_ranks(_aqsgd_worker, str(out))
    *rows, tail = json.loads(out.read_text())
    assert len(rows) == 4 and all(r["ids_equal"] for r in rows)
    # first visits travel in full (exact); repeats are 4-bit deltas (close, not exact)
    assert [r["rel_err"] for r in rows[:2]] == [0.0, 0.0]
    assert all(0.0 < r["rel_err"] < 0.5 for r in rows[2:])
    comp = make_pipeline_pair("aqsgd:fw4bw8")[0]
    assert tail["sizes"] == [comp.payload_bytes((8, 4, 32), 8), comp.payload_bytes((8, 4, 32), 0),
                             comp.payload_bytes((8, 4, 32), 0)]
    assert tail["posted_left"] == 0


def _mismatch_worker(rank: int, port: int, out: str) -> None:
    from perfsim.runtime.pipeline import Messenger

    with gloo_group(rank, 2, port):
        msg = Messenger(torch.device("cpu"), 256)
        p = Payload({"values": torch.ones(4, 16)}, (4, 16))
        small = Payload({"values": torch.ones(4, 8)}, (4, 8))
        ids = torch.arange(4)
        if rank == 0:
            msg.send(p, ids, 1)
            msg.send(small, ids, 1)  # the receiver expects another 256 bytes
            msg.wait_all()
        else:
            msg.recv(0)
            try:
                msg.recv(0, p.nbytes)
                err = ""
            except RuntimeError as exc:
                err = str(exc)
            with open(out, "w") as f:
                f.write(err)


def test_a_body_of_another_size_is_an_error_not_garbage(tmp_path):
    """A receiver that sized its buffer from a compressor out of step with the
    sender's must fail loudly: a shorter message leaves posted bytes unclaimed."""
    out = tmp_path / "err.txt"
    spawn_ranks(_mismatch_worker, str(out))
    assert "256 body bytes posted, 128 sent" in out.read_text()


def test_header_capacity_holds_a_real_header():
    import pickle

    from perfsim.runtime.pipeline import header_capacity

    comp = make_pipeline_pair("aqsgd:fw3bw6")[0]
    ids = torch.arange(10**9, 10**9 + 8)
    p = comp.compress(torch.randn(8, 16, 64), key=ids)
    header = {"names": list(p.tensors), "dtypes": [str(t.dtype) for t in p.tensors.values()],
              "shapes": [tuple(t.shape) for t in p.tensors.values()],
              "numels": [t.numel() for t in p.tensors.values()], "shape": p.shape,
              "dtype": str(p.dtype), "meta": {**p.meta, "step": 10**12}, "ids": ids.tolist(),
              "sent": 1.0}
    assert len(pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL)) <= header_capacity(8)


@pytest.mark.parametrize("spec", ["fp32", "fp16", "directq:fw4bw8", "aqsgd:fw3bw6", "qsgd:4",
                                  "qsgd-maxnorm:4", "topk:0.1:4", "randk-maxnorm:0.25:4"])
def test_payload_nbytes_predicts_the_next_payload(spec):
    """What a receiver posts (payload_nbytes before the call) is what compress sends."""
    try:
        fw, bw = make_pipeline_pair(spec, seed=1)
    except Exception as exc:  # a spec this registry spells differently
        pytest.skip(str(exc))
    g = torch.Generator().manual_seed(0)
    for comp in (fw, bw):
        for ids in (torch.arange(8), torch.arange(4, 12), torch.arange(4, 12)):
            x = torch.randn(8, 6, 10, generator=g)
            expected = comp.payload_nbytes(tuple(x.shape), key=ids)
            assert comp.compress(x, key=ids).nbytes == expected, spec
