#!/usr/bin/env python3
"""bench/torch_comm.py - torch.distributed's gloo allreduce, the PyTorch side
of bench/comm.sh: same sizes, iteration counts and median as comm_bench.c.
Run one process per rank with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set
(bench/comm.sh does)."""
import os, sys, time
import torch
import torch.distributed as dist

def main():
    mx = int(sys.argv[1]) if len(sys.argv) > 1 else 256 << 20
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    buf = torch.zeros(mx // 4, dtype=torch.float32)
    if rank == 0:
        print(f"# torch.distributed gloo {torch.__version__}, {world} ranks")
        print(f"# {'bytes':>10} {'time_us':>12} {'busbw_GBps':>12}")
    b = 4096
    while b <= mx:
        iters = 200 if b <= 1 << 20 else 20 if b <= 16 << 20 else 5
        t = buf[: b // 4]
        for _ in range(3):
            dist.all_reduce(t)
        ts = []
        for _ in range(iters):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            ts.append(time.perf_counter() - t0)
        ts.sort()
        med = ts[iters // 2]
        if rank == 0:
            print(f"  {b:>10} {med * 1e6:>12.1f} {b / med * 2 * (world - 1) / world / 1e9:>12.3f}", flush=True)
        b *= 4
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
