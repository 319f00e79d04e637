"""What the Qwen vision-language families share (Qwen2-VL / Qwen2.5-VL, Qwen3-VL, next Qwen2.5-Omni): the ViT's
blocks and sizes, the vision token layout, generation, model.json's common reader, MindSpeed-MM's Megatron
names and their split over tensor/pipeline ranks, the Hugging Face directory reader and writer. A family's own
part (its recipes, names, configuration, decoding) is found through the family table (models/families.py), so
no family imports another.
"""
