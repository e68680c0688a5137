"""Runs a function on N real processes joined by torch.distributed (Gloo), as torchrun would.

Each process is spawned fresh (torch.multiprocessing), initialises the default group from a
file store, runs `fn(rank, world, *args)` and tears down; an exception in any rank fails the
call with that rank's traceback. Used by the tests of `import mmsp` (test_torch_api.py).

Each rank gets its share of the host's cores as torch's intra-op threads (torchrun sets
OMP_NUM_THREADS=1 for several processes a host; mmsp-run gives each rank cores / ranks):
4 ranks of 2 threads each on 2 cores spent most of their time in OpenMP's spinning.
"""
import os
import sys
from datetime import timedelta

import torch.distributed as dist
import torch.multiprocessing as mp


def _share_cores(world):
    """torch's intra-op threads: this rank's share of the cores it may run on."""
    import torch

    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // world))


def _entry(rank, world, store, package_path, fn, args):
    sys.path.insert(0, package_path)
    _share_cores(world)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    try:
        fn(rank, world, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _start_method():
    """forkserver with torch and transformers imported once: each rank is forked from it
    instead of importing them anew (8 s of CPU a rank on the 2-core machine)."""
    import multiprocessing

    multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "transformers", "sp_checks", "rl_checks",
                                            "reliability_checks"])
    return "forkserver"


def run(world, fn, *args, tmp_path):
    store = os.path.join(str(tmp_path), f"store-{world}-{fn.__name__}")
    package_path = os.environ["MMSP_PACKAGE_PATH"]
    mp.start_processes(_entry, args=(world, store, package_path, fn, args), nprocs=world, join=True,
                       start_method=_start_method())


def _bounded_entry(rank, world, store, package_path, fn, args, default_timeout_s):
    sys.path.insert(0, package_path)
    _share_cores(world)
    # store: a file (a FileStore every rank opens), or tcp://host:port (rank 0 hosts the TCPStore,
    # as under mmsp-run or a launcher without an agent: its exit takes the store with it)
    dist.init_process_group("gloo", init_method=store if store.startswith("tcp://") else f"file://{store}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=default_timeout_s))
    fn(rank, world, *args)
    # No barrier and no teardown: a check may leave a peer stopped or the groups broken.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_bounded(world, fn, *args, tmp_path, deadline_s, default_timeout_s=600, store="file"):
    """Like run, for checks of failures: the default group's timeout is long (600 s, torch's
    own is 30 min), and every rank must have returned from `fn` within `deadline_s` of the
    start, else the ranks are killed and the call fails naming the ranks still running (a hang
    is what these checks look for). A rank may end another (SIGKILL) once its check is done; a
    rank that raised fails the call with its traceback. store="tcp": rank 0 hosts the default
    group's store (a TCPStore), else a file holds it."""
    import signal
    import time

    store = (f"tcp://127.0.0.1:{_free_port()}" if store == "tcp" else
             os.path.join(str(tmp_path), f"store-{world}-{fn.__name__}"))
    package_path = os.environ["MMSP_PACKAGE_PATH"]
    context = mp.start_processes(_bounded_entry, args=(world, store, package_path, fn, args, default_timeout_s),
                                 nprocs=world, join=False, start_method=_start_method())
    end = time.monotonic() + deadline_s
    try:
        while time.monotonic() < end:
            if all(not p.is_alive() for p in context.processes):
                break
            time.sleep(0.1)
        running = [r for r, p in enumerate(context.processes) if p.is_alive()]
        codes = {r: p.exitcode for r, p in enumerate(context.processes)}
    finally:
        for p in context.processes:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
            p.join()
    failed = {r: c for r, c in codes.items() if c not in (0, -signal.SIGKILL, None)}
    if failed:
        errors = [context.error_files[r] for r in failed]
        texts = []
        for r, path in zip(failed, errors):
            try:
                with open(path, "rb") as f:
                    import pickle

                    texts.append(f"rank {r}:\n{pickle.load(f)}")
            except (OSError, EOFError):
                texts.append(f"rank {r}: exit code {failed[r]}")
        raise AssertionError("\n".join(texts))
    assert not running, f"ranks {running} were still running {deadline_s} s after the start (a hang)"
