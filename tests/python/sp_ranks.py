"""Runs a function on N real processes joined by torch.distributed (Gloo), as torchrun would.

Each process is spawned fresh (torch.multiprocessing), initialises the default group from a
file store, runs `fn(rank, world, *args)` and tears down; an exception in any rank fails the
call with that rank's traceback. Used by the tests of `import mmsp` (test_torch_api.py).
"""
import os
import sys
from datetime import timedelta

import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank, world, store, package_path, fn, args):
    sys.path.insert(0, package_path)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    try:
        fn(rank, world, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run(world, fn, *args, tmp_path):
    store = os.path.join(str(tmp_path), f"store-{world}-{fn.__name__}")
    package_path = os.environ["MMSP_PACKAGE_PATH"]
    mp.start_processes(_entry, args=(world, store, package_path, fn, args), nprocs=world, join=True,
                       start_method="spawn")
