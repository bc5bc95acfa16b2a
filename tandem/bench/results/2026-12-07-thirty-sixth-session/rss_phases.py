# Peak and resident memory of a tandem command at each loading phase (VmHWM reset between phases):
#   HF_HUB_OFFLINE=1 .venv/bin/python rss_phases.py SECONDS serve-verifier --target FILE --threads 2 --port 0
import sys, threading, time
from tandem import phases
def mem():
    d = {}
    for l in open('/proc/self/status'):
        if l.startswith(('VmHWM', 'VmRSS')):
            k, v = l.split(':'); d[k] = int(v.split()[0]) // 1024
    return d
def reset():
    with open('/proc/self/clear_refs', 'w') as f: f.write('5')
orig = phases.enter
def enter(name):
    print(f"  end of phase: {mem()} -> {name}", file=sys.stderr, flush=True); reset()
    orig(name)
phases.enter = enter
import verifier_service.decoder as dec
om = dec.Decoder.measure_greedy_head
def mg(self, *a, **k):
    print("  before greedy measure", mem(), file=sys.stderr); reset()
    r = om(self, *a, **k)
    print("  after greedy measure", mem(), file=sys.stderr); reset()
    return r
dec.Decoder.measure_greedy_head = mg
def later():
    time.sleep(float(sys.argv[1])); print("  RSS later:", mem(), file=sys.stderr, flush=True)
    import os; os._exit(0)
threading.Thread(target=later, daemon=True).start()
from tandem.cli import main
sys.exit(main(sys.argv[2:]))
