import sys, torch
sys.path.insert(0, 'verifier_service/kernels'); sys.path.insert(0, '.')
from bench_gemm import default_linears, best_ms
from verifier_service.quant import QuantWeight
torch.set_num_threads(1)
head = default_linears('avx512')[-1]
x = torch.randn(8, 576)
for out in (16384, 32768, 40960, 49152, 49000):
    w = QuantWeight('Q8_0', head.raw[:out], out, 576, isa='avx512')
    r = []
    for pad in (0, 16, 32, 48, 256, 1024):
        y = torch.empty(8, out + pad)[:, :out]
        ms = best_ms(lambda: w.matmul(x, out=y), 15)
        r.append(f'{2 * out * 576 * 8 / ms / 1e6:6.1f}')
    print(out, ' '.join(r))
