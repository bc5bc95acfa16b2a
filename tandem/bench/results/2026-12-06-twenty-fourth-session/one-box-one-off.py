import json, urllib.request, time
def ask(text, spec):
    body={"messages":[{"role":"user","content":text}],"max_tokens":96,"temperature":0,"tandem":{"speculation":spec},
          "cache_salt": "s" if spec else "p"}
    t0=time.perf_counter()
    r=json.load(urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:8091/v1/chat/completions", json.dumps(body).encode(), {"content-type":"application/json"})))
    return r['usage']['completion_tokens']/(time.perf_counter()-t0), r['tandem']['rounds'], r['choices'][0]['message']['content']
ask("Hello there.", False); ask("Hello there, again.", True)
rs=[]
for i,p in enumerate(["Write a short poem about the sea.", "List three uses of a paperclip.", "What is the capital of France and why is it famous?", "Describe a sunrise over the mountains.", "Give me a tip for learning to cook.", "Why do cats purr?", "Summarize the plot of Romeo and Juliet.", "How does a refrigerator keep food cold?"]):
    if i%2: b=ask(p, False); a=ask(p, True)
    else: a=ask(p, True); b=ask(p, False)
    rs.append(a[0]/b[0])
    print(f"{a[0]:.0f} vs plain {b[0]:.0f} tok/s  ratio {a[0]/b[0]:.2f}  rounds {a[1]} vs {b[1]} same={a[2]==b[2]}")
import statistics; print("mean", round(statistics.mean(rs),3))
