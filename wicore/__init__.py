"""WiCore: compile a model once into ONNX graphs, serve it through ONNX Runtime anywhere."""

__version__ = "0.1.0"
