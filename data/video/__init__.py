"""Video data: decoding, MindSpeed-MM's preprocessing, feature files (numpy + Pillow; decoders lazily)."""
