"""Print, as JSON, the parameter names and shapes of megatron-core's GPTModel (local spec, one process) for the
sizes given on the command line: what models/mcore_layout.py must reproduce."""
from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

sizes = json.loads(sys.argv[1])
torch.cuda.current_device = lambda: "cpu"  # megatron-core asks CUDA for a device even with CPU initialisation
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
dist.init_process_group("gloo", rank=0, world_size=1)
from megatron.core import parallel_state  # noqa: E402
from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

parallel_state.initialize_model_parallel(1, 1)
config = TransformerConfig(num_layers=sizes["num_layers"], hidden_size=sizes["hidden_size"],
                           num_attention_heads=sizes["num_attention_heads"], ffn_hidden_size=sizes["ffn_hidden_size"],
                           use_cpu_initialization=True)
model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=sizes["vocab_size"],
                 max_sequence_length=sizes["max_position_embeddings"], position_embedding_type="learned_absolute",
                 share_embeddings_and_output_weights=not sizes["untie_embeddings_and_output_weights"])
print(json.dumps({name: list(param.shape) for name, param in model.state_dict().items() if param is not None}))
dist.destroy_process_group()
