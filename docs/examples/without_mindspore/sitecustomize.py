# Put on PYTHONPATH by docs examples (docs/examples/*.yaml): mindspore cannot be imported, as in a venv without it.
import importlib.machinery
import sys


class _WithoutMindSpore(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.split(".")[0] == "mindspore":
            return None  # what a machine without mindspore answers
        return importlib.machinery.PathFinder.find_spec(name, path, target)


sys.meta_path = [_WithoutMindSpore if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
