"""mmrun.data.video: video generation data in numpy only (Wan2.1, MindSpeed-MM's sora datasets).

- `feature_files`: the per-sample feature files that feature extraction writes and training reads
  (MindSpeed-MM's `.pt`, mmrun's `.safetensors`) and their `data.jsonl` index
"""
