"""One member of bench/gang_allreduce.py's job, started by torchrun (one process per member): all-reduces
``MB`` MB of float32 ``ITERS`` times over gloo after two warm-ups, then sends the same bytes over one plain TCP
connection from rank 1 to rank 0 (the members' own path, no collective), and prints from rank 0 one line
``RESULT {json}``: the seconds of each all-reduce and of each raw send."""

import json
import os
import socket
import time

import torch
import torch.distributed as dist

MB, ITERS = int(os.environ["MB"]), int(os.environ["ITERS"])
RAW_PORT = int(os.environ["MASTER_PORT"]) + 1


def raw(rank: int, payload: bytes) -> list[float]:
    """Seconds for ``payload`` from rank 1 to rank 0 (until rank 0 acknowledges it whole), ITERS times."""
    times = []
    if rank == 0:
        with socket.create_server((os.environ["MASTER_ADDR"], RAW_PORT)) as server:
            dist.barrier()
            conn, _ = server.accept()
            with conn:
                for _ in range(ITERS):
                    left = len(payload)
                    while left:
                        left -= len(conn.recv(min(left, 1 << 20)))
                    conn.sendall(b"k")
    else:
        dist.barrier()
        with socket.create_connection((os.environ["MASTER_ADDR"], RAW_PORT)) as conn:
            for _ in range(ITERS):
                began = time.perf_counter()
                conn.sendall(payload)
                assert conn.recv(1) == b"k"
                times.append(time.perf_counter() - began)
    return times


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.ones(MB * 2**20 // 4)
    for _ in range(2):
        dist.all_reduce(tensor)
    seconds = []
    for _ in range(ITERS):
        dist.barrier()
        began = time.perf_counter()
        dist.all_reduce(tensor)
        seconds.append(time.perf_counter() - began)
    assert tensor[0].item() == world ** (ITERS + 2), tensor[0].item()  # every rank's ones, summed each time
    sent = raw(rank, b"\0" * (MB * 2**20))
    box = [sent]
    dist.broadcast_object_list(box, src=1)
    if rank == 0:
        print("RESULT " + json.dumps({"world": world, "allreduce_s": seconds, "raw_s": box[0]}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
