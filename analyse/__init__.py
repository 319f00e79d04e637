"""`mmrun analyse`: a LibCST linter for code that will not run on Ascend NPUs or MindSpore.

rules.yaml holds the rules (data), rules.py loads and indexes them, visitor.py walks one file,
positions.py finds line numbers, fixes.py rewrites, runner.py analyses one file, sources.py finds
and reads the files, limits.py and nesting.py bound what one file may cost, workers.py runs many
files in worker processes that a crash cannot take down, report.py writes text/JSON/CSV/SARIF,
docgen.py renders the tables of docs/analyse.md, cli.py is the command (also `python -m mmrun.analyse`).
Nothing here imports torch or mindspore, and the analysed code is never imported.
"""
