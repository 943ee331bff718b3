#!/bin/bash
# usage: ab_stand_in.sh ROUNDS OUT.jsonl
# tools/serve_overhead.py's stand-in engine (HOST_MS holding the GIL + DEVICE_MS device wait a step, 4 + 16) behind the
# real app and Hypercorn, with its steps in the server's process (off) and in a child (on, as
# wicore serve --engine-process on); off / on alternate, order flipped each round. Each line of OUT:
# mode, round, concurrency, load (1-min), bench serve's level record, CPU seconds (clock ticks / 100)
# of the server process and of its engine child over the level.
PY=/work/main/.venv/bin/python; W=/work/wt-proc32; M=/tmp/proc32/model; PORT=8134; OUT=$2
export PYTHONPATH=$W
cpu() { [ -n "$1" ] && awk '{print $14+$15}' /proc/$1/stat 2>/dev/null || echo 0; }
for r in $(seq $1); do
  order="off on"; [ $((r % 2)) = 0 ] && order="on off"
  alone=$(for s in 256 64; do $PY $W/tools/serve_overhead.py --model $M --host-ms ${HOST_MS:-4} --device-ms ${DEVICE_MS:-16} --alone ${s}x128 | cut -d' ' -f2; done | tr '\n' ' ')
  echo "{\"round\": $r, \"alone_256_64\": \"$alone\", \"load\": $(cut -d' ' -f1 /proc/loadavg)}" >> $OUT
  for mode in $order; do
    $PY $W/tools/serve_overhead.py --model $M --host-ms ${HOST_MS:-4} --device-ms ${DEVICE_MS:-16} --port $PORT --engine-process $mode > /tmp/proc32/so-$mode.log 2>&1 &
    SP=$!
    for i in $(seq 100); do curl -s http://127.0.0.1:$PORT/health > /dev/null && break; sleep 0.3; done
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
