// The chat view: a conversation streamed over /v1/ws, one reply at a time, with its timings.
// A base model (config.chat false: no chat template) gets text continuation instead: each
// prompt is sent alone as a completion, and the reply continues it.
//
//   send ─► {"type": "chat", "id", "body": {model, messages, temperature, top_p, max_tokens, seed}}
//           {"type": "completion", "id", "body": {model, prompt, ...}}          (a base model)
//        ◄─ {"type": "chunk", "id", "chunk": chat.completion.chunk or text_completion}  ... (text appended)
//        ◄─ {"type": "done", "id", "usage", "cancelled"}  or  {"type": "error", "id", "error"}
//   stop ─► {"type": "cancel", "id"}   (the server aborts the request and answers "done", cancelled)

import { isKeyError } from "./app.js";

const MAX_IMAGE_SIDE = 1024; // uploads are scaled down to this before they are sent (the model resizes anyway)

export class Chat {
  constructor(client, config) {
    this.client = client;
    this.config = config;
    this.isChat = config.chat !== false;
    this.history = []; // {role, content} as the API takes them
    this.pending = null; // the reply streaming now: {id, el, text, sentAt, firstAt, lastAt}
    this.image = null; // data: URL of the image to send with the next message
    this.nextId = 1;
    this.el = (id) => document.getElementById(id);
    this.bindSettings();
    this.bindComposer();
    if (!this.isChat) this.showContinuation();
    if (config.images && this.isChat) this.bindImages();
    this.connect(0);
  }

  setActive() {}

  // -- the socket ----------------------------------------------------------------------
  connect(delay) {
    setTimeout(() => {
      this.setStatus("connecting", "connecting");
      const ws = new WebSocket(this.client.socketURL());
      this.ws = ws;
      ws.onopen = () => {
        if (this.client.key) ws.send(JSON.stringify({ type: "auth", api_key: this.client.key }));
        this.setStatus("open", "connected");
        this.updateButtons();
      };
      ws.onmessage = (event) => this.onFrame(JSON.parse(event.data));
      ws.onclose = () => {
        this.setStatus("closed", "disconnected");
        if (this.pending) this.finish({ error: "the connection closed" });
        this.updateButtons();
        this.connect(Math.min(10000, Math.max(1000, delay * 2)));
      };
    }, delay);
  }

  setStatus(state, text) {
    const status = this.el("status");
    status.dataset.state = state;
    status.textContent = text;
  }

  async onFrame(frame) {
    if (frame.type === "error" && frame.id === null && isKeyError(frame.status, frame.error)) {
      // the key was refused (or the failed-key lockout holds): ask again, then retry it
      await this.client.askKey(frame.error.message, frame.status === 429);
      this.ws.send(JSON.stringify({ type: "auth", api_key: this.client.key }));
      return;
    }
    const reply = this.pending;
    if (!reply || frame.id !== reply.id) return;
    if (frame.type === "chunk") {
      for (const choice of frame.chunk.choices) {
        const text = choice.delta ? choice.delta.content : choice.text;
        if (text) this.append(reply, text);
        if (choice.finish_reason) reply.finishReason = choice.finish_reason;
      }
    } else if (frame.type === "done") {
      this.finish({ usage: frame.usage, cancelled: frame.cancelled });
    } else if (frame.type === "error") {
      if (isKeyError(frame.status, frame.error)) this.client.askKey(frame.error.message, frame.status === 429);
      this.finish({ error: frame.error.message });
    }
  }

  // -- a turn --------------------------------------------------------------------------
  send() {
    const prompt = this.el("prompt");
    const text = prompt.value.trim();
    if (!text || this.pending || !this.ws || this.ws.readyState !== WebSocket.OPEN) return;
    const content = this.image ? [{ type: "image_url", image_url: { url: this.image } }, { type: "text", text }] : text;
    if (this.isChat) this.history.push({ role: "user", content });
    this.addMessage("user", text, this.image);
    prompt.value = "";
    this.clearImage();
    const id = `m${this.nextId++}`;
    const el = this.addMessage("assistant", "");
    el.dataset.state = "streaming";
    this.pending = { id, el, text: "", sentAt: performance.now(), firstAt: null, lastAt: null, finishReason: null };
    const type = this.isChat ? "chat" : "completion";
    this.ws.send(JSON.stringify({ type, id, body: this.body(text) }));
    this.updateButtons();
  }

  body(text) {
    const body = {
      model: this.config.model,
      ...(this.isChat ? { messages: this.history } : { prompt: text }),
      temperature: Number(this.el("temperature").value),
      top_p: Number(this.el("top-p").value),
      max_tokens: Number(this.el("max-tokens").value) || 256,
    };
    const seed = this.el("seed").value;
    if (seed !== "") body.seed = Number(seed);
    return body;
  }

  stop() {
    if (this.pending) this.ws.send(JSON.stringify({ type: "cancel", id: this.pending.id }));
  }

  append(reply, text) {
    const now = performance.now();
    if (reply.firstAt === null) reply.firstAt = now;
    reply.lastAt = now;
    reply.text += text;
    reply.el.querySelector(".text").textContent = reply.text;
    const messages = this.el("messages");
    messages.scrollTop = messages.scrollHeight;
  }

  /** End the pending reply: its state, and tokens, tokens/s and time to first token under it. */
  finish({ usage, cancelled, error }) {
    const reply = this.pending;
    this.pending = null;
    const meta = reply.el.querySelector(".meta");
    if (error) {
      reply.el.dataset.state = "error";
      meta.textContent = error;
      if (this.isChat) this.history.pop(); // the turn failed: leave it out of the conversation
    } else {
      reply.el.dataset.state = cancelled ? "stopped" : "done";
      if (this.isChat) this.history.push({ role: "assistant", content: reply.text });
      meta.textContent = timings(reply, usage);
    }
    this.updateButtons();
  }

  addMessage(role, text, image) {
    const el = document.createElement("div");
    el.className = `msg ${role}`;
    if (image) {
      const img = document.createElement("img");
      img.src = image;
      img.alt = "uploaded image";
      el.appendChild(img);
    }
    const body = document.createElement("div");
    body.className = "text";
    body.textContent = text;
    el.appendChild(body);
    if (role === "assistant") {
      const meta = document.createElement("div");
      meta.className = "meta";
      el.appendChild(meta);
    }
    this.el("messages").appendChild(el);
    this.el("empty").hidden = true;
    return el;
  }

  updateButtons() {
    const open = this.ws && this.ws.readyState === WebSocket.OPEN;
    this.el("send").disabled = !open || this.pending !== null;
    this.el("stop").disabled = !open || this.pending === null;
  }

  // -- controls ------------------------------------------------------------------------
  bindSettings() {
    for (const name of ["temperature", "top-p"]) {
      const input = this.el(name);
      const show = () => (this.el(`${name}-value`).textContent = Number(input.value).toFixed(2));
      input.addEventListener("input", show);
      show();
    }
    this.el("new-chat").addEventListener("click", () => {
      if (this.pending) {
        this.stop(); // its last frames are for an id no longer pending: ignored
        this.pending = null;
        this.updateButtons();
      }
      this.history = [];
      this.el("messages").textContent = "";
      this.el("empty").hidden = false;
    });
  }

  bindComposer() {
    this.el("composer").addEventListener("submit", (event) => {
      event.preventDefault();
      this.send();
    });
    this.el("prompt").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey) {
        event.preventDefault();
        this.send();
      }
    });
    this.el("stop").addEventListener("click", () => this.stop());
  }

  /** A base model: the composer asks for text to continue, and says why. */
  showContinuation() {
    document.body.dataset.mode = "continuation";
    this.el("prompt").placeholder = "Text to continue";
    this.el("send").textContent = "Continue";
    this.el("new-chat").textContent = "Clear";
    this.el("empty").textContent =
      `${this.config.model} is a base model (no chat template): it continues the text you write, ` +
      "it does not answer questions. Serve a chat model (wicore serve, or --model smollm2-135m-instruct) to chat.";
  }

  bindImages() {
    this.el("image-label").hidden = false;
    this.el("image").addEventListener("change", async (event) => {
      const file = event.target.files[0];
      if (!file) return;
      this.image = await scaledDataURL(file);
      const thumb = document.createElement("img");
      thumb.src = this.image;
      thumb.alt = file.name;
      this.el("attachments").replaceChildren(thumb);
    });
  }

  clearImage() {
    this.image = null;
    this.el("image").value = "";
    this.el("attachments").replaceChildren();
  }
}

/** "42 tokens · 38.1 tok/s · TTFT 95 ms": decode speed from the first token to the last. */
export function timings(reply, usage) {
  const parts = [];
  const tokens = usage ? usage.completion_tokens : 0;
  parts.push(`${tokens} token${tokens === 1 ? "" : "s"}`);
  if (tokens > 1 && reply.lastAt > reply.firstAt) {
    parts.push(`${((tokens - 1) / ((reply.lastAt - reply.firstAt) / 1000)).toFixed(1)} tok/s`);
  }
  if (reply.firstAt !== null) parts.push(`TTFT ${Math.round(reply.firstAt - reply.sentAt)} ms`);
  if (reply.finishReason) parts.push(reply.finishReason);
  return parts.join(" · ");
}

/** The file as a JPEG data: URL, its longer side at most MAX_IMAGE_SIDE (a photo stays well under the body limit). */
async function scaledDataURL(file) {
  const bitmap = await createImageBitmap(file);
  const scale = Math.min(1, MAX_IMAGE_SIDE / Math.max(bitmap.width, bitmap.height));
  const canvas = document.createElement("canvas");
  canvas.width = Math.round(bitmap.width * scale);
  canvas.height = Math.round(bitmap.height * scale);
  canvas.getContext("2d").drawImage(bitmap, 0, 0, canvas.width, canvas.height);
  return canvas.toDataURL("image/jpeg", 0.92);
}
