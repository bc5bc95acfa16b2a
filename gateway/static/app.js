// Tandem chat page: the gateway's OpenAI-compatible API, streamed, each token marked by who produced it.
"use strict";

const $ = (id) => document.getElementById(id);
const conversation = $("conversation");
const history = [];            // [{role, content}] sent with each request
let model = null;
let controller = null;         // AbortController of the running request (Stop = disconnect = cancel)

const tokenInput = $("token");
tokenInput.value = localStorage.getItem("tandem.token") || "";
tokenInput.addEventListener("change", () => localStorage.setItem("tandem.token", tokenInput.value));

function headers() {
  const h = { "content-type": "application/json" };
  if (tokenInput.value) h.authorization = "Bearer " + tokenInput.value;
  return h;
}

async function loadInfo() {
  try {
    const r = await fetch("/health");
    const h = await r.json();
    model = h.model;
    const draft = h.draft_model ? h.draft_model : (h.drafter === "none" ? "no drafter" : "drafter " + h.drafter);
    $("models").textContent = `${h.target_model} ← ${draft}` + (r.ok ? "" : " · verifier unavailable");
  } catch (e) {
    $("models").textContent = "gateway unreachable";
  }
}

function setStats(t) {
  if (!t) return;
  if (t.acceptance_length !== undefined) $("stat-tau").textContent = Number(t.acceptance_length).toFixed(2);
  if (t.tokens_per_second !== undefined) $("stat-tps").textContent = Number(t.tokens_per_second).toFixed(1);
  if (t.proposed !== undefined) $("stat-acc").textContent = `${t.accepted} / ${t.proposed}`;
  if (t.rounds !== undefined) $("stat-rounds").textContent = t.rounds;
}

function addMessage(role, text) {
  $("empty")?.remove();
  const div = document.createElement("div");
  div.className = "msg " + role;
  const label = document.createElement("span");
  label.className = "role";
  label.textContent = role;
  const body = document.createElement("span");
  body.className = "body";
  if (text) body.textContent = text;
  div.append(label, body);
  conversation.append(div);
  conversation.scrollTop = conversation.scrollHeight;
  return div;
}

function appendTokens(body, tokens, fallbackText) {
  if (!tokens) {
    if (fallbackText) body.append(document.createTextNode(fallbackText));
    return;
  }
  for (const t of tokens) {
    if (!t.text) continue;
    const span = document.createElement("span");
    span.className = "tok origin-" + t.origin;
    span.dataset.origin = t.origin;
    span.title = { draft: "drafter, accepted by the target", lookup: "prompt lookup, accepted",
                   suffix: "copied from earlier traffic (suffix drafting), accepted",
                   target: "target (recovered or bonus token)" }[t.origin] || t.origin;
    span.textContent = t.text;
    body.append(span);
  }
}

function describe(t, finish) {
  const mode = t.speculative ? `speculative (${t.draft_model || "drafter"})` : "target only";
  return `${t.new_tokens} tokens · τ ${Number(t.acceptance_length).toFixed(2)} · ` +
         `${Number(t.tokens_per_second).toFixed(1)} tok/s · ${t.accepted}/${t.proposed} drafts accepted · ` +
         `${mode} · ${finish}` + (t.fallback_reason ? ` · fallback: ${t.fallback_reason}` : "");
}

async function send(text) {
  history.push({ role: "user", content: text });
  addMessage("user", text);
  const msg = addMessage("assistant", "");
  msg.classList.add("streaming");
  const body = msg.querySelector(".body");
  const messages = [];
  if ($("system").value.trim()) messages.push({ role: "system", content: $("system").value.trim() });
  messages.push(...history);
  const request = {
    model: model || undefined, messages, stream: true, stream_options: { include_usage: true },
    max_tokens: Number($("max-tokens").value) || 256, temperature: Number($("temperature").value) || 0,
    tandem: { speculation: $("speculation").checked },
  };
  controller = new AbortController();
  $("send").disabled = true; $("stop").disabled = false;
  let content = "", finish = "", final = null;
  try {
    const r = await fetch("/v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(request),
                                                    signal: controller.signal });
    if (!r.ok) {
      let m = `HTTP ${r.status}`;
      try { m += ": " + (await r.json()).error.message; } catch (e) { /* not JSON */ }
      throw new Error(m);
    }
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message);
          const choice = chunk.choices && chunk.choices[0];
          if (choice && choice.delta && choice.delta.content) {
            content += choice.delta.content;
            appendTokens(body, chunk.tandem && chunk.tandem.tokens, choice.delta.content);
            conversation.scrollTop = conversation.scrollHeight;
          }
          if (choice && choice.finish_reason) finish = choice.finish_reason;
          if (chunk.tandem) { setStats(chunk.tandem); if (chunk.tandem.total_ms !== undefined) final = chunk.tandem; }
        }
      }
    }
  } catch (e) {
    if (e.name === "AbortError") {
      finish = "stopped";
    } else {
      msg.classList.add("error");
      body.append(document.createTextNode((content ? "\n" : "") + "⚠ " + e.message));
    }
  } finally {
    msg.classList.remove("streaming");
    controller = null;
    $("send").disabled = false; $("stop").disabled = true;
  }
  if (content) history.push({ role: "assistant", content });
  else if (!msg.classList.contains("error")) history.pop();
  if (final || finish) {
    const meta = document.createElement("span");
    meta.className = "meta";
    meta.textContent = final ? describe(final, finish) : finish;
    msg.append(meta);
  }
  msg.dataset.done = "true";
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || controller) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("composer").requestSubmit(); }
});
$("stop").addEventListener("click", () => controller && controller.abort());
$("clear").addEventListener("click", () => {
  if (controller) controller.abort();
  history.length = 0;
  conversation.innerHTML = '<p class="empty" id="empty">New conversation.</p>';
  for (const id of ["stat-tau", "stat-tps", "stat-acc", "stat-rounds"]) $(id).textContent = "–";
});
loadInfo();
