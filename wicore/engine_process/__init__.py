"""The engine in a process of its own (`wicore serve --engine-process on`), as vLLM V1 runs its
EngineCore apart from the API server: the HTTP process keeps the event loop, tokenizer and
detokenizing, and never waits for the GIL behind the engine's Python host work.

    API process                                       engine process (spawned)
    ───────────                                       ────────────────────────
    EngineClient (wicore.api.serving.ServingEngine)   child.serve_core: the EngineCore's loop
      add_request: check, queue ─► [Add, Abort, ...] ─► receiver thread: make_request ─► inbox
      outputs(id) ◄── Channel ◄── one Step a step  ◄── core.step(); sender thread
      stats_json() ◄── the last stats a Step carried (every 0.1 s, and when a request ends or arrives)

One socket pair, length-prefixed pickles (wicore.engine_process.frames).
"""
