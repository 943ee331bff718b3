"""Execution of exported graphs with ONNX Runtime: sessions, sampling, generation."""
