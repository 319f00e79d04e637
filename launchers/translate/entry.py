"""The public entry: `translate_script`, above the rule-based rewrite (rewrite.py) and the exact way back (marker.py)."""
from __future__ import annotations

from mmrun.launchers.translate.marker import translate_with_marker
from mmrun.launchers.translate.rewrite import Options, Result


def translate_script(source: bytes, options: Options | None = None, path: str = "<script>") -> Result:
    """Translate a launch script; raises ScriptSyntaxError or TranslationRefused. Never runs the script."""
    return translate_with_marker(source, options or Options(), path)
