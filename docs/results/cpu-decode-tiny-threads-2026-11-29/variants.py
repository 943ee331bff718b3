"""Ad-hoc (issue 37, 2026-11-29): build a variant of this tree's kernel library for the measurements of
docs/PERFORMANCE.md's section on the head at two threads. usage: variants.py trace|halves|inline OUT_DIR
  trace:  MatMulQ records, for calls of N > 10,000 (the head), which thread ran each task of 64 rows, when
          ONNX Runtime's worker took its first, when the caller finished its last; with WICORE_TRACE set it
          prints the means of every 200 calls to stderr
  halves: a one-row MatMulQ asks ParallelFor for WICORE_BATCHES pieces (num_batch: each one contiguous range
          of tasks; the brief's "as many pieces as threads", at two threads)
  inline: a MatMulQ of m * n * k < WICORE_MIN_PARALLEL runs its tasks on the caller alone"""
import pathlib, shutil, subprocess, sys
kind, out = sys.argv[1], pathlib.Path(sys.argv[2])
tree = pathlib.Path(__file__).resolve().parents[3] / "wicore" / "kernels"
shutil.rmtree(out / "csrc", ignore_errors=True)
shutil.copytree(tree / "csrc", out / "csrc")
p = out / "csrc" / "ops.cc"
s = p.read_text()
call = "    ctx.ParallelFor(&Run, static_cast<size_t>(tasks), 0, &work);\n  }"
assert call in s
if kind == "halves":
    s = s.replace(call, '''    static const size_t batches = std::getenv("WICORE_BATCHES") ? std::atoi(std::getenv("WICORE_BATCHES")) : 0;
    ctx.ParallelFor(&Run, static_cast<size_t>(tasks), m == 1 ? batches : 0, &work);
  }''')
elif kind == "inline":
    s = s.replace(call, '''    static const int64_t min_parallel = std::getenv("WICORE_MIN_PARALLEL") ? std::atoll(std::getenv("WICORE_MIN_PARALLEL")) : 0;
    if (m * n * k < min_parallel) {
      for (int64_t i = 0; i < tasks; ++i) Run(&work, static_cast<size_t>(i));
      return;
    }
    ctx.ParallelFor(&Run, static_cast<size_t>(tasks), 0, &work);
  }''')
elif kind == "trace":
    s = s.replace('''  static void Run(void* data, size_t i) {
    const auto* w = static_cast<const Work*>(data);''', '''  struct Trace { std::atomic<int64_t> first_w{0}; std::atomic<int64_t> last_c{0}; std::atomic<int> nc{0}, nw{0}; std::thread::id caller; };
  static Trace& T() { static Trace t; return t; }
  static int64_t Now() { return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
  static void Run(void* data, size_t i) {
    const bool is_c = std::this_thread::get_id() == T().caller;
    if (!is_c) { int64_t z = 0; T().first_w.compare_exchange_strong(z, Now()); }
    const auto* w = static_cast<const Work*>(data);''')
    s = s.replace('''    wicore::MatMulQTask(*w->args, *w->packed, w->rows, begin, end, w->path, w->int8);
  }''', '''    wicore::MatMulQTask(*w->args, *w->packed, w->rows, begin, end, w->path, w->int8);
    if (is_c) { T().nc++; T().last_c = Now(); } else { T().nw++; }
  }''')
    s = s.replace(call, '''    T().caller = std::this_thread::get_id(); T().first_w = 0; T().nc = 0; T().nw = 0; const int64_t t0 = Now();
    ctx.ParallelFor(&Run, static_cast<size_t>(tasks), 0, &work);
    const int64_t t1 = Now();
    if (n > 10000 && std::getenv("WICORE_TRACE")) {
      static int64_t calls = 0, sum_nw = 0, sum_delay = 0, sum_wait = 0, sum_total = 0, no_w = 0;
      calls++; sum_nw += T().nw; sum_total += t1 - t0;
      if (T().first_w) sum_delay += T().first_w - t0; else no_w++;
      sum_wait += t1 - T().last_c;
      if (calls % 200 == 0) { fprintf(stderr, "calls %ld: worker tasks %.1f of %ld, worker start %.1f us (none in %ld), caller wait after its last %.1f us, total %.1f us\\n", calls, double(sum_nw)/200, tasks, double(sum_delay)/1e3/(200-no_w+1e-9), no_w, double(sum_wait)/1e3/200, double(sum_total)/1e3/200); sum_nw = sum_delay = sum_wait = sum_total = no_w = 0; }
    }
  }''')
    s = "#include <atomic>\n#include <chrono>\n#include <thread>\n#include <cstdio>\n" + s
else:
    sys.exit(f"unknown variant {kind}")
p.write_text(s)
sources = ["ops.cc", "ops_attention.cc", "ops_greedy.cc", "kernels_cpu.cc", "matmul_q_cpu.cc", "matmul_q_float.cc",
           "matmul_q_int8.cc", "matmul_q_packed.cc", "attention_cpu.cc", "attention_qkv_cpu.cc"]
subprocess.run(["c++", "-O2", "-fPIC", "-fvisibility=hidden", "-std=c++17", "-shared", f"-I{tree / 'include'}", f"-I{out / 'csrc'}",
                "-o", str(out / "lib.so"), *(str(out / "csrc" / f) for f in sources)], check=True)
print(out / "lib.so")
