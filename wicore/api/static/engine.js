// The engine view: /v1/stats every second and /metrics every 5 s, while the view is open, drawn
// as tiles and four small canvas charts of the last minute (no chart library).

const HISTORY = 60; // samples kept: one a second
const STATS_EVERY_MS = 1000;
const METRICS_EVERY = 5; // /metrics once every this many /v1/stats
const COLORS = ["#2f6fdf", "#e67e22", "#8e44ad"];
const TIERS = ["device", "host", "nvme"];

export class EngineView {
  constructor(client) {
    this.client = client;
    this.samples = []; // {running, waiting, swapped, blocks: {tier: n}, hit, tps}
    this.metrics = {};
    this.timer = null;
    this.ticks = 0;
  }

  setActive(active) {
    clearTimeout(this.timer);
    this.timer = null;
    if (active) this.poll();
  }

  async poll() {
    let delay = STATS_EVERY_MS;
    try {
      const stats = await (await this.client.get("/v1/stats")).json();
      if (this.ticks++ % METRICS_EVERY === 0) {
        this.metrics = parsePrometheus(await (await this.client.get("/metrics")).text());
      }
      this.add(stats);
      this.draw(stats);
      document.getElementById("engine-note").classList.remove("error");
    } catch (error) {
      const note = document.getElementById("engine-note");
      note.textContent = `Could not read the engine's state: ${error.message}`;
      note.classList.add("error");
      if (error.retryAfter) delay = error.retryAfter * 1000; // rate limited: wait as told
    }
    if (!document.getElementById("view-engine").hidden) this.timer = setTimeout(() => this.poll(), delay);
  }

  add(stats) {
    this.samples.push({
      running: stats.running,
      waiting: stats.waiting,
      swapped: stats.swapped,
      blocks: stats.blocks_in_use,
      hit: stats.prefix_hit_rate,
      tps: stats.tokens_per_second,
    });
    if (this.samples.length > HISTORY) this.samples.shift();
  }

  draw(stats) {
    const m = this.metrics;
    const ttftCount = m["wicore_time_to_first_token_seconds_count"] || 0;
    const ttft = ttftCount ? `${Math.round((1000 * m["wicore_time_to_first_token_seconds_sum"]) / ttftCount)} ms` : "–";
    const tiles = [
      ["running", stats.running],
      ["waiting", stats.waiting],
      ["swapped", stats.swapped],
      ["tokens/s", stats.tokens_per_second.toFixed(1)],
      ["prefix-cache hits", `${(100 * stats.prefix_hit_rate).toFixed(1)}%`],
      ["requests finished", m["wicore_e2e_request_seconds_count"] ?? "–"],
      ["tokens generated", stats.generated_tokens],
      ["mean time to first token", ttft],
    ];
    const root = document.getElementById("tiles");
    root.replaceChildren(
      ...tiles.map(([label, value]) => {
        const tile = document.createElement("div");
        tile.className = "tile";
        tile.dataset.name = label;
        tile.innerHTML = '<div class="value"></div><div class="label"></div>';
        tile.querySelector(".value").textContent = String(value);
        tile.querySelector(".label").textContent = label;
        return tile;
      }),
    );
    const s = this.samples;
    const capacity = Object.fromEntries(TIERS.map((t) => [t, stats.blocks_in_use[t] + stats.blocks_free[t]]));
    chart("requests", { running: s.map((x) => x.running), waiting: s.map((x) => x.waiting), swapped: s.map((x) => x.swapped) });
    chart(
      "blocks",
      Object.fromEntries(TIERS.map((t) => [`${t} ${stats.blocks_in_use[t]}/${capacity[t]}`, s.map((x) => x.blocks[t])])),
    );
    chart("hit", { [`hit rate ${(100 * stats.prefix_hit_rate).toFixed(1)}%`]: s.map((x) => x.hit) }, 1);
    chart("tps", { [`${stats.tokens_per_second.toFixed(1)} tokens/s`]: s.map((x) => x.tps) });
  }
}

/** Draw series (name -> values, oldest first, at most HISTORY) as lines on canvas#chart-{id}. */
function chart(id, series, fixedMax) {
  const canvas = document.getElementById(`chart-${id}`);
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || canvas.width;
  const height = canvas.clientHeight || canvas.height;
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  const g = canvas.getContext("2d");
  g.scale(ratio, ratio);
  const values = Object.values(series).flat();
  const max = fixedMax ?? niceMax(Math.max(1, ...values));
  const left = 34, right = 6, top = 8, bottom = 16;
  const x = (i) => left + ((width - left - right) * i) / (HISTORY - 1);
  const y = (v) => top + (height - top - bottom) * (1 - v / max);
  g.font = "11px system-ui, sans-serif";
  g.fillStyle = "#667085";
  g.strokeStyle = "#e6e9ef";
  g.lineWidth = 1;
  for (const f of [0, 0.5, 1]) { // grid and the value scale
    g.beginPath();
    g.moveTo(left, y(max * f));
    g.lineTo(width - right, y(max * f));
    g.stroke();
    g.fillText(formatTick(max * f), 2, y(max * f) + 4);
  }
  g.fillText("-60 s", left, height - 3);
  g.fillText("now", width - right - 22, height - 3);
  Object.values(series).forEach((points, k) => {
    const offset = HISTORY - points.length; // the newest sample sits at the right edge
    g.strokeStyle = COLORS[k % COLORS.length];
    g.lineWidth = 2;
    g.beginPath();
    points.forEach((v, i) => (i ? g.lineTo(x(offset + i), y(v)) : g.moveTo(x(offset + i), y(v))));
    g.stroke();
  });
  document.getElementById(`legend-${id}`).replaceChildren(
    ...Object.keys(series).map((name, k) => {
      const span = document.createElement("span");
      span.className = `s${k % COLORS.length}`;
      span.textContent = name;
      return span;
    }),
  );
}

function niceMax(v) {
  const step = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 5, 10].map((f) => f * step).find((m) => m >= v);
}

function formatTick(v) {
  return v >= 100 || Number.isInteger(v) ? String(Math.round(v)) : v.toFixed(1);
}

/** Prometheus text format -> {name: value}, series of one name summed over their labels. */
export function parsePrometheus(text) {
  const totals = {};
  for (const line of text.split("\n")) {
    const match = /^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!match) continue;
    const value = Number(match[3]);
    if (Number.isFinite(value)) totals[match[1]] = (totals[match[1]] || 0) + value;
  }
  return totals;
}
