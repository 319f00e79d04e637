"""mmrun.data: Megatron's data pipeline in numpy only (no framework import).

- `tokenizers`: GPT2BPETokenizer / NullTokenizer / HuggingFaceTokenizer from local files
- `indexed_dataset`: Megatron's `.bin`/`.idx` format, reader and writer
- `preprocess`: `mmrun preprocess-data` (Megatron's tools/preprocess_data.py)
- `gpt_dataset`: GPT samples, --split, --mock-data, in megatron-core's order
- `samplers`: per data-parallel-rank micro-batches (MegatronPretrainingSampler) and collate
- `corpus`: the demo corpus and its BPE files
"""
