"""Framework-free parts of VLM evaluation (MindSpeed-MM's evaluate_vlm.py, VLMEvalKit's metrics): reading
VLMEvalKit's TSV files (tsv), the per-dataset prompts (prompts), answer extraction and scores (metrics)."""
