#!/usr/bin/env bash
# `wicore serve` with the engine in the server's process and in its own (--engine-process off / on),
# against the engine's own rate (`wicore bench throughput`), for the same requests (issue 32).
#
#   bash tools/gpu_serve_engine_process.sh EXPORT_DIR OUT_DIR
#
# EXPORT_DIR: an export with a tokenizer (the 27B shape's 8 layers, as the 2026-11-29 runs).
# OUT_DIR:    gets serve-{off,on}-rR-cC.json (bench serve at C streams), serve-{off,on}-rR.log
#             (the server's console), throughput-rR.json, and job.log (everything this script says).
# Environment (defaults in brackets):
#   ENGINE_FLAGS  the engine's flags, the same for the servers and the throughput run
#                 [--devices cuda:0 --cuda-graphs on --max-num-seqs 256 --max-context 1024 --kv-pool-gb 24]
#   CONCURRENCY [1,64,256]  NUM_PROMPTS [256]  NUM_PROMPTS_C1 [16]: level 1 runs its requests one after
#   another (256 of them would take minutes a server), so it gets this many. Each level is a bench run
#   of its own with its own prompts (--seed C): with one seed a level's prompts are the level before's,
#   found in the prefix cache (2026-11-29 11:22: 256 streams after 64 gave 12,261 tok/s against the
#   engine's 8,971 with no cache)
#   INPUT_LEN [512] OUTPUT_LEN [256]; ROUNDS [1]: round 2 runs "on" before "off" (interleaved); PORT [8123]; PYTHON [python3]
set -u
M=${1:?usage: gpu_serve_engine_process.sh EXPORT_DIR OUT_DIR}
R=${2:?usage: gpu_serve_engine_process.sh EXPORT_DIR OUT_DIR}
mkdir -p "$R"
exec > >(tee -a "$R/job.log") 2>&1
PY=${PYTHON:-python3}
read -r -a ENG <<< "${ENGINE_FLAGS:---devices cuda:0 --cuda-graphs on --max-num-seqs 256 --max-context 1024 --kv-pool-gb 24}"
CONC=${CONCURRENCY:-1,64,256}
N=${NUM_PROMPTS:-256}
N1=${NUM_PROMPTS_C1:-16}
PORT=${PORT:-8123}
LENS=(--input-len "${INPUT_LEN:-512}" --output-len "${OUTPUT_LEN:-256}")
LOAD=("${LENS[@]}" --processes 4 --min-token-id 300)
VOCAB=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]+'/wicore.json'))['config']['vocab_size'])" "$M") || exit 1
echo "start $(date -u +%H:%M:%S) UTC; $(git rev-parse --short HEAD 2>/dev/null); export $M, vocab $VOCAB; engine: ${ENG[*]}"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null

serve_run() {  # serve_run off|on ROUND: start the server, wait for it, load it, stop it
  local mode=$1 round=$2 url="http://127.0.0.1:$PORT" sp
  echo "=== --engine-process $mode, round $round ($(date -u +%H:%M:%S) UTC; $(uptime | sed 's/.*load/load/'))"
  $PY -m wicore.cli serve --model "$M" "${ENG[@]}" --port "$PORT" --engine-process "$mode" > "$R/serve-$mode-r$round.log" 2>&1 &
  sp=$!
  for _ in $(seq 600); do
    curl -sf "$url/v1/models" > /dev/null && break
    kill -0 $sp 2> /dev/null || { echo "the server exited:"; tail -20 "$R/serve-$mode-r$round.log"; return 1; }
    sleep 1
  done
  grep -m1 "INFO wicore.api: .*layers" "$R/serve-$mode-r$round.log"
  local c n
  for c in ${CONC//,/ }; do  # a bench run a level, its own prompts (--seed): no level finds the last one's cached
    n=$N; [ "$c" = 1 ] && n=$N1
    timeout 600 $PY -m wicore.cli bench serve --base-url "$url" --concurrency "$c" --num-prompts "$n" "${LOAD[@]}" \
      --vocab-size "$VOCAB" --seed "$c" --json "$R/serve-$mode-r$round-c$c.json" 2>&1 | tail -4
  done
  curl -s "$url/v1/stats" | head -c 200; echo
  kill -TERM $sp; wait $sp; echo "server exit code $?"
}

for round in $(seq "${ROUNDS:-1}"); do
  order="off on"; [ $((round % 2)) = 0 ] && order="on off"
  for mode in $order; do serve_run "$mode" "$round"; done
  echo "=== bench throughput, round $round ($(date -u +%H:%M:%S) UTC)"
  timeout 300 $PY -m wicore.cli bench throughput --model "$M" "${ENG[@]}" --num-prompts "$N" "${LENS[@]}" \
    --json "$R/throughput-r$round.json" 2>&1 | grep -v "^Writing" | tail -3
done
$PY - "$R" <<'PY'
import json, sys
from pathlib import Path
r = Path(sys.argv[1])
for f in sorted(r.glob("throughput-*.json")):
    print(f.name, round(json.loads(f.read_text())["output_tokens_per_second"], 1), "output tok/s")
for f in sorted(r.glob("serve-*.json")):
    for level in json.loads(f.read_text())["levels"]:
        p99 = {k: round(level[k]["p99"], 1) for k in ("ttft", "itl") if level.get(k)}
        print(f.name, level["concurrency"], round(level["output_tokens_per_second"], 1), "output tok/s, failed",
              level["num_failed"], "p99 ms", p99)
PY
echo "JOB-DONE $(date -u +%H:%M:%S) UTC"
