"""Wan2.1 text-to-video and image-to-video models on mmrun's portable API (PyTorch and MindSpore)."""
