#!/bin/bash
# usage: cg.sh W [extra args] -- instructions (callgrind) a token of the app's streaming path: runs of 8 and 40 tokens a stream, differenced
source /work/main/.venv/bin/activate
W=$1; shift; EXTRA="$*"
n() { PYTHONPATH=$W valgrind --tool=callgrind --callgrind-out-file=/dev/null python /tmp/s256/serve_loop_cost.py --model /tmp/s256/model --streams 256 --tokens $1 --repeat 1 $EXTRA 2>&1 | grep Collected | awk '{print $NF}'; }
a=$(n 8 "$@"); b=$(n 40 "$@")
python3 -c "print('$W $*', 'instructions a token:', round(($b - $a) / (256 * 32)))"
