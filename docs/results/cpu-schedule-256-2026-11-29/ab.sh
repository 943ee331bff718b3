#!/bin/bash
# alternate base / new, ROUNDS times; each run one process under the bench lock
OUT=${OUT:-/work/sched-work/ab}; mkdir -p $OUT
for r in $(seq 1 ${ROUNDS:-3}); do
  for side in base new; do
    dir=/work/sched-work/base; [ $side = new ] && dir=/work/wt-sched
    echo "== round $r $side $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
    (cd $dir && flock /tmp/bench54.lock env PYTHONPATH=. /work/main/.venv/bin/python tools/profile_schedule.py --model-dir /tmp/sched-tiny --block-size 128 "$@" --label $side --json $OUT/$side-$r.json | grep -E "full|run:")
  done
done
