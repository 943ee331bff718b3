// WiCore's page: the API key (kept for this tab only), the two views, and the start-up.
//
//   /web/config.json ─401─► ask for the key ─► sessionStorage ─► retry
//                    ─429 failed-key lockout─► the key dialog, saying so (retry once the lockout ends)
//                    └─ok─► model name, image upload on/off ─► Chat (/v1/ws) + EngineView (/v1/stats, /metrics)

import { Chat } from "./chat.js";
import { EngineView } from "./engine.js";

const KEY_ITEM = "wicore.api_key";
const LOCKOUT = "failed_key_lockout"; // the 429's code after too many failed keys from this address

/** Whether an error is about the key: a refused one (401), or the lockout that follows many (429). */
export function isKeyError(status, error) {
  return status === 401 || (status === 429 && error && error.code === LOCKOUT);
}

export class Client {
  /** The server this page came from, with the key the user gave (if the server asks for one). */
  constructor() {
    this.key = sessionStorage.getItem(KEY_ITEM) || "";
    this.dialog = document.getElementById("key-dialog");
  }

  headers() {
    return this.key ? { Authorization: `Bearer ${this.key}` } : {};
  }

  /** GET `path`; a 401 asks for the key and tries again. Other errors throw with the server's message. */
  async get(path) {
    for (;;) {
      const response = await fetch(path, { headers: this.headers(), cache: "no-store" });
      if (response.status === 401 || response.status === 429) {
        const error = await errorOf(response);
        if (isKeyError(response.status, error)) {
          await this.askKey(error.message, response.status === 429);
          continue;
        }
        return this.fail(response.status, error, response);
      }
      if (!response.ok) return this.fail(response.status, await errorOf(response), response);
      return response;
    }
  }

  fail(status, body, response) {
    const error = new Error(body.message);
    error.status = status;
    error.retryAfter = Number(response.headers.get("Retry-After") || 0);
    throw error;
  }

  /** Show the key dialog until the user submits a key; keep it for this tab. The reason shows
   *  when a key was refused, and always for the lockout (`always`). */
  askKey(reason, always = false) {
    const form = document.getElementById("key-form");
    const input = document.getElementById("key-input");
    document.getElementById("key-error").textContent = this.key || always ? reason : "";
    input.value = ""; // a refused key is not offered again
    return new Promise((resolve) => {
      form.onsubmit = (event) => {
        event.preventDefault();
        this.key = input.value.trim();
        sessionStorage.setItem(KEY_ITEM, this.key);
        this.dialog.close();
        resolve();
      };
      if (!this.dialog.open) this.dialog.showModal();
      input.focus();
    });
  }

  socketURL() {
    return `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/ws`;
  }
}

async function errorOf(response) {
  try {
    const body = await response.json();
    return body.error || { message: `HTTP ${response.status}` };
  } catch {
    return { message: `HTTP ${response.status}` };
  }
}

function showView(name, views) {
  for (const [key, view] of Object.entries(views)) {
    const active = key === name;
    document.getElementById(`view-${key}`).hidden = !active;
    document.getElementById(`tab-${key}`).setAttribute("aria-pressed", String(active));
    view.setActive(active);
  }
}

async function main() {
  const client = new Client();
  const config = await (await client.get("/web/config.json")).json();
  document.getElementById("model").textContent = config.model;
  document.title = `WiCore · ${config.model}`;
  const views = { chat: new Chat(client, config), engine: new EngineView(client) };
  for (const name of Object.keys(views)) {
    document.getElementById(`tab-${name}`).addEventListener("click", () => showView(name, views));
  }
  showView(location.hash === "#engine" ? "engine" : "chat", views);
}

main().catch((error) => {
  const status = document.getElementById("status");
  status.dataset.state = "error";
  status.textContent = `error: ${error.message}`;
});
