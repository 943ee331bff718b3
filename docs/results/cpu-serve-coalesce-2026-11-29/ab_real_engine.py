"""Same run, interleaved: engine alone at 256/64 seqs, then serve for each code version at 256/64 streams."""
import json, os, subprocess, sys, time, resource, urllib.request
PY = "/work/main/.venv/bin/python"
MODEL = "/tmp/serve32/model"
TICK = os.sysconf("SC_CLK_TCK")
tag = sys.argv[1]; rounds = int(sys.argv[2])
versions = [("base", "/tmp/serve32/base"), ("new", "/tmp/serve32/new1")]
inp, outl, levels = 64, 256, [256, 64]
OUT = open(f"/tmp/serve32/ab2-{tag}.jsonl", "a")

def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK

def timed(cmd, env):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN); t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd="/tmp")
    wall = time.perf_counter() - t0; r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode: print(p.stdout, p.stderr); raise SystemExit(1)
    return p.stdout + p.stderr, wall, (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)

def load(): return open("/proc/loadavg").read().split()[0]
def emit(row): print(json.dumps(row), flush=True); OUT.write(json.dumps(row) + "\n"); OUT.flush()

for r in range(rounds):
    env = {**os.environ, "PYTHONPATH": "/work/wt-serve32"}
    for seqs in levels:
        l0 = load()
        out, wall, c = timed([PY, "-m", "wicore.cli", "bench", "throughput", "--model", MODEL, "--num-prompts", "256", "--input-len", str(inp),
            "--output-len", str(outl), "--threads", "2", "--max-num-seqs", str(seqs), "--max-context", "1024"], env)
        tps = float(out.split("output tokens/s")[0].split(",")[-1])
        emit(dict(round=r, kind="engine", streams=seqs, tok_s=tps, proc_cpu_s=round(c, 2), load=[l0, load()], step=out.strip().splitlines()[-1]))
    order = versions if r % 2 == 0 else versions[::-1]
    for name, path in order:
        env = {**os.environ, "PYTHONPATH": path}
        log = open(f"/tmp/serve32/server-{tag}-{name}-{r}.log", "w")
        srv = subprocess.Popen([PY, "-m", "wicore.cli", "serve", "--model", MODEL, "--threads", "2", "--max-num-seqs", "256", "--max-context", "1024", "--port", "8123"],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd="/tmp")
        for _ in range(600):
            try: urllib.request.urlopen("http://127.0.0.1:8123/health", timeout=1); break
            except Exception: time.sleep(0.5)
        try:
            for conc in levels:
                l0 = load(); s0 = cpu(srv.pid)
                js = f"/tmp/serve32/serve-{tag}-{name}-{r}-{conc}.json"
                out, wall, c = timed([PY, "-m", "wicore.cli", "bench", "serve", "--base-url", "http://127.0.0.1:8123", "--concurrency", str(conc),
                    "--num-prompts", "256", "--input-len", str(inp), "--output-len", str(outl), "--vocab-size", "445", "--min-token-id", "10",
                    "--processes", "2", "--json", js], env)
                s1 = cpu(srv.pid)
                lv = json.load(open(js))["levels"][0]
                emit(dict(round=r, kind="serve", version=name, streams=conc, tok_s=round(lv["output_tokens_per_second"], 1), server_cpu_s=round(s1 - s0, 2),
                    client_cpu_s=round(c, 2), load=[l0, load()], ttft=lv["ttft"], tpot=lv["tpot"], itl=lv["itl"], duration=lv["duration"]))
        finally:
            srv.terminate(); srv.wait()
