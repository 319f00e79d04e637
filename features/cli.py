"""`mmrun features`: print the feature table (one layer or both), or check a flag list against it.

What this prints is what the training gate and `mmrun translate` enforce. No framework is imported.
"""
from __future__ import annotations

import argparse
import sys

from mmrun.backend.vocabulary import DEVICES, FRAMEWORKS
from mmrun.features import render
from mmrun.features.entries import entry_features, layers_for_scripts
from mmrun.features.gate import POLICIES
from mmrun.features.loader import FeatureTableError, load_tables
from mmrun.features.table import LAYERS, STACK, TRAINER

EXAMPLES = """\
examples:
  mmrun features                                        # both layers: the framework stack and mmrun's trainer
  mmrun features --layer stack                          # what the stacks (MindSpeed, MSAdapter, ...) support
  mmrun features --ai-framework mindspore --device npu  # one column, with reasons, hints and sources
  mmrun features --format json                          # for tools
  mmrun features --ai-framework mindspore --device npu --check "--tensor-model-parallel-size 2 --log-tps"
                                                        # what the stack says about a script's flags (exit 2 if it stops)
  mmrun features --ai-framework mindspore --device cpu --entry models/pretrain_gpt.py --check "--bf16"
                                                        # the same for mmrun's trainer: both layers judge
"""

LAYER_CHOICES = {"stack": (STACK,), "trainer": (TRAINER,), "both": LAYERS}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmrun features",
        description="Print which Megatron/MindSpeed training flags work on each framework and device, in two layers: "
                    "the framework stack (features/stack.yaml, with sources) and mmrun's own trainer "
                    "(features/trainer.yaml); or check a flag list against them.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--ai-framework", "--ai_framework", dest="framework", choices=FRAMEWORKS, default=None,
                        help="only this framework")
    parser.add_argument("--device", choices=DEVICES, default=None, help="only this device")
    parser.add_argument("--layer", choices=sorted(LAYER_CHOICES), default=None,
                        help="which layer to print or check: stack, trainer or both (default: both for the table; "
                             "for --check, the stack, plus the trainer when --entry is mmrun's trainer)")
    parser.add_argument("--format", choices=("table", "json", "markdown"), default="table", help="output format (default: table)")
    parser.add_argument("--check", metavar="ARGS", default=None,
                        help="training arguments as one string; print what the table says about them "
                             "(needs --ai-framework and --device; exit 2 if the job would stop)")
    parser.add_argument("--entry", metavar="SCRIPT", default=None,
                        help="with --check: the training script the arguments go to (mmrun's entries, "
                             "models/pretrain_{gpt,vlm,sora,transformers}.py, add the trainer layer, less what the "
                             "entry implements itself, such as pretrain_vlm.py's LoRA; default: the user's own script)")
    parser.add_argument("--on-unsupported", "--on_unsupported", dest="on_unsupported", choices=POLICIES,
                        default="error", help="policy for --check (default: error)")
    return parser


def _usage(message: str) -> int:
    print(f"mmrun features: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # The value of --check is itself a flag list ("--bf16"); argparse would take it for an option.
    for i, token in enumerate(argv[:-1]):
        if token == "--check":
            argv[i:i + 2] = [f"--check={argv[i + 1]}"]
            break
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on a usage error, 0 for --help
        return int(exc.code or 0)
    if args.entry is not None and args.check is None:
        return _usage(f"--entry only goes with --check. Received: --entry {args.entry}; add --check \"ARGS\"")
    try:
        if args.check is not None:
            if not (args.framework and args.device):
                return _usage(f"--check needs --ai-framework and --device. Received: "
                              f"--ai-framework {args.framework}, --device {args.device}")
            layers = LAYER_CHOICES[args.layer] if args.layer else layers_for_scripts([args.entry or ""])
            try:
                lines, stops = render.check_lines(args.check, args.framework, args.device, args.on_unsupported, layers,
                                                  entry_features=entry_features([args.entry or ""]))
            except ValueError as err:  # shlex: unbalanced quotes
                return _usage(f"--check could not split {args.check!r}: {err}; quote the argument list as a shell would")
            print("\n".join(lines))
            return 2 if stops else 0
        load_tables()  # a broken table is reported here, once, not half-way through the output
        layers = LAYER_CHOICES[args.layer or "both"]
        renderer = {"table": render.render_table, "json": render.render_json, "markdown": render.render_markdown}[args.format]
        text = renderer(args.framework, args.device, layers)
    except FeatureTableError as err:
        print(f"mmrun features: {err}", file=sys.stderr)
        return 1
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
