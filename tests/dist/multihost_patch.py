"""One rank of mmsp.patch across two hosts, started by torch.distributed.run (torchrun) on
each host with c10d rendezvous (tests/dist/multihost.sh, case python): Qwen2-VL patched on
ring 2 x ulysses 2 equals the unpatched model on one process, the loss and every gradient
(fp64); the check is tests/python/sp_checks.py's, run here over ranks on two hosts."""
import os
import sys
import traceback

import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.environ["MMSP_PACKAGE_PATH"])
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

import sp_checks  # noqa: E402

dist.init_process_group("gloo")  # torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR, ...
rank, world = dist.get_rank(), dist.get_world_size()
try:
    sp_checks.patch_equals_one_process(rank, world, ["qwen2_vl"], ring=2, ulysses=2, placement="zigzag")
    dist.barrier()
    print(f"rank {rank} of {world}: mmsp.patch equals one process", flush=True)
except BaseException:
    traceback.print_exc()
    code = 1
else:
    code = 0
# No teardown: destroy_process_group raced the peers' own exits once in ten runs (a rank
# SIGABRT in Gloo after the check had passed everywhere); the barrier above already joined
# every rank, and the process's end closes the connections.
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
