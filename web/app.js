// The page: sends the user's messages to worker.js and renders what it posts back (the
// reply as it streams, the prefill and decode speeds, the KV cache's size, the status).
// Element ids are stable (web/tests/page_test.py drives them): #prompt #send #reset
// #file #acts #output #status #model #module #prefill #toks #ntok #kv; #module names the
// module the worker compiled in data-name; #prefill and #toks carry the number in
// data-tok-s, #kv in data-bytes, #status the state in data-state ("loading",
// "ready", "busy", "done", "error", "nomodel"). #acts chooses f32 or 8-bit activations
// (its first value from the page's URL, index.html?acts=q8); changing it reloads the
// model (the conversation starts over).

const $ = (id) => document.getElementById(id);
const ui = {
  prompt: $("prompt"), send: $("send"), reset: $("reset"), file: $("file"), acts: $("acts"), output: $("output"),
  status: $("status"), model: $("model"), module: $("module"), prefill: $("prefill"), toks: $("toks"), ntok: $("ntok"), kv: $("kv"),
};
const MAX_TOKENS = 256;
if (new URLSearchParams(location.search).get("acts") === "q8") ui.acts.value = "q8";
const worker = new Worker(new URL(`worker.js?acts=${ui.acts.value}`, import.meta.url), { type: "module" });
let current = null; // the .text element of the reply being streamed
let loaded = false;
let source = null; // the File the model came from (null: model.gguf, served)

function status(text, state) {
  ui.status.textContent = text;
  ui.status.dataset.state = state;
  ui.status.classList.toggle("error", state === "error");
}

function enable(on) {
  for (const el of [ui.prompt, ui.send, ui.reset]) el.disabled = !on;
  ui.file.disabled = !on && loaded;
  ui.acts.disabled = !on && loaded;
  if (on) ui.prompt.focus();
}

function bytesText(n) {
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  for (; n >= 1024 && i < units.length - 1; i++) n /= 1024;
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function addMessage(who, text) {
  const div = document.createElement("div");
  div.className = `msg ${who}`;
  const label = document.createElement("span");
  label.className = "who";
  label.textContent = who;
  const body = document.createElement("span");
  body.className = "text";
  body.textContent = text;
  div.append(label, body);
  ui.output.append(div);
  ui.output.scrollTop = ui.output.scrollHeight;
  return body;
}

function showError(message) {
  console.error("kvcore:", message);
  status(`error: ${message}`, "error");
  if (current) current.parentElement.classList.remove("streaming");
  current = null;
  enable(loaded);
}

function setRate(el, tokPerS) {
  el.dataset.tokS = String(tokPerS);
  el.textContent = tokPerS > 0 ? `${tokPerS.toFixed(1)} tok/s` : "–";
}

worker.onmessage = ({ data: m }) => {
  switch (m.type) {
    case "status":
      status(m.text, loaded ? "ready" : "loading");
      break;
    case "progress":
      status(m.total ? `reading the model: ${Math.round((100 * m.loaded) / m.total)}%`
                     : `reading the model: ${bytesText(m.loaded)}`, "loading");
      break;
    case "nomodel":
      status("no model.gguf beside the page: open a GGUF file (SmolLM2-135M-Instruct)", "nomodel");
      ui.file.disabled = false;
      ui.acts.disabled = false;
      break;
    case "module":
      ui.module.textContent = m.name === "kvcore_web_relaxed.wasm" ? "SIMD128 + relaxed SIMD" : "SIMD128";
      ui.module.dataset.name = m.name;
      break;
    case "loaded":
      loaded = true;
      ui.model.textContent = `${m.name} (${bytesText(m.bytes)}, ${m.acts === "q8" ? "8-bit" : "f32"} activations)`;
      ui.model.dataset.acts = m.acts;
      status(`ready: loaded in ${(m.ms / 1000).toFixed(1)} s`, "ready");
      enable(true);
      break;
    case "text":
      if (current) {
        current.textContent += m.text;
        ui.output.scrollTop = ui.output.scrollHeight;
      }
      break;
    case "stats":
      if (m.phase === "prefill") {
        setRate(ui.prefill, m.tokPerS);
        status(`generating (prefilled ${m.tokens} tokens)…`, "busy");
      } else {
        setRate(ui.toks, m.tokPerS);
        ui.ntok.textContent = String(m.tokens);
      }
      ui.kv.dataset.bytes = String(m.kvBytes);
      ui.kv.textContent = bytesText(m.kvBytes);
      break;
    case "done":
      if (current) current.parentElement.classList.remove("streaming");
      current = null;
      status(`done: ${ui.ntok.textContent} tokens`, "done");
      enable(true);
      break;
    case "reset":
      ui.kv.dataset.bytes = String(m.kvBytes);
      ui.kv.textContent = bytesText(m.kvBytes);
      setRate(ui.prefill, 0);
      setRate(ui.toks, 0);
      ui.ntok.textContent = "0";
      status("new chat", "ready");
      break;
    case "error":
      showError(m.message);
      break;
    default:
      console.error("kvcore: unknown message from the worker", m);
  }
};

worker.onerror = (e) => {
  e.preventDefault();
  showError(`worker: ${e.message || "failed to start (is the page served over HTTP?)"}`);
};

ui.file.addEventListener("change", () => {
  const file = ui.file.files[0];
  if (!file) return;
  source = file;
  reload(`reading ${file.name}…`);
});

// Loads the model again (the picked file, or model.gguf) with the chosen activations.
function reload(text) {
  loaded = false;
  enable(false);
  ui.file.disabled = true;
  ui.acts.disabled = true;
  ui.output.replaceChildren();
  current = null;
  for (const el of [ui.prefill, ui.toks]) setRate(el, 0);
  ui.ntok.textContent = "0";
  status(text, "loading");
  worker.postMessage({ type: "load", file: source, acts: ui.acts.value });
}

ui.acts.addEventListener("change", () => {
  // Before any model is loaded, the choice applies to the file picked next.
  if (loaded) reload(`loading the model again with ${ui.acts.value === "q8" ? "8-bit" : "f32"} activations…`);
});

$("form").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = ui.prompt.value;
  if (!text.trim() || ui.send.disabled) return;
  ui.prompt.value = "";
  addMessage("user", text);
  current = addMessage("assistant", "");
  current.parentElement.classList.add("streaming");
  setRate(ui.toks, 0);
  ui.ntok.textContent = "0";
  status("prefilling…", "busy");
  enable(false);
  worker.postMessage({ type: "chat", text, maxTokens: MAX_TOKENS });
});

ui.prompt.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("form").requestSubmit();
  }
});

ui.reset.addEventListener("click", () => {
  ui.output.replaceChildren();
  worker.postMessage({ type: "reset" });
});
