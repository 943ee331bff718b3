"""Rows of the section's table from ab/ab2 round lines: FILE... ; engines named base|before and new|after."""
import re, sys
for path in sys.argv[1:]:
    for line in open(path):
        m = re.match(r"(\d\d:\d\d:\d\d) load .*? (\S+) round \d+: \S+ (?:threads \d+)?\s+load ([\d.]+)-([\d.]+) \| (.*)", line)
        if not m: continue
        t, model, l0, l1, rest = m.groups()
        eng = dict(re.findall(r"(\S+) wall ([\d.]+) p10 ([\d.]+)", rest) and [(n, (float(w), float(p))) for n, w, p in re.findall(r"(\S+) wall ([\d.]+) p10 ([\d.]+)", rest)])
        b = eng.get("base") or eng.get("before"); a = eng.get("new") or eng.get("after"); l = eng["llama.cpp"]
        if not (a and b): continue
        starved = l[0] > 1.5 * l[1]
        load = l0 if l0 == l1 else f"{min(l0, l1, key=float)}-{max(l0, l1, key=float)}"
        fam, quant = model.split("-", 1)
        lib = "df51548" if path.endswith("rounds-a.txt") else "fa917a7"
        if starved: continue
        print(f"| {fam} {quant} | {t[:5]} | {load} | {lib} | {b[0]:.3f} | {a[0]:.3f} | {l[0]:.3f} | {l[0]/b[0]:.2f}x | **{l[0]/a[0]:.2f}x** | {l[1]/b[1]:.2f}x / {l[1]/a[1]:.2f}x |")
