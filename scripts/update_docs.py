#!/usr/bin/env python
"""Regenerate what the docs show: tables from the code's data, generated pages, files shown whole, and
every example's output, by running its commands for real (docs/examples/*.yaml).

Measured figures (benchmark tables) are not regenerated here: each page names the benchmark command and
the machine that produced them. tests/docs/test_docs_drift.py fails when a page differs from this output.
"""
from __future__ import annotations

import argparse
import difflib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import docs_examples  # noqa: E402  (the sibling modules, found through the line above)
import docs_pages  # noqa: E402
from mmrun.common.atomic_write import atomic_write  # noqa: E402
from mmrun.common.yaml_tables import TableError  # noqa: E402

REPO = docs_pages.REPO
EPILOG = """examples:
  python scripts/update_docs.py                        every page: tables, files, all examples
  python scripts/update_docs.py --skip-slow            leave examples that start torchrun/msrun or train
  python scripts/update_docs.py --only launcher        one page (docs/launcher.md)
  python scripts/update_docs.py --only launcher:dry-run --only translate
  python scripts/update_docs.py --check                write nothing; exit 1 naming what drifted
  python scripts/update_docs.py --list                 the examples, their pages and whether slow
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python scripts/update_docs.py", description=__doc__,
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", default=[], metavar="PAGE[:EXAMPLE]",
                        help="only these pages (file stem: launcher, README) or examples; repeatable")
    parser.add_argument("--skip-slow", "--skip_slow", action="store_true",
                        help="leave the examples marked slow as the pages have them")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page would change")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="examples run at once (default 1; their output does not depend on it)")
    parser.add_argument("--list", action="store_true", help="list the examples and exit")
    return parser


def _selected(key: str, only: list[str]) -> bool:
    page = key.split(":", 1)[0]
    return not only or key in only or page in only


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: expected a whole number of at least 1")
    try:
        examples = docs_examples.load_examples()
    except TableError as err:
        print(f"update_docs: error: {err}", file=sys.stderr)
        return 2
    if args.list:
        for example in examples:
            print(f"{example.key:40} {example.page:22} {'slow' if example.slow else ''}")
        return 0
    known = {e.key for e in examples} | {Path(p).stem for p in docs_pages.pages()}
    unknown = [o for o in args.only if o not in known]
    if unknown:
        parser.error(f"--only {unknown[0]}: no such page or example (see --list)")

    chosen = [e for e in examples if _selected(e.key, args.only) and not (args.skip_slow and e.slow)]
    start = time.monotonic()
    blocks = docs_examples.produce_all(
        chosen, jobs=args.jobs,
        progress=lambda line: print(f"[{time.monotonic() - start:6.1f}s] {line}", file=sys.stderr, flush=True))
    failed = [err for err in blocks.values() if isinstance(err, docs_examples.ExampleError)]
    for err in failed:
        print(f"update_docs: error: {err}", file=sys.stderr)

    changed = []
    for page in docs_pages.pages():
        if args.only and Path(page).stem not in {o.split(":", 1)[0] for o in args.only}:
            continue
        path = REPO / page
        old = path.read_text(encoding="utf-8")
        bodies = {e.name: blocks[e.key] for e in chosen if e.page == page and isinstance(blocks[e.key], str)}
        static = docs_pages.regenerate_static(page, old)
        marked = docs_pages.example_blocks(static)
        declared = {e.name for e in examples if e.page == page}
        for name in sorted(declared - set(marked)):
            print(f"update_docs: error: {page} has no marker <!-- example: {name} --> for the example "
                  f"declared in docs/examples/", file=sys.stderr)
        for name in sorted(set(marked) - declared):
            print(f"update_docs: error: {page} marks <!-- example: {name} -->, which no file in docs/examples/ "
                  f"declares", file=sys.stderr)
        if declared != set(marked):
            return 1
        new = docs_pages.splice_examples(static, bodies)
        if new == old:
            continue
        changed.append(page)
        if args.check:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                       f"{page} (now)", f"{page} (regenerated)"))
        else:
            atomic_write(path, new)
            print(f"updated {page}", file=sys.stderr)
    if args.check and changed:
        print(f"update_docs: {len(changed)} page(s) drifted: {', '.join(changed)}; "
              f"run python scripts/update_docs.py", file=sys.stderr)
    return 1 if failed or (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
