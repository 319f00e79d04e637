"""Audio for the multimodal data path: decoding (reader.py, PyAV) and Whisper's log-mel features (features.py,
numpy only)."""
