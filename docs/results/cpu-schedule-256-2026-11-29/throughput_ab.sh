#!/bin/bash
# wicore bench throughput, base and new alternately, async on, one ORT thread
for r in $(seq 1 ${ROUNDS:-2}); do
  for side in base new; do
    dir=/work/sched-work/base; [ $side = new ] && dir=/work/wt-sched
    echo "== round $r $side $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
    (cd $dir && flock /tmp/bench54.lock env PYTHONPATH=. /work/main/.venv/bin/python -m wicore.cli bench throughput --model /tmp/sched-tiny --num-prompts 256 --max-num-seqs 256 --input-len 512 --output-len 256 --async-scheduling on --threads 1 --block-size 128 "$@" 2>&1 | tail -2)
  done
done
