"""Running exported graphs with ONNX Runtime: placement, KV buffers, the model runner, the
scheduler and the engine that drives them (wicore.runtime.engine)."""
