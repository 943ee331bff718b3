"""ONNX construction: the Gemma 3 decoder builder, partitioning, the manifest."""
