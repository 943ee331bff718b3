# Sourced: wait until the six chunks are in /tmp/parts and no longer growing.
for _ in $(seq 900); do
  if [ -f /tmp/parts/WHEEL_NAME ] && [ "$(ls /tmp/parts/part.* 2>/dev/null | wc -l)" = 6 ]; then
    a=$(du -sb /tmp/parts | cut -f1); sleep 3; [ "$a" = "$(du -sb /tmp/parts | cut -f1)" ] && break
  fi
  sleep 2
done
