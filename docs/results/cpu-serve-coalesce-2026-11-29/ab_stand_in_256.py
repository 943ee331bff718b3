"""The stand-in engine (tools/serve_overhead.py) alone and behind each code version's server, interleaved."""
import json, os, subprocess, sys, time, resource, urllib.request
PY = "/work/main/.venv/bin/python"; TOOL = "/work/wt-serve32/tools/serve_overhead.py"; MODEL = "/tmp/serve32/model"
TICK = os.sysconf("SC_CLK_TCK")
tag, rounds = sys.argv[1], int(sys.argv[2]); versions = json.loads(sys.argv[3]); step = sys.argv[4].split()  # e.g. "--host-ms 4 --device-ms 16"
levels = [int(x) for x in os.environ.get("LEVELS", "256,64").split(",")]; OUTLEN = os.environ.get("OUTLEN", "256")
OUT = open(f"/tmp/serve32/ab4-{tag}.jsonl", "a")
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split(); return (int(f[11]) + int(f[12])) / TICK
def run(cmd, env):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd="/tmp")
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode: print(p.stdout, p.stderr); raise SystemExit(1)
    return p.stdout, (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
def load(): return open("/proc/loadavg").read().split()[0]
def emit(row): print(json.dumps(row), flush=True); OUT.write(json.dumps(row) + "\n"); OUT.flush()
for r in range(rounds):
    env = {**os.environ, "PYTHONPATH": "/work/wt-serve32"}
    for seqs in levels:
        l0 = load(); out, c = run([PY, TOOL, "--model", MODEL, *step, "--max-num-seqs", str(seqs), "--alone", "256x" + OUTLEN], env)
        emit(dict(round=r, kind="alone", streams=seqs, tok_s=float(out.split()[1]), cpu_s=round(c, 2), load=[l0, load()]))
    for name, path, flags in (versions if r % 2 == 0 else versions[::-1]):
        env = {**os.environ, "PYTHONPATH": path}
        srv = subprocess.Popen([PY, TOOL, "--model", MODEL, *step, "--port", "8131", *flags], env=env, cwd="/tmp",
                               stdout=open(f"/tmp/serve32/ab4-{tag}-{name}.log", "w"), stderr=subprocess.STDOUT)
        for _ in range(200):
            try: urllib.request.urlopen("http://127.0.0.1:8131/health", timeout=1); break
            except Exception: time.sleep(0.3)
        try:
            for conc in levels:
                l0 = load(); s0 = cpu(srv.pid); js = f"/tmp/serve32/ab4-{tag}-{name}-{r}-{conc}.json"
                out, c = run([PY, "-m", "wicore.cli", "bench", "serve", "--base-url", "http://127.0.0.1:8131", "--concurrency", str(conc), "--num-prompts", "256",
                    "--input-len", "64", "--output-len", OUTLEN, "--vocab-size", "445", "--min-token-id", "10", "--processes", "2", "--json", js], env)
                s1 = cpu(srv.pid); lv = json.load(open(js))["levels"][0]
                emit(dict(round=r, kind="serve", version=name, streams=conc, tok_s=round(lv["output_tokens_per_second"], 1), server_cpu_s=round(s1 - s0, 2),
                    client_cpu_s=round(c, 2), load=[l0, load()], ttft_ms=[round(lv["ttft"][k]) for k in ("mean", "p99")],
                    tpot_ms=[round(lv["tpot"][k], 1) for k in ("mean", "p99")], itl_ms=[round(lv["itl"][k], 1) for k in ("p50", "p99")], duration=round(lv["duration"], 2)))
        finally:
            srv.terminate(); srv.wait()
