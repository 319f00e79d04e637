"""Package list only; all metadata lives in pyproject.toml.

The repository root is the `mmrun` package and its top-level folders are its subpackages
(backend/ -> mmrun.backend, ...). setuptools' `packages.find` cannot add that prefix, so the list is
computed here and stays right when a folder is added.
"""
from setuptools import find_packages, setup

TOP_LEVEL = ("backend", "common", "launchers", "analyse", "models", "training", "data")

setup(
    packages=["mmrun"]
    + [f"mmrun.{name}" for name in find_packages(include=[f"{top}*" for top in TOP_LEVEL])],
)
