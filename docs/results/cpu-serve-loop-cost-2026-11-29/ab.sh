#!/bin/bash
# usage: ab.sh TAG WT OUT.jsonl [LEVELS]  -- one round: engine alone, real serve (engine process on), stand-in (on)
PY=/work/main/.venv/bin/python; TAG=$1; W=$2; OUT=$3; M=/tmp/s256/model; PORT=8156
export PYTHONPATH=$W
cpu() { [ -n "$1" ] && awk '{print $14+$15}' /proc/$1/stat 2>/dev/null || echo 0; }
level() { # kind sp ch conc
  local c=$4; local load=$(cut -d' ' -f1 /proc/loadavg); local s0=$(cpu $2) c0=$(cpu $3)
  $PY -m wicore.cli bench serve --base-url http://127.0.0.1:$PORT --concurrency $c --num-prompts 256 --input-len 64 \
     --output-len 128 --vocab-size 445 --min-token-id 10 --processes 2 --seed $RANDOM --json /tmp/s256/level-$TAG.json > /dev/null 2>&1
  local s1=$(cpu $2) c1=$(cpu $3)
  $PY - "$TAG" "$1" "$c" "$load" "$((s1 - s0))" "$((c1 - c0))" >> $OUT <<'PY'
import json, sys
tag, kind, c, load, s, ch = sys.argv[1:]
lv = json.load(open(f"/tmp/s256/level-{tag}.json"))["levels"][0]
tok = lv["output_tokens_per_second"] * lv.get("duration_s", 0)
print(json.dumps({"tag": tag, "kind": kind, "concurrency": int(c), "load": float(load), "server_cpu_s": int(s) / 100, "child_cpu_s": int(ch) / 100, **lv}))
PY
  tail -1 $OUT | $PY -c "import json,sys; d=json.loads(sys.stdin.read()); print(d['tag'], d['kind'], d['concurrency'], d['load'], round(d['output_tokens_per_second']), 'failed', d['num_failed'], 'srv cpu', d['server_cpu_s'], 'child', d['child_cpu_s'], 'itl', d.get('itl'))"
}
wait_up() { for i in $(seq 200); do curl -s http://127.0.0.1:$PORT/health > /dev/null && return; sleep 0.3; done; }
if [ -z "$SKIP_ALONE" ]; then
$PY -m wicore.cli bench throughput --model $M --num-prompts 256 --input-len 64 --output-len 128 --max-num-seqs 256 --threads 1 --json /tmp/s256/tp-$TAG.json > /dev/null 2>&1
$PY -c "import json; d=json.load(open('/tmp/s256/tp-$TAG.json')); print('$TAG alone', d.get('output_tokens_per_second', d))" | tee -a $OUT.alone
fi
for kind in ${KINDS:-real stand}; do [ $kind = none ] && continue
  if [ $kind = real ]; then
    $PY -m wicore.cli serve --model $M --port $PORT --threads 1 --max-num-seqs 256 --engine-process on > /tmp/s256/serve-$TAG.log 2>&1 &
  else
    $PY $W/tools/serve_overhead.py --model $M --host-ms 1 --device-ms 4 --port $PORT --engine-process on > /tmp/s256/so-$TAG.log 2>&1 &
  fi
  SP=$!; wait_up; CH=$(pgrep -P $SP -f spawn_main)
  for c in ${LEVELS:-256}; do level $kind $SP "$CH" $c; done
  kill $SP; wait $SP 2>/dev/null
done
