"""Precision debugging and performance tools, framework-free: `mmrun compare` of training logs and of
layer-wise dumps, the dump files' layout (msprobe's), anomaly rules.

What touches tensors lives in mmrun.backend.<framework>.probe (the hooks); this package only sees numbers.
"""
