#!/bin/bash
# usage: prof.sh TAG WT  -- py-spy the API process (stand-in child) during one 256-stream level
PY=/work/main/.venv/bin/python; TAG=$1; W=$2; M=/tmp/s256/model; PORT=8157
export PYTHONPATH=$W
$PY -m wicore.cli serve --model $M --port $PORT --threads 1 --max-num-seqs 256 --engine-process on > /tmp/s256/sop-$TAG.log 2>&1 &
SP=$!
for i in $(seq 200); do curl -s http://127.0.0.1:$PORT/health > /dev/null && break; sleep 0.3; done
/work/main/.venv/bin/py-spy record -p $SP -r 200 -f raw -o /tmp/s256/pyspy-$TAG.txt > /dev/null 2>&1 &
PS=$!; sleep 1
$PY -m wicore.cli bench serve --base-url http://127.0.0.1:$PORT --concurrency 256 --num-prompts 256 --input-len 64 \
     --output-len 128 --vocab-size 445 --min-token-id 10 --processes 2 2>&1 | tail -4
kill -INT $PS; wait $PS; kill $SP; wait $SP 2>/dev/null
