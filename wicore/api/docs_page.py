"""/docs: the API reference as a page, read from /openapi.json in the browser.

Served from the package (no CDN, no network): a short script lists each endpoint with its
summary, its request fields (type, whether required, limits) and its responses.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>WiCore API</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body { font: 15px/1.5 system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem; color: #222 }
h2 { font-size: 1.05rem; margin: 2rem 0 .3rem; font-family: ui-monospace, monospace }
.method { display: inline-block; min-width: 3.5rem; color: #fff; background: #456; border-radius: 3px;
  padding: 0 .4rem; margin-right: .5rem; text-align: center }
.POST { background: #2a7 } table { border-collapse: collapse; width: 100%; font-size: .9rem }
td, th { border-bottom: 1px solid #ddd; padding: .25rem .5rem; text-align: left; vertical-align: top }
code { font-family: ui-monospace, monospace; font-size: .85rem }
</style></head>
<body><h1 id="title">WiCore API</h1><p id="about"></p><div id="endpoints">Loading /openapi.json ...</div>
<script>
function el(tag, text, cls) { const e = document.createElement(tag); if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls; return e; }
function typeOf(s) { if (!s) return ""; if (s.oneOf) return s.oneOf.map(typeOf).join(" | ");
  if (s.type === "array") return typeOf(s.items) + "[]"; return (s.type || "object") + (s.nullable ? " | null" : ""); }
function limits(s) { const keep = []; for (const k of ["enum", "minimum", "maximum", "maxItems", "maxLength", "default"])
  if (s && s[k] !== undefined) keep.push(JSON.stringify(k) + ":" + (typeof s[k] === "bigint" ? String(s[k]) : JSON.stringify(s[k])));
  return keep.length ? "{" + keep.join(",") + "}" : ""; }
// Integers past 2^53 (seed's 64-bit limits) as written, not rounded to the nearest double.
function exact(key, value, context) { return typeof value === "number" && !Number.isSafeInteger(value) && context &&
  /^-?[0-9]+$/.test(context.source) ? BigInt(context.source) : value; }
function fields(schema) {
  const table = el("table"); const head = table.insertRow();
  for (const h of ["field", "type", "required", "limits"]) head.appendChild(el("th", h));
  const required = new Set(schema.required || []);
  for (const [name, s] of Object.entries(schema.properties || {})) {
    const row = table.insertRow(); row.insertCell().appendChild(el("code", name));
    row.insertCell().textContent = typeOf(s); row.insertCell().textContent = required.has(name) ? "yes" : "";
    row.insertCell().appendChild(el("code", limits(s)));
  }
  return table;
}
fetch("/openapi.json").then(r => r.text()).then(text => JSON.parse(text, exact)).then(spec => {
  document.getElementById("title").textContent = spec.info.title + " (WiCore " + spec.info.version + ")";
  document.getElementById("about").textContent = spec.info.description || "";
  const root = document.getElementById("endpoints"); root.textContent = "";
  for (const [path, methods] of Object.entries(spec.paths)) for (const [method, op] of Object.entries(methods)) {
    const h = el("h2"); h.appendChild(el("span", method.toUpperCase(), "method " + method.toUpperCase()));
    h.appendChild(document.createTextNode(path)); root.appendChild(h);
    if (op.summary || op.description) root.appendChild(el("p", op.summary || op.description));
    const body = op.requestBody && op.requestBody.content && op.requestBody.content["application/json"];
    if (body && body.schema) root.appendChild(fields(body.schema));
    const codes = Object.entries(op.responses || {}).map(([c, r]) => c + " " + (r.description || "")).join("; ");
    if (codes) root.appendChild(el("p", "Responses: " + codes));
  }
}).catch(err => { document.getElementById("endpoints").textContent = "Could not read /openapi.json: " + err; });
</script></body></html>
"""


async def docs_route(request: Request) -> Response:
    return HTMLResponse(PAGE)
