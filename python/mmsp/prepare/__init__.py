"""`mmsp prepare`: conversation data (LLaVA JSON, OpenAI/ShareGPT messages, plain text) into
mmsp's `.jsonl` training format (docs/data.md), with the model directory's own processor:
its tokenizer, chat template and image processor. Offline: nothing is fetched from a hub.

Run it as `python -m mmsp.prepare --model DIR --input FILE` (docs/prepare.md).
"""
import os

# Before transformers or huggingface_hub are imported anywhere: they read it at import time.
os.environ["HF_HUB_OFFLINE"] = "1"
