import argparse, os
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, required=True)
args = parser.parse_args()
print(f"rank {os.environ['RANK']}: {args.epochs} epochs on {os.environ['MMRUN_AI_FRAMEWORK']}")
