"""Kernels: packing format, counter hash, quantizer numerics, Triton twins.

The Triton kernels run under ``TRITON_INTERPRET=1`` in a subprocess (the
variable is read when a kernel is decorated, i.e. at import) and must produce
the same bytes as the torch references -- stochastic paths included, since
both evaluate the same counter hash.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from perfsim.errors import ConfigError
from perfsim.kernels import (aqsgd_receive, aqsgd_step_ref, ef_sign_compress_ref, pack_bits_ref,
                             quantize_pack_ref, sign_pack_ref, sign_unpack_ref,
                             unpack_bits_ref, unpack_dequantize_ref)
from perfsim.kernels.bitpack import pack_bits_torch, unpack_bits_torch
from perfsim.kernels.quant import levels
from perfsim.kernels.rng import call_key, fmix32, hash_int16_ref, uniform_ref

HAS_TRITON = True
try:
    import triton  # noqa: F401
except Exception:  # pragma: no cover
    HAS_TRITON = False


# ---------------------------------------------------------------- packing
@settings(max_examples=60, deadline=None)
@given(bits=st.sampled_from([1, 2, 3, 4, 6, 8]), n=st.integers(0, 300), seed=st.integers(0, 2**31))
def test_fast_packing_is_byte_exact(bits, n, seed):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 1 << bits, (n,), dtype=torch.uint8, generator=g)
    ref = pack_bits_ref(codes, bits)
    assert torch.equal(pack_bits_torch(codes, bits), ref)
    assert ref.numel() == (n * bits + 7) // 8
    assert torch.equal(unpack_bits_torch(ref, bits, n), codes)
    assert torch.equal(unpack_bits_ref(ref, bits, n), codes)


def test_packing_layout_documented_examples():
    # 4 bits: lowest code in the low nibble
    assert pack_bits_torch(torch.tensor([1, 2], dtype=torch.uint8), 4).tolist() == [0x21]
    # 3 bits: eight codes fill three bytes, code i at stream bits [3i, 3i+3)
    codes = torch.tensor([7, 0, 0, 0, 0, 0, 0, 7], dtype=torch.uint8)
    assert pack_bits_torch(codes, 3).tolist() == [0x07, 0x00, 0xE0]
    # 6 bits: four codes in three bytes
    assert pack_bits_torch(torch.tensor([63, 1, 0, 0], dtype=torch.uint8), 6).tolist() == [0x7F, 0x00, 0x00]


def test_packing_rejects_bad_input():
    with pytest.raises(ConfigError):
        pack_bits_torch(torch.zeros(3, dtype=torch.int32), 4)
    with pytest.raises(ConfigError):
        pack_bits_torch(torch.zeros(3, dtype=torch.uint8), 5)
    with pytest.raises(ConfigError):
        unpack_bits_torch(torch.zeros(3, dtype=torch.uint8), 4, 9)


# ---------------------------------------------------------------- counter hash
def _hash_python(i: int, key: int) -> int:
    h = fmix32(((i >> 1) * 0x9E3779B1 + key) & 0xFFFFFFFF)
    half = (h >> 16) if i & 1 else (h & 0xFFFF)
    return half - 65536 if half >= 32768 else half


def test_hash_int32_emulation_equals_uint32_definition():
    for key in (0, call_key(0, 0), call_key(7, 123, 2), -1):
        got = hash_int16_ref(41, key).tolist()
        assert got == [_hash_python(i, key) for i in range(41)]


def test_hash_uniform_statistics():
    u = uniform_ref(200_000, call_key(1, 2))
    assert 0 < float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.005
    assert abs(float(u.var()) - 1 / 12) < 0.002
    counts = torch.histc(u, bins=16, min=0, max=1)
    expected = u.numel() / 16
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 45  # 15 dof: p ~ 1e-4
    # neighbours (even/odd halves of one hash) are uncorrelated
    assert abs(float(torch.corrcoef(torch.stack([u[0::2], u[1::2]]))[0, 1])) < 0.01
    # different steps give different streams
    assert not torch.equal(hash_int16_ref(64, call_key(1, 2)), hash_int16_ref(64, call_key(1, 3)))


# ---------------------------------------------------------------- quantizer numerics
@pytest.mark.parametrize("bits", [2, 3, 4, 6, 8])
def test_deterministic_quantizer_is_nearest_level(bits):
    x = torch.randn(37, 11)
    packed, s = quantize_pack_ref(x, bits, bucket=11)
    v = unpack_dequantize_ref(packed, s, bits, x.numel(), bucket=11).view_as(x)
    step = (2 * s / levels(bits)).view(-1, 1)
    assert torch.all((v - x).abs() <= step / 2 * (1 + 1e-5) + 1e-7)
    assert torch.allclose(s, x.abs().amax(1))
    # the max-abs element of each bucket lands on an end level (+-s, up to rounding)
    assert torch.allclose(v.amax(1).maximum(-v.amin(1)), s, rtol=1e-6, atol=0)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_stochastic_quantizer_is_unbiased(bits):
    torch.manual_seed(0)
    x = torch.randn(8, 25)
    draws = 800
    acc = torch.zeros(x.numel(), dtype=torch.float64)
    for t in range(draws):
        p, s = quantize_pack_ref(x, bits, bucket=25, key=call_key(3, t))
        v = unpack_dequantize_ref(p, s, bits, x.numel(), bucket=25)
        step = (2 * s / levels(bits)).repeat_interleave(25)
        assert torch.all((v - x.reshape(-1)).abs() < step * (1 + 1e-5))
        acc += v.double()
    mean = acc / draws
    step = (2 * s / levels(bits)).repeat_interleave(25).double()
    # per-element std of the mean <= step / (2 sqrt(draws)); allow 5 sigma
    assert torch.all((mean - x.reshape(-1).double()).abs() <= 5 * step / (2 * draws ** 0.5) + 1e-6)


def test_quantizer_edge_cases():
    p, s = quantize_pack_ref(torch.zeros(3, 5), 4, bucket=5, key=call_key(0, 0))
    assert torch.equal(unpack_dequantize_ref(p, s, 4, 15, bucket=5), torch.zeros(15))
    p, s = quantize_pack_ref(torch.zeros(0), 4, bucket=5)
    assert p.numel() == 0 and s.numel() == 0
    assert unpack_dequantize_ref(p, s, 4, 0, bucket=5).numel() == 0
    # a partial last bucket has its own scale
    x = torch.tensor([1.0, -2.0, 4.0, 0.5, 0.25])
    _, s = quantize_pack_ref(x, 8, bucket=2)
    assert s.tolist() == [2.0, 4.0, 0.25]
    with pytest.raises(ConfigError):
        quantize_pack_ref(x, 5, bucket=2)
    with pytest.raises(ConfigError):
        quantize_pack_ref(x, 4, bucket=0)


def test_aqsgd_step_matches_unfused_and_receiver():
    a, m = torch.randn(6, 9), torch.randn(6, 9)
    ms, mr = m.clone(), m.clone()
    packed, s = aqsgd_step_ref(a, ms, 3, bucket=9, key=call_key(1, 1))
    p2, s2 = quantize_pack_ref(a - m, 3, bucket=9, key=call_key(1, 1))
    assert torch.equal(packed, p2) and torch.equal(s, s2)
    aqsgd_receive(packed, s, mr, 3, bucket=9)
    assert torch.equal(ms, mr)
    assert torch.equal(ms, m + unpack_dequantize_ref(packed, s, 3, 54, bucket=9).view(6, 9))


def test_sign_pack_and_error_feedback():
    x = torch.tensor([0.5, -1.0, 0.0, 2.0, -0.1, 0.3, 0.7, -0.2, 1.0])
    bits = unpack_bits_ref(sign_pack_ref(x), 1, 9)
    assert bits.tolist() == [1, 0, 1, 1, 0, 1, 1, 0, 1]  # zero counts as +
    err = torch.zeros(9)
    packed, scale = ef_sign_compress_ref(x, err)
    assert torch.isclose(scale, x.norm() / 3)
    dec = sign_unpack_ref(packed, 9, scale)
    assert torch.equal(err, x - dec)
    with pytest.raises(ConfigError):
        ef_sign_compress_ref(x, torch.zeros(8))


# ---------------------------------------------------------------- Triton (interpreter)
_INTERP_SCRIPT = textwrap.dedent(r"""
    import torch
    from perfsim.kernels.rng import call_key
    from perfsim.kernels.quant import (quantize_pack_ref, unpack_dequantize_ref,
                                       _quantize_pack_triton, _unpack_dequantize_triton)
    from perfsim.kernels.bitpack import pack_bits_ref, _pack_bits_triton, _unpack_bits_triton
    from perfsim.kernels.aqsgd_step import aqsgd_step_ref, _aqsgd_step_triton
    from perfsim.kernels.signpack import (sign_pack_ref, ef_sign_compress_ref, sign_unpack_ref,
                                          _sign_pack_triton, _ef_sign_compress_triton,
                                          _sign_unpack_triton)
    torch.manual_seed(0)
    checked = 0
    for bits in (1, 2, 3, 4, 6, 8):
        for n in (0, 1, 13, 64, 77):
            c = torch.randint(0, 1 << bits, (n,), dtype=torch.uint8)
            p = pack_bits_ref(c, bits)
            assert torch.equal(_pack_bits_triton(c, bits, block=8), p), ("pack", bits, n)
            assert torch.equal(_unpack_bits_triton(p, bits, n, block=8), c), ("unpack", bits, n)
            checked += 2
    for bits in (2, 3, 4, 6, 8):
        for n, bucket in ((1, 1), (37, 10), (96, 32), (50, 50)):
            x = torch.randn(n) * 3
            x[:2] = 0.0
            for key in (None, call_key(5, 9)):
                p1, s1 = quantize_pack_ref(x, bits, bucket=bucket, key=key)
                for fused in (True, False):
                    p2, s2 = _quantize_pack_triton(x, bits, bucket=bucket, key=key, block=8,
                                                   fused=fused)
                    assert torch.equal(p1, p2) and torch.equal(s1, s2), ("quant", bits, n, key, fused)
                v1 = unpack_dequantize_ref(p1, s1, bits, n, bucket=bucket)
                v2 = _unpack_dequantize_triton(p1, s1, bits, n, bucket=bucket, block=8)
                assert torch.equal(v1, v2), ("dequant", bits, n)
                a, m = torch.randn(n), torch.randn(n)
                m1 = m.clone()
                q1 = aqsgd_step_ref(a, m1, bits, bucket=bucket, key=key)
                for fused in (True, False):
                    m2 = m.clone()
                    q2 = _aqsgd_step_triton(a, m2, bits, bucket=bucket, key=key, block=8, fused=fused)
                    assert torch.equal(q1[0], q2[0]) and torch.equal(q1[1], q2[1]) \
                        and torch.equal(m1, m2), ("aqsgd", bits, n, key, fused)
                checked += 3
    # torch computes a = (L/2) / s as fl(fl(1/s) * L/2): values on a rounding boundary of
    # that coefficient (found by search; s = max |x|) catch a kernel that divides once
    x = torch.tensor([1.1791468858718872, -1.1005371809005737, -0.9433175325393677,
                      0.7860978245735168, 0.9433174133300781, 0.0, 0.5, -0.25])
    for fused in (True, False):
        p1, s1 = quantize_pack_ref(x, 4, bucket=8)
        p2, s2 = _quantize_pack_triton(x, 4, bucket=8, fused=fused)
        assert torch.equal(p1, p2), ("boundary", fused, p1.tolist(), p2.tolist())
        m1, m2 = torch.zeros(8), torch.zeros(8)
        q1, q2 = aqsgd_step_ref(x, m1, 4, bucket=8), _aqsgd_step_triton(x, m2, 4, bucket=8, fused=fused)
        assert torch.equal(q1[0], q2[0]) and torch.equal(m1, m2), ("aqsgd boundary", fused)
    from perfsim.errors import ConfigError
    from perfsim.kernels import finite

    def refusal(fn):
        try:
            fn()
        except ConfigError as e:
            return str(e)
        return None

    # the Triton encoders check finiteness on the device: no error (and no host
    # synchronisation) at the call; the next check_deferred -- a decoder's, or the
    # caller's -- raises the reference's one-line error, and the buffers are kept
    assert refusal(finite.check_deferred) is None  # the good encodes above
    for bad in (float("nan"), float("inf"), 2.0 ** 127):
        x = torch.randn(64); x[40] = bad
        ref_msg = refusal(lambda: quantize_pack_ref(x, 4, bucket=16))
        ref_aq = refusal(lambda: aqsgd_step_ref(x, torch.zeros(64), 4, bucket=16))
        assert ref_msg and ref_aq, bad
        for fused in (True, False):
            _quantize_pack_triton(x, 4, bucket=16, fused=fused)
            assert finite.pending_count() == 1, ("deferred", bad, fused)
            assert refusal(finite.check_deferred) == ref_msg, ("message", bad, fused)
            assert finite.pending_count() == 0 and refusal(finite.check_deferred) is None
            m = torch.zeros(64)
            _aqsgd_step_triton(x, m, 4, bucket=16, fused=fused)
            p_ok, s_ok = quantize_pack_ref(torch.ones(64), 4, bucket=16)
            # a decoder is the next natural synchronisation
            assert refusal(lambda: _unpack_dequantize_triton(p_ok, s_ok, 4, 64, bucket=16)) == ref_aq
            if bad != 2.0 ** 127:
                assert bool(torch.isfinite(m).all()), ("buffer poisoned", bad, fused)
        checked += 1
    # good inputs after a refusal: the flag was cleared
    _quantize_pack_triton(torch.randn(64), 4, bucket=16)
    assert refusal(finite.check_deferred) is None
    # a long run of encodes is checked every MAX_PENDING calls at the latest
    x = torch.randn(16); x[3] = float("nan")
    _quantize_pack_triton(x, 4, bucket=16)
    msgs = [refusal(lambda: _quantize_pack_triton(torch.randn(16), 4, bucket=16))
            for _ in range(finite.MAX_PENDING - 1)]
    assert msgs[:-1] == [None] * (finite.MAX_PENDING - 2) and msgs[-1] == refusal(lambda: quantize_pack_ref(x, 4, bucket=16)), msgs[-3:]
    # the 1-bit error-feedback encoder: NaN data and a norm too large for float32
    for bad in (float("nan"), 1e30):
        x = torch.randn(64); x[5] = bad
        ref_msg = refusal(lambda: ef_sign_compress_ref(x, torch.zeros(64)))
        e = torch.randn(64); e0 = e.clone()
        _ef_sign_compress_triton(x, e, block=4)
        assert refusal(lambda: _sign_unpack_triton(sign_pack_ref(x), 64, 1.0)) == ref_msg, bad
        assert torch.equal(e, e0), ("error buffer changed", bad)
        checked += 1
    for n in (0, 1, 9, 64, 100):
        x = torch.randn(n)
        assert torch.equal(sign_pack_ref(x), _sign_pack_triton(x, block=4))
        e1 = torch.randn(n); e2 = e1.clone()
        c = x + e1
        p1, s1 = ef_sign_compress_ref(x, e1)
        p2, s2 = _ef_sign_compress_triton(x, e2, block=4)
        # the scale is the norm summed in another order (float32 rounding apart); the
        # residual is exact given the kernel's own scale
        assert torch.equal(p1, p2) and torch.allclose(s1, s2, rtol=1e-6, atol=0), ("ef_sign", n)
        assert torch.equal(e2, torch.where(c >= 0, c - s2, c + s2)), ("ef residual", n)
        assert torch.equal(sign_unpack_ref(p1, n, s1), _sign_unpack_triton(p1, n, s1, block=4))
        assert torch.equal(sign_unpack_ref(p1, n, s1), _sign_unpack_triton(p1, n, float(s1), block=4))
        checked += 3
    # on a GPU the single-pass kernels pick their launch shape by triton.autotune; the
    # interpreter has no benchmarker, so time the candidates by wall clock here: the bytes,
    # the scales and the AQ-SGD buffer (restored between candidates) must not change
    import time
    from perfsim.kernels import fused

    def wall(fn, quantiles):
        t = time.perf_counter(); fn(); d = time.perf_counter() - t
        return [d, d, d]

    fused.AUTOTUNE = True
    for k in fused._TUNED.values():
        k.do_bench = wall
    # the smallest inputs with several candidate shapes each (R * BP elements, R no more than the
    # buckets' power of two: 3 candidates at 2100/16 and at 2053/1024, with a partial last bucket
    # and program), and one (300/32) that no candidate fits (the fixed shape of _layout); the
    # interpreter's time grows with the elements, so larger inputs test nothing more
    for n, bucket in ((2100, 16), (300, 32), (2 * 1024 + 5, 1024)):
        x = torch.randn(n)
        p1, s1 = quantize_pack_ref(x, 4, bucket=bucket)
        for _ in range(2):  # tuning, then the cached shape (fused._BEST)
            p2, s2 = _quantize_pack_triton(x, 4, bucket=bucket)
            assert torch.equal(p1, p2) and torch.equal(s1, s2), ("autotuned", n, bucket)
        m = torch.randn(n); m1 = m.clone(); m2 = m.clone()
        q1 = aqsgd_step_ref(x, m1, 4, bucket=bucket)
        q2 = _aqsgd_step_triton(x, m2, 4, bucket=bucket)
        assert torch.equal(q1[0], q2[0]) and torch.equal(m1, m2), ("autotuned aqsgd", n, bucket)
        checked += 2
    assert len(fused._TUNED[fused._fused_quant_pack_kernel].cache) == 3  # one per (size, bucket)
    fused.AUTOTUNE = False
    print("CHECKED", checked)
""")


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_triton_kernels_match_references_under_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _INTERP_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CHECKED" in proc.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON, reason="needs CUDA and triton")
def test_triton_kernels_match_cpu_references_on_gpu():  # pragma: no cover - needs a GPU
    """CUDA tensors take the Triton path; the CPU reference on the same data must
    give the same bytes (fp contraction is disabled in the kernels)."""
    from perfsim.kernels import aqsgd_step, ef_sign_compress, quantize_pack, unpack_dequantize

    torch.manual_seed(0)
    x = torch.randn(257, 1600)
    xc = x.cuda()
    for bits in (2, 3, 4, 6, 8):
        for key in (None, call_key(1, 1)):
            p1, s1 = quantize_pack_ref(x, bits, bucket=1600, key=key)
            p2, s2 = quantize_pack(xc, bits, bucket=1600, key=key)
            assert torch.equal(p1, p2.cpu()) and torch.equal(s1, s2.cpu()), (bits, key)
            v1 = unpack_dequantize_ref(p1, s1, bits, x.numel(), bucket=1600)
            assert torch.equal(v1, unpack_dequantize(p2, s2, bits, x.numel(), bucket=1600).cpu())
            m = torch.randn_like(x)
            m1, m2 = m.clone(), m.cuda()
            q1 = aqsgd_step_ref(x, m1, bits, bucket=1600, key=key)
            q2 = aqsgd_step(xc, m2, bits, bucket=1600, key=key)
            assert torch.equal(q1[0], q2[0].cpu()) and torch.equal(m1, m2.cpu()), (bits, key)
    e1 = torch.zeros(x.numel())
    e2 = e1.cuda()
    p1, s1 = ef_sign_compress_ref(x, e1)
    p2, s2 = ef_sign_compress(xc, e2)
    assert torch.equal(p1, p2.cpu())
    # the scale is a norm over 411,200 values, summed in another order on each device
    torch.testing.assert_close(s2.cpu(), s1, rtol=1e-5, atol=0)
    # the residual is exact given the device's own scale: c - (+-scale)
    expected = x.reshape(-1) - torch.where(x.reshape(-1) >= 0, s2.cpu(), -s2.cpu())
    torch.testing.assert_close(e2.cpu(), expected, rtol=0, atol=2e-6)
    # no host synchronisation in the encoders: NaN is refused at the next check, in one line
    from perfsim.kernels.finite import check_deferred

    check_deferred()
    xb = xc.clone()
    xb[3, 7] = float("nan")
    quantize_pack(xb, 4, bucket=1600)
    with pytest.raises(ConfigError, match="^tensor: contains NaN or Inf; refusing to compress$"):
        check_deferred()
    e3 = torch.zeros(x.numel(), device="cuda")
    ef_sign_compress(xb, e3)
    with pytest.raises(ConfigError, match="^tensor: contains NaN or Inf; refusing to compress$"):
        check_deferred()
    assert not bool(e3.any())  # the error buffer is kept
