import hashlib
BUF = bytes(10_000_000)
import asyncio, concurrent.futures, threading, time, queue, sys
mode = sys.argv[1]
q = queue.Queue()
cond = threading.Condition(); items = []
def worker():
    while True:
        if mode == "spin":
            t_end = time.perf_counter() + 0.002
            f = None
            while time.perf_counter() < t_end:
                try: f = q.get_nowait(); break
                except queue.Empty: time.sleep(0)
            if f is None: f = q.get()
        else:
            f = q.get()
        ts = time.perf_counter()
        hashlib.sha256(BUF).digest()
        f.t_start = ts; f.t_set = time.perf_counter()
        f.set_result(None)
threading.Thread(target=worker, daemon=True).start()
async def _poll(f):
    while not f.done(): await asyncio.sleep(0)
async def main():
    a, b = [], []
    for i in range(300):
        f = concurrent.futures.Future()
        t0 = time.perf_counter(); q.put(f)
        await (asyncio.wrap_future(f) if mode != "poll" else _poll(f))
        t1 = time.perf_counter()
        a.append((f.t_start - t0) * 1e3); b.append((t1 - f.t_set) * 1e3)
        busy = time.perf_counter() + 0.0002       # the gateway's own round work
        while time.perf_counter() < busy: pass
    for n, x in (("to worker", a), ("back to loop", b)):
        x.sort(); print(mode, n, "p50 %.3f p90 %.3f" % (x[150], x[270]))
asyncio.run(main())
