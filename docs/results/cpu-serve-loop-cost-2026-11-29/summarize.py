"""Medians of final.jsonl's rounds: tok/s through the server (real engine / stand-in), server CPU a token, and the
real engine's rate over the engine alone in the same round (final.jsonl.alone)."""
import json, re, statistics as st, sys
d = sys.argv[1] if len(sys.argv) > 1 else "."
rows = [json.loads(l) for l in open(f"{d}/final.jsonl")]
alone = [float(m) for m in re.findall(r"alone\d+ alone ([\d.]+)", open(f"{d}/final.jsonl.alone").read())]
print("engine alone, tok/s by round:", [round(a) for a in alone], "median", round(st.median(alone)))
print("| engine | streams | base tok/s (each round) | change tok/s (each round) | median base / change | server CPU a token, ms, median base / change |")
print("|---|---:|---|---|---:|---:|")
for kind in ("real", "stand"):
    for c in (256, 64):
        r = {t: [x for x in rows if x["kind"] == kind and x["concurrency"] == c and x["tag"] == t] for t in ("base", "change")}
        tok = {t: [round(x["output_tokens_per_second"]) for x in r[t]] for t in r}
        cpu = {t: st.median(1e3 * x["server_cpu_s"] / x["num_output_tokens"] for x in r[t]) for t in r}
        print(f"| {kind} | {c} | {', '.join(map(str, tok['base']))} | {', '.join(map(str, tok['change']))} | "
              f"{st.median(tok['base']):,.0f} / {st.median(tok['change']):,.0f} | {cpu['base']:.3f} / {cpu['change']:.3f} |")
for t in ("base", "change"):
    ratios = [x["output_tokens_per_second"] / alone[int(i)] for i, x in enumerate(x for x in rows if x["kind"] == "real" and x["concurrency"] == 256 and x["tag"] == t)]
    print(t, "real 256 / engine alone, each round:", [round(v, 2) for v in ratios])
