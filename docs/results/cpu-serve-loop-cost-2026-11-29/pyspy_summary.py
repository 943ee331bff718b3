import sys, collections, re
path = sys.argv[1]; top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
threads = collections.Counter(); incl = collections.Counter(); self_ = collections.Counter(); total = 0
for line in open(path):
    stack, n = line.rstrip().rsplit(" ", 1); n = int(n)
    frames = stack.split(";")
    th = frames[0]; frames = frames[1:]
    threads[th] += n; total += n
    seen = set()
    for f in frames:
        key = (th[:30], re.sub(r":\d+\)", ")", f))
        if key not in seen:
            incl[key] += n; seen.add(key)
    self_[(th[:30], re.sub(r":\d+\)", ")", frames[-1]) if frames else "?")] += n
print("total", total)
for th, n in threads.most_common(): print(f"{n:7d} {100*n/total:5.1f}% {th}")
print("--- inclusive")
for (th, f), n in incl.most_common(top): print(f"{n:7d} {100*n/total:5.1f}% {th} {f}")
print("--- self")
for (th, f), n in self_.most_common(top): print(f"{n:7d} {100*n/total:5.1f}% {th} {f}")
