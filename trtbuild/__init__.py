"""trtbuild: TensorRT engines under a per-layer precision policy, proven against FP32."""

__version__ = "0.1.0"
