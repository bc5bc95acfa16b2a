"""A/B two kernel builds' exact-rows attention in one process, alternated 40 times, caches evicted before each
sweep over the layers (every sixth layer global, the others a 512-key window, as Gemma 3), 2 threads; also
checks that the two builds' outputs are bit-identical.

    python attn_ab.py OLD.so NEW.so [heads kv_heads d layers [rows]]     (defaults: Gemma 3 270M, 4 1 256 18 1)
    TQ_ISA=avx2 to time the AVX2 functions. The .so of a tree: python -c "from verifier_service import native;
    print(native.library().attention._objects['0']._name)" """
import ctypes, os, sys, time, torch, statistics as st
libs = [ctypes.CDLL(p) for p in sys.argv[1:3]]
heads, kvh, d, layers = [int(x) for x in (sys.argv[3:7] if len(sys.argv) > 3 else (4, 1, 256, 18))]
threads = 2
n = int(sys.argv[7]) if len(sys.argv) > 7 else 1
f32, i64, ptr, cint = ctypes.c_float, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
fns = []
for lib in libs:
    f = getattr(lib, "tq_attention_" + os.environ.get("TQ_ISA", "avx512"))
    f.argtypes = [ptr, i64, i64, i64, i64, i64, ptr, ptr, i64, i64, i64, f32, ptr, cint]; f.restype = None
    fns.append(f)
flush = torch.empty(48 * 2**20 // 4)
for m in (100, 400, 1000):
    cap = 1100
    kvs = [torch.randn(2, kvh, cap, d) for _ in range(layers)]
    q = torch.randn(n, heads, d)
    outs = [torch.empty(n, heads * d) for _ in fns]
    win = lambda l: 0 if (l % 6 == 5) else 512
    ts = [[], []]
    for rep in range(40):
        for which, f in enumerate(fns):
            flush.add_(1.0)
            t0 = time.perf_counter()
            for l, kv in enumerate(kvs):
                f(q.data_ptr(), q.stride(0), n, heads, kvh, d, kv[0].data_ptr(), kv[1].data_ptr(), cap, m - n, win(l), d ** -0.5, outs[which].data_ptr(), threads)
            ts[which].append((time.perf_counter() - t0) * 1e3)
    same = torch.equal(outs[0], outs[1])
    print(f"m {m}: A min {min(ts[0]):.3f} med {st.median(ts[0]):.3f} | B min {min(ts[1]):.3f} med {st.median(ts[1]):.3f} ms per {layers} layers; bits equal: {same}")
