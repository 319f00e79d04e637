"""mmrun.checkpoint: the room for checkpoint files and their conversion, apart from the models (as MindSpeed-MM
keeps checkpoint/ apart from its models).

- `formats/`: the file formats every family reads and writes, knowing no model and no trainer: safetensors and
  bf16 in numpy (`formats.safetensors`), Hugging Face / diffusers directories (`formats.hf_directory`). The floor
  of data/: models/ reads its weights through it.
- the converters, on the entries' floor (they use the trainer's checkpoint store, training/checkpoint_*.py):
  `convert_cli` (`mmrun convert`, mm-convert's command lines), `vlm` (the Qwen-VL families: Hugging Face <->
  per-(TP, PP)-rank checkpoints in MindSpeed-MM's names), `wan` (Wan2.1: diffusers <-> MindSpeed-MM layout),
  `peft` (LoRA adapters <-> PEFT's names), `gpt` (mmrun's GPT <-> megatron-core layouts, resharding), `dcp`
  (torch.distributed.checkpoint export).
A family's own name table stays in its folder (models/<family>/); the converters find it through the family
registry (models/families.py).
"""
