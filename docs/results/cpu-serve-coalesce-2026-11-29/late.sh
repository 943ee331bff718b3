#!/bin/bash
# usage: late.sh ROUNDS ; base/new alternate; prints tok/s and the engine thread's GIL lateness a step
PY=/work/main/.venv/bin/python; cd /tmp
for r in $(seq $1); do
  if [ $((r % 2)) = 1 ]; then order="base new"; else order="new base"; fi
  for v in $order; do
    P=/tmp/serve32/base; [ $v = new ] && P=/tmp/serve32/new2
    for c in ${LEVELS:-256 64}; do
      PYTHONPATH=$P $PY /work/wt-serve32/tools/serve_overhead.py --model /tmp/serve32/model --host-ms 4 --device-ms 16 --port 8133 > /dev/null 2>&1 &
      SP=$!
      for i in $(seq 100); do curl -s http://127.0.0.1:8133/health >/dev/null && break; sleep 0.3; done
      out=$(PYTHONPATH=$P $PY -m wicore.cli bench serve --base-url http://127.0.0.1:8133 --concurrency $c --num-prompts 256 --input-len 64 --output-len 128 --vocab-size 445 --min-token-id 10 --processes 2 | head -4 | tr '\n' ' ')
      st=$(curl -s http://127.0.0.1:8133/v1/stats)
      echo "r$r $v c=$c load=$(cut -d' ' -f1 /proc/loadavg) $st $out"
      kill $SP; wait $SP
    done
  done
done
