from mmrun.data.corpus import DEMO_MERGES, DEMO_VOCAB
from mmrun.data.gpt_dataset import build_train_valid_test_datasets, train_valid_test_num_samples
from mmrun.data.samplers import build_pretraining_data_loader
from mmrun.data.tokenizers import build_tokenizer

tok = build_tokenizer("GPT2BPETokenizer", vocab_file=str(DEMO_VOCAB), merge_file=str(DEMO_MERGES))
# 20 iterations of global batch 8, validation every 10 iterations for 2 iterations
num_samples = train_valid_test_num_samples(train_iters=20, global_batch_size=8, eval_interval=10, eval_iters=2)
train, valid, test = build_train_valid_test_datasets(
    "out/demo_text_document", split="949,50,1", seq_length=128, seed=1234,
    num_samples=num_samples, tokenizer=tok)
print("samples needed", num_samples, "built", (len(train), len(valid), len(test)))
# data-parallel rank 1 of 2, micro batch 2, resuming after 3 global batches (24 samples)
loader = build_pretraining_data_loader(train, consumed_samples=24, micro_batch_size=2,
                                       data_parallel_rank=1, data_parallel_size=2)
batch = next(iter(loader))
print({k: (v.shape, str(v.dtype)) for k, v in batch.items()})
print(repr(tok.detokenize(batch["tokens"][0][:40].tolist())))
