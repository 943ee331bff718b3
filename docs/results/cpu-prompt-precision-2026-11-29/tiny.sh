#!/bin/bash
cd /work/wt-prompt37
export WICORE_TEST_CACHE=/work/cache-prompt37 WICORE_LLAMA_CPP_SRC=/work/cache-int/llama.cpp-src-0.3.36 TINY37_OUT=/work/cache-prompt37/tiny
export PYTHONPATH=/work/llama-noamx/site:/work/wt-prompt37
echo "$(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg) ours"
TINY37_TAG=ours TINY37_EXPORT=1 /work/main/.venv/bin/python -m pytest -n 0 -q -s tests/export/test_zz_p37_adhoc.py  # docs/results/cpu-prompt-precision-2026-11-29/tiny_agree_test.py copied there 2>&1 | grep -v "^llama_\|^load" | tail -n 12
echo "$(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg) float"
WICORE_MATMULQ_PROMPT=float TINY37_TAG=float TINY37_EXPORT=0 /work/main/.venv/bin/python -m pytest -n 0 -q -s tests/export/test_zz_p37_adhoc.py  # docs/results/cpu-prompt-precision-2026-11-29/tiny_agree_test.py copied there 2>&1 | grep -v "^llama_\|^load" | tail -n 12
echo "$(date -u +%T) end"
