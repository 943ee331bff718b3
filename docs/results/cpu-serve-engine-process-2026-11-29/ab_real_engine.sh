#!/bin/bash
# usage: ab_real_engine.sh ROUNDS OUT.jsonl
# `wicore serve --engine-process off / on` with the real engine (the tiny 2-layer chat model of
# build_model.py, THREADS ONNX Runtime threads, default 2; ENGINE_FLAGS more engine flags; LEVELS the streams) loaded by `wicore bench serve` at 256, 64, 16 and 1 streams
# (64 + 128 tokens a request); off / on alternate, order flipped each round; `wicore bench throughput`
# for the engine alone (256 requests of the same lengths) once a round. Lines as ab_stand_in.sh's.
PY=/work/main/.venv/bin/python; W=/work/wt-proc32; M=/tmp/proc32/model; PORT=8135; OUT=$2
export PYTHONPATH=$W WICORE_CACHE=/work/cache-proc32
cpu() { [ -n "$1" ] && awk '{print $14+$15}' /proc/$1/stat 2>/dev/null || echo 0; }
for r in $(seq $1); do
  order="off on"; [ $((r % 2)) = 0 ] && order="on off"
  load=$(cut -d' ' -f1 /proc/loadavg)
  $PY -m wicore.cli bench throughput --model $M --threads ${THREADS:-2} ${ENGINE_FLAGS:-} --num-prompts 256 --input-len 64 --output-len 128 \
    --json /tmp/proc32/tp.json > /dev/null 2>&1
  $PY -c "import json,sys; d=json.load(open('/tmp/proc32/tp.json')); print(json.dumps({'mode': 'alone', 'round': $r, 'load': $load, 'output_tokens_per_second': d['output_tokens_per_second']}))" >> $OUT
  tail -1 $OUT
  for mode in $order; do
    $PY -m wicore.cli serve --model $M --threads ${THREADS:-2} ${ENGINE_FLAGS:-} --port $PORT --engine-process $mode > /tmp/proc32/serve-$mode.log 2>&1 &
    SP=$!
    for i in $(seq 200); do curl -s http://127.0.0.1:$PORT/health > /dev/null && break; sleep 0.3; done
    CH=$(pgrep -P $SP -f spawn_main)
    for c in ${LEVELS:-256 64 16 1}; do
      n=256; [ $c = 16 ] && n=64; [ $c = 1 ] && n=8
      load=$(cut -d' ' -f1 /proc/loadavg); s0=$(cpu $SP); c0=$(cpu $CH)
      $PY -m wicore.cli bench serve --base-url http://127.0.0.1:$PORT --concurrency $c --num-prompts $n --input-len 64 \
        --output-len 128 --vocab-size 445 --min-token-id 10 --processes 2 --json /tmp/proc32/level.json > /dev/null 2>&1
      s1=$(cpu $SP); c1=$(cpu $CH)
      $PY - "$mode" "$r" "$c" "$load" "$((s1 - s0))" "$((c1 - c0))" >> $OUT <<'PY'
import json, sys
mode, r, c, load, s, ch = sys.argv[1:]
level = json.load(open("/tmp/proc32/level.json"))["levels"][0]
print(json.dumps({"mode": mode, "round": int(r), "concurrency": int(c), "load": float(load),
                  "server_cpu_s": int(s) / 100, "child_cpu_s": int(ch) / 100, **level}))
PY
      tail -1 $OUT | $PY -c "import json,sys; d=json.loads(sys.stdin.read()); print(d['mode'], d['round'], d['concurrency'], d['load'], round(d['output_tokens_per_second']), d['num_failed'], d['ttft']['p99'] if d['ttft'] else None, d['server_cpu_s'], d['child_cpu_s'])"
    done
    kill $SP; wait $SP
  done
done
