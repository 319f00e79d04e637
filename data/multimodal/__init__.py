"""Multimodal (Qwen2-VL / Qwen2.5-VL) fine-tuning data as MindSpeed-MM prepares it, in numpy + Pillow.

`data.json` (MindSpeed-MM's `dataset_param`) -> `MultimodalDataset` -> `collate` -> a batch of numpy arrays
that both frameworks turn into tensors unchanged. Modules: `image_processing` (pixels), `templates` (chat
template, labels, truncation), `rope_index` (M-RoPE positions), `data_config` (data.json validation),
`mllm_dataset` (samples), `collate` (batches; worker processes: data/workers.py), `llava` (LLaVA-Instruct
conversion), `demo` (an offline demo dataset).
"""
