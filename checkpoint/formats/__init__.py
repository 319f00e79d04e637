"""Checkpoint file formats for every model family, numpy only: no framework, no pickle, no model knowledge."""
