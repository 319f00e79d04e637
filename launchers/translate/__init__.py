"""`mmrun translate`: rewrite a torchrun launch script into an msrun one (and back), editing only the bytes that must change.

    from mmrun.launchers.translate import Options, translate_script
    result = translate_script(open("pretrain.sh", "rb").read(), Options(target="msrun", device="cpu"), "pretrain.sh")
    print(result.output.decode(), result.report.text())

The script is parsed with tree-sitter-bash and never executed or sourced.
"""
from __future__ import annotations

from mmrun.launchers.translate.entry import translate_script
from mmrun.launchers.translate.rewrite import Options, Result, TranslationRefused

__all__ = ["Options", "Result", "TranslationRefused", "translate_script"]
