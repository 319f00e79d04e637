"""`mmrun analyse`: a LibCST linter for code that will not run on Ascend NPUs or MindSpore.

rules.yaml holds the rules (data), rules.py loads and indexes them, visitor.py walks one file,
positions.py finds line numbers, fixes.py rewrites, runner.py runs many files, report.py writes
text/JSON/CSV/SARIF, docgen.py renders the rule table for docs/analyse.md, cli.py is the command.
Nothing here imports torch or mindspore, and the analysed code is never imported.
"""
