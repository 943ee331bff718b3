import gc, sys, time
sys.path.insert(0, "tools")
import profile_schedule as ps
real = ps.make_core
log = []
t0 = [0.0]
def cb(phase, info):
    if info["generation"] != 2: return
    if phase == "start": t0[0] = time.perf_counter()
    else: log.append((round(1e3*(time.perf_counter()-t0[0]),1), info["collected"], len(gc.get_objects(2))))
def make_core(args):
    core = real(args)
    if freeze:
        gc.collect(); gc.freeze()
    gc.callbacks.append(cb)
    return core
ps.make_core = make_core
freeze = "freeze" in sys.argv
sys.argv = [a for a in sys.argv if a != "freeze"]
ps.main()
print("freeze" if freeze else "plain", "gen2 passes (ms, collected, objects in gen2 after):", log, "frozen", gc.get_freeze_count())
