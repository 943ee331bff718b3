"""Running one step's rows: batches built from scheduled rows (`batch`), the ONNX Runtime
sessions bound to the KV buffers (`graphs`, `graph_io`, `cuda_graphs`), the vision encoder
(`vision`), and token selection on the host (`sampler`). `runner.ModelRunner.execute(rows)` is
the engine's run phase."""
