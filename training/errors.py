"""The training loop's own error (framework-free)."""


class TrainingError(RuntimeError):
    """The callbacks or the data do not fit the loop (one line, says what to change); exit 1."""
