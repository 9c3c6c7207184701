"""Where the CUDA kernels and the CPU references disagree (diagnostic, GPU only)."""
import torch
from perfsim.kernels.quant import quantize_pack_ref, _quantize_pack_triton, encode_coeffs, bucket_absmax
from perfsim.kernels.aqsgd_step import aqsgd_step_ref, _aqsgd_step_triton
from perfsim.kernels.bitpack import unpack_bits_torch
from perfsim.kernels.rng import call_key

torch.manual_seed(0)
x = torch.randn(257, 1600)
xc = x.cuda()
s_cpu = bucket_absmax(x.reshape(-1), 1600)
s_gpu = bucket_absmax(xc.reshape(-1), 1600).cpu()
a_cpu, a_gpu = encode_coeffs(s_cpu, 4), encode_coeffs(s_gpu.cuda(), 4).cpu()
print("scales equal", torch.equal(s_cpu, s_gpu), "coeffs equal", torch.equal(a_cpu, a_gpu),
      "coeff diffs", int((a_cpu != a_gpu).sum()))
for bits in (2, 3, 4, 6, 8):
    for key in (None, call_key(1, 1)):
        p1, s1 = quantize_pack_ref(x, bits, bucket=1600, key=key)
        for fused in (True, False):
            p2, s2 = _quantize_pack_triton(xc, bits, bucket=1600, key=key, fused=fused)
            p2, s2 = p2.cpu(), s2.cpu()
            c1 = unpack_bits_torch(p1, bits, x.numel()).long()
            c2 = unpack_bits_torch(p2, bits, x.numel()).long()
            bad = (c1 != c2).nonzero().flatten()
            msg = f"bits={bits} stoch={key is not None} fused={fused}: bytes_equal={torch.equal(p1, p2)} " \
                  f"scales_equal={torch.equal(s1, s2)} codes_diff={bad.numel()}"
            if bad.numel():
                i = int(bad[0])
                xf = x.reshape(-1)
                msg += f" first i={i} x={xf[i].item()!r} cpu={int(c1[i])} gpu={int(c2[i])} " \
                       f"maxdiff={int((c1 - c2).abs().max())}"
            print(msg)
        m = torch.randn_like(x)
        m1, m2 = m.clone(), m.cuda()
        q1 = aqsgd_step_ref(x, m1, bits, bucket=1600, key=key)
        q2 = _aqsgd_step_triton(xc, m2, bits, bucket=1600, key=key)
        print(f"  aqsgd bits={bits} stoch={key is not None}: bytes={torch.equal(q1[0], q2[0].cpu())} "
              f"m={torch.equal(m1, m2.cpu())}")
