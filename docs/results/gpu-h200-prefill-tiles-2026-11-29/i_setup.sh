#!/usr/bin/env bash
# Session 54, call 1 of a cold machine: carry [".whl", ".gpujob"]; run: bash .gpujob/i_setup.sh s54/runP.sh
# The tree is copied to /tmp/repo (later calls replace the call's own copy, not this one), the small wheels go
# to /tmp/site, and the job starts in a session of its own (it outlives this call); it waits for the six ORT
# chunks (calls carrying .ortgpuK: mkdir -p /tmp/parts && cp .ortgpuK/* /tmp/parts/).
set -e
rm -rf /tmp/repo && mkdir -p /tmp/repo && cp -a . /tmp/repo/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
cd /tmp/repo
setsid nohup bash ".gpujob/$1" > "/tmp/job.out" 2>&1 < /dev/null &
echo "started $1 $(date -u +%H:%M:%S)"; nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv,noheader
nproc; df -h /tmp | tail -1
