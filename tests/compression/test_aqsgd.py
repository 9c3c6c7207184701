"""AQ-SGD: Alg. 1 semantics, bit-identical ends, exact sizes, buffers, state."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from perfsim.compression import make_compressor, make_pipeline_pair
from perfsim.errors import ConfigError

SPECS = ["aqsgd:4", "aqsgd:2", "aqsgd:3:m8", "aqsgd:4:m4", "aqsgd:6:m2"]


def _pair(spec, seed=0):
    return make_compressor(spec, seed=seed), make_compressor(spec, seed=seed)


def _buffers_equal(s, r):
    assert s.slots == r.slots
    slots = list(s.slots.values())
    return torch.equal(s.store.get(slots, "cpu"), r.store.get(slots, "cpu"))


def _run(s, r, base, rounds, noise, gen):
    """Mixed batches of a 12-sample dataset; returns per-round max message error."""
    errs = []
    for t in range(rounds):
        ids = torch.randperm(base.shape[0], generator=gen)[:5]
        x = base[ids] + noise(t) * torch.randn(5, *base.shape[1:], generator=gen)
        p = s.compress(x, key=ids)
        assert p.nbytes == s.payload_bytes(x.shape, p.meta["new_rows"])
        y = r.decompress(p, key=ids)
        errs.append(float((y - x).abs().max()))
        # the receiver's output is its updated buffer (before low-precision storage)
        if r.mbits is None:
            assert torch.equal(y.reshape(5, -1), r.store.get([r.slots[int(i)] for i in ids], "cpu"))
    return errs


@pytest.mark.parametrize("spec", SPECS)
def test_sender_and_receiver_stay_bit_identical(spec):
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(12, 3, 8, generator=gen)
    s, r = _pair(spec)
    _run(s, r, base, 10, lambda t: 0.5, gen)
    assert _buffers_equal(s, r)


def test_disk_backed_buffers(tmp_path):
    gen = torch.Generator().manual_seed(2)
    base = torch.randn(12, 4, 6, generator=gen)
    for spec in (f"aqsgd:3:disk={tmp_path}", f"aqsgd:3:m4:disk={tmp_path}"):
        s, r = _pair(spec)
        ram_s, ram_r = _pair(spec.split(":disk=")[0])
        g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
        e_disk = _run(s, r, base, 8, lambda t: 0.3, g1)
        e_ram = _run(ram_s, ram_r, base, 8, lambda t: 0.3, g2)
        assert e_disk == e_ram  # same numbers, only the storage differs
        assert _buffers_equal(s, r)
        assert s.store.dir != r.store.dir  # two ends never share files
        # more samples than the initial capacity: the memmap files grew
        assert s.store.capacity >= len(s.slots) > 0
    assert any(tmp_path.rglob("*.bin"))


def test_first_visit_is_exact_and_later_visits_quantized():
    s, r = _pair("aqsgd:2")
    x = torch.randn(3, 16)
    ids = torch.tensor([7, 1, 99])
    p = s.compress(x, key=ids)
    assert p.nbytes == s.wire_bytes(x.shape, warmup=True) == 4 * x.numel()
    assert torch.equal(r.decompress(p, key=ids), x)
    p2 = s.compress(x + 0.01, key=ids)
    assert p2.nbytes == s.wire_bytes(x.shape) == 3 * 16 * 2 // 8 + 4 * 3
    y = r.decompress(p2, key=ids)
    assert (y - (x + 0.01)).abs().max() <= 2 * 0.01 / 3 * 1.0001 + 1e-7  # one 2-bit step of |delta|


def test_mixed_batch_sizes_are_exact():
    s = make_compressor("aqsgd:3")
    shape = (4, 5, 7)
    steady, warm = s.wire_bytes(shape), s.wire_bytes(shape, warmup=True)
    assert warm == 4 * 4 * 35
    assert steady == (4 * 35 * 3 + 7) // 8 + 4 * 4 * 5
    for k in range(5):
        seen = (4 - k) * 35
        assert s.payload_bytes(shape, k) == 4 * k * 35 + (seen * 3 + 7) // 8 + 4 * seen // 7
    r = make_compressor("aqsgd:3")
    x = torch.randn(shape)
    s.compress(x[:2], key=torch.tensor([0, 1])), r.decompress(s.compress(x[:2], key=torch.tensor([2, 3])),
                                                               key=torch.tensor([2, 3]))
    # sender saw 0..3, receiver only 2, 3: the receiver detects the desync
    p = s.compress(x, key=torch.tensor([0, 1, 2, 3]))
    assert p.meta["new_rows"] == 0
    with pytest.raises(ConfigError, match="out of step"):
        r.decompress(p, key=torch.tensor([0, 1, 2, 3]))


def test_message_error_shrinks_as_activations_stop_changing():
    """AQ-SGD's point (Sec. 3): the message error a - m shrinks when a converges,
    unlike DirectQ, whose error stays at the scale of a itself."""
    gen = torch.Generator().manual_seed(4)
    base = torch.randn(12, 2, 32, generator=gen)
    s, r = _pair("aqsgd:2")
    errs = _run(s, r, base, 40, lambda t: 0.5 * 0.8 ** t, gen)
    late = max(errs[-5:])
    assert late < 0.05 * max(errs[3:8])
    d = make_compressor("directq:2")
    direct = float((d.decompress(d.compress(base)) - base).abs().max())
    assert late < 0.05 * direct


def test_state_round_trip_resumes_identically():
    gen = torch.Generator().manual_seed(5)
    base = torch.randn(12, 3, 8, generator=gen)
    for spec in ("aqsgd:3", "aqsgd:4:m8"):
        s, r = _pair(spec, seed=9)
        _run(s, r, base, 4, lambda t: 0.2, gen)
        ss, rs = s.state_dict(), r.state_dict()
        ids = torch.tensor([0, 3, 11, 5])
        x = base[ids] + 0.1
        p_orig = s.compress(x, key=ids)
        y_orig = r.decompress(p_orig, key=ids)
        s2, r2 = _pair(spec)
        s2.load_state_dict(ss), r2.load_state_dict(rs)
        p_new = s2.compress(x, key=ids)
        for k in p_orig.tensors:
            assert torch.equal(p_orig.tensors[k], p_new.tensors[k]), k
        assert torch.equal(r2.decompress(p_new, key=ids), y_orig)
        assert s2.slots == s.slots


def test_disk_state_reopens_files(tmp_path):
    s = make_compressor(f"aqsgd:4:disk={tmp_path}", seed=1)
    ram = make_compressor("aqsgd:4", seed=1)
    x, ids = torch.randn(3, 10), torch.tensor([4, 5, 6])
    s.compress(x, key=ids), ram.compress(x, key=ids)
    state = s.state_dict()  # flushes; the files are the buffer checkpoint
    del s
    dirs = sorted(tmp_path.iterdir())
    s2 = make_compressor(f"aqsgd:4:disk={tmp_path}", seed=1)
    s2.load_state_dict(state)
    assert sorted(tmp_path.iterdir()) == dirs  # reopened, nothing new created
    assert torch.equal(s2.compress(x + 1, key=ids).tensors["codes"], ram.compress(x + 1, key=ids).tensors["codes"])
    with pytest.raises(ConfigError):
        make_compressor("aqsgd:4").load_state_dict(state)  # RAM buffer vs disk checkpoint


def test_empty_batch_and_zero_activations():
    s, r = _pair("aqsgd:4")
    e = torch.zeros(0, 5)
    p = s.compress(e, key=torch.zeros(0, dtype=torch.long))
    assert p.nbytes == 0 and r.decompress(p, key=torch.zeros(0, dtype=torch.long)).shape == (0, 5)
    z, ids = torch.zeros(2, 5), torch.tensor([1, 2])
    r.decompress(s.compress(z, key=ids), key=ids)
    assert torch.equal(r.decompress(s.compress(z, key=ids), key=ids), z)  # delta 0 -> scale 0 -> exact


@pytest.mark.parametrize("key, x, match", [
    (None, torch.randn(2, 3), "key="),
    (torch.tensor([1]), torch.randn(2, 3), "2 rows"),
    (torch.tensor([1, 1]), torch.randn(2, 3), "duplicate"),
    (torch.tensor([1.0, 2.0]), torch.randn(2, 3), "integer"),
    (torch.tensor([1, 2]), torch.tensor([[1.0, float("nan"), 0.0]] * 2), "NaN"),
    (torch.tensor([1, 2]), torch.ones(2, 3, dtype=torch.int64), "floating"),
    (torch.tensor(1), torch.tensor(1.0), "integer|batch"),
])
def test_bad_input(key, x, match):
    with pytest.raises(ConfigError, match=match):
        make_compressor("aqsgd:4").compress(x, key=key)


def test_shape_change_and_bad_specs():
    s = make_compressor("aqsgd:4")
    s.compress(torch.randn(2, 3), key=torch.tensor([0, 1]))
    with pytest.raises(ConfigError, match="sample shape"):
        s.compress(torch.randn(2, 4), key=torch.tensor([0, 1]))
    for spec in ("aqsgd", "aqsgd:5", "aqsgd:4:m3", "aqsgd:4:m16", "aqsgd:4:disk=", "aqsgd:4:zz"):
        with pytest.raises(ConfigError):
            make_compressor(spec)


def test_pipeline_pair():
    fw, bw = make_pipeline_pair("aqsgd:fw3bw6:m8")
    assert (fw.spec, bw.spec) == ("aqsgd:3:m8", "directq:6")
    assert fw.ratio((8, 1024, 1600)) < 0.1


def test_in_place_fast_path_equals_copy_path(tmp_path):
    """Consecutive slots are updated in place (RAM); the disk store always copies.
    Both must give the same payloads and outputs."""
    ram_s, ram_r = _pair("aqsgd:3", seed=4)
    disk_s, disk_r = _pair(f"aqsgd:3:disk={tmp_path}", seed=4)
    gen = torch.Generator().manual_seed(8)
    ids = torch.arange(10, 16)
    base = torch.randn(6, 2, 9, generator=gen)
    for t in range(5):
        x = base + 0.3 * torch.randn(6, 2, 9, generator=gen)
        p1, p2 = ram_s.compress(x, key=ids), disk_s.compress(x, key=ids)
        for k in p1.tensors:
            assert torch.equal(p1.tensors[k], p2.tensors[k])
        assert torch.equal(ram_r.decompress(p1, key=ids), disk_r.decompress(p2, key=ids))
    assert ram_s.store.view(list(ram_s.slots.values()), "cpu") is not None
    assert _buffers_equal(ram_s, ram_r) and _buffers_equal(disk_s, disk_r)


def test_nan_in_seen_rows_leaves_state_untouched():
    s = make_compressor("aqsgd:4")
    x, ids = torch.randn(2, 6), torch.tensor([0, 1])
    s.compress(x, key=ids)
    before = s.state_dict()
    bad = x.clone()
    bad[1, 3] = float("inf")
    with pytest.raises(ConfigError, match="NaN or Inf"):
        s.compress(bad, key=ids)
    after = s.state_dict()
    assert after["step"] == before["step"]
    assert torch.equal(after["store"]["arrays"]["values"], before["store"]["arrays"]["values"])


@settings(max_examples=30, deadline=None)
@given(sample=st.lists(st.integers(0, 7), min_size=0, max_size=3).map(tuple),
       batch=st.integers(0, 5), seen=st.integers(0, 5), bits=st.sampled_from([2, 3, 4, 6, 8]),
       m=st.sampled_from(["", ":m8", ":m2"]))
def test_wire_bytes_equal_payload_for_odd_shapes(sample, batch, seen, bits, m):
    s, r = _pair(f"aqsgd:{bits}{m}")
    seen = min(seen, batch)
    ids = torch.arange(batch)
    if seen:
        x0 = torch.randn(seen, *sample)
        r.decompress(s.compress(x0, key=ids[:seen]), key=ids[:seen])
    x = torch.randn(batch, *sample)
    p = s.compress(x, key=ids)
    assert p.nbytes == s.payload_bytes(x.shape, batch - seen)
    if seen == batch:
        assert p.nbytes == s.wire_bytes(x.shape)
    if seen == 0:
        assert p.nbytes == s.wire_bytes(x.shape, warmup=True)
    assert r.decompress(p, key=ids).shape == x.shape
