#!/bin/bash
HERE=$(cd "$(dirname "$0")" && pwd)
for side in base new; do
  dir=/work/sched-work/base; [ $side = new ] && dir=/work/wt-sched
  for steps in 0 40; do
    (cd $dir && PYTHONPATH=. valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$side.$steps /work/main/.venv/bin/python $HERE/scheduler_loop.py $side steps=$steps 2>&1 | grep -E "Collected" | sed "s/^/$side steps=$steps /")
  done
done
