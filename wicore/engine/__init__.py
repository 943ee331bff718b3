"""The engine: requests in, token streams out.

`core.EngineCore` owns the model's graphs, the KV cache and the scheduler and is stepped by one
thread (`step()`: schedule -> KV moves -> run -> update); `engine.Engine` fronts it with a queue
and per-request output channels for threads and event loops. Scheduling (`scheduler`,
`scheduler_config`), requests (`request`), speculative decoding (`speculative`, `proposers`)
and the engine's settings (`config`) and stats (`stats`) live here too. docs/DESIGN.md draws it.
"""
