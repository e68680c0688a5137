"""mmsp's Python side: tools that run beside the C++ library (no C++ extension here).

`mmsp.prepare` turns conversation data into mmsp's `.jsonl` training format with a model
directory's own processor (docs/prepare.md).
"""
