#!/bin/bash
# usage: cg_http.sh W PORT -- instructions (callgrind) of the API process a streamed token over HTTP (Hypercorn included):
# the stand-in engine in a child (not traced), 16 streams, steps of 300 ms so that every token is its own event;
# runs of 8 and 40 tokens a stream, differenced.
source /work/main/.venv/bin/activate
W=$1; PORT=$2; export PYTHONHASHSEED=0
n() {
  PYTHONPATH=$W valgrind --tool=callgrind --callgrind-out-file=/dev/null python $W/tools/serve_overhead.py --model /tmp/s256/model \
     --host-ms 1 --device-ms 300 --port $PORT --engine-process on > /tmp/s256/cgh-$PORT.log 2>&1 &
  local SP=$!
  for i in $(seq 600); do curl -s http://127.0.0.1:$PORT/health > /dev/null && break; sleep 0.5; done
  PYTHONPATH=$W python -m wicore.cli bench serve --base-url http://127.0.0.1:$PORT --concurrency 16 --num-prompts 16 --input-len 64 \
     --output-len $1 --vocab-size 445 --min-token-id 10 --seed 1 --json /tmp/s256/cgh-$PORT.json > /dev/null 2>&1
  kill -TERM $SP; wait $SP
  python3 -c "import json; l=json.load(open('/tmp/s256/cgh-$PORT.json'))['levels']; print(l[-1]['num_output_tokens'], l[-1].get('itl'), file=open('/tmp/s256/cgh-$PORT.lv','a'))"
  grep Collected /tmp/s256/cgh-$PORT.log | awk '{print $NF}'
}
a=$(n 8); b=$(n 40)
python3 -c "print('$W http', $a, $b, 'instructions a token:', round(($b - $a) / (16 * 32)))"
