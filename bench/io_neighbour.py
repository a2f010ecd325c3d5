"""A `dd` flood in one instance against a neighbour's reads on the same disk, with and without the I/O caps.

Two containers on the local Docker engine, made with the node agent's own I/O options
(``agent.diskio``): a neighbour that reads a file on its data volume with O_DIRECT (so the
page cache does not answer for the disk), and a flooder that writes to the same disk without pause.
The neighbour's read speed is measured alone, beside an uncapped flood, and beside a flood under the
agent's write cap (``--write-mbps``, what INSTANCE_IO_WRITE_MBPS gives a card). Target: beside the capped
flood the neighbour keeps at least half its speed alone (``slowdown_capped`` <= 2).

    python bench/io_neighbour.py [--quick] [--file-mb 512] [--rounds 5] [--write-mbps 50] [--flood direct|buffered]

``--flood buffered`` writes through the page cache: under cgroup v1 the kernel writes it back on no
container's account, so no cap holds it there (cgroup v2 charges writeback). One JSON line.
"""

import argparse
import json
import os
import secrets
import statistics
import time
import uuid

import _setup

IMAGE = os.environ.get("BENCH_IMAGE", "gpucloud/busybox-standin:latest")
READ = (
    "a=$(cut -d' ' -f1 /proc/uptime); dd if=/data/file of=/dev/null bs=1M iflag=direct 2>/dev/null;"
    " b=$(cut -d' ' -f1 /proc/uptime); echo $a $b"
)
FLOOD = {
    "direct": "while true; do dd if=/dev/zero of=/data/flood bs=1M count=512 oflag=direct 2>/dev/null; done",
    "buffered": "while true; do dd if=/dev/zero of=/data/flood bs=1M count=512 2>/dev/null; sync; done",
}


def django_setup(args) -> None:
    os.environ.update(
        SECRET_KEY=os.environ.get("SECRET_KEY") or secrets.token_urlsafe(40),
        DJANGO_SETTINGS_MODULE="config.settings",
        INSTANCE_IO_WRITE_MBPS=str(args.write_mbps),
        INSTANCE_IO_READ_MBPS="0",
    )
    import django

    django.setup()


def container(client, name: str, volume: str, command: str, io: dict):
    return client.containers.run(
        IMAGE, ["sh", "-c", command], name=name, detach=True, volumes={volume: {"bind": "/data", "mode": "rw"}},
        labels={"gpucloud.bench": "io_neighbour"}, network_mode="none", **io,
    )  # fmt: skip


def read_speed(neighbour, file_mb: int, rounds: int, errors: list) -> float | None:
    speeds = []
    for _ in range(rounds):
        result = neighbour.exec_run(["sh", "-c", READ])
        try:
            start, end = map(float, result.output.decode().split())
            speeds.append(file_mb / max(end - start, 0.01))
        except ValueError:
            errors.append(f"read: {result.output.decode()[:160]}")
    return round(statistics.median(speeds), 1) if speeds else None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a small file and three rounds (smoke test)")
    parser.add_argument("--file-mb", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write-mbps", type=int, default=50, help="the flooder's write cap per card")
    parser.add_argument("--flood", choices=sorted(FLOOD), default="direct")
    args = parser.parse_args()
    if args.quick:
        args.file_mb, args.rounds = 128, 3
    django_setup(args)
    from agent import diskio, images, launcher
    from portal.services.demo import STANDIN_IMAGE

    client, errors, tag = launcher.docker_client(), [], uuid.uuid4().hex[:8]
    if IMAGE == STANDIN_IMAGE:
        images.stand_in_ensure()  # the BusyBox stand-in, built here when missing
    disks = diskio.devices(launcher.docker_root())
    capped = diskio.io_options(0.5, disks)
    volumes = [f"bench-io-{tag}-{role}" for role in ("neighbour", "flooder")]
    made = []
    result = {}
    try:
        neighbour = container(client, f"bench-io-{tag}-n", volumes[0], "sleep 3600", {})
        made.append(neighbour)
        write = f"dd if=/dev/zero of=/data/file bs=1M count={args.file_mb} oflag=direct"
        fill = neighbour.exec_run(["sh", "-c", write])
        if fill.exit_code:
            errors.append(f"fill: {fill.output.decode()[:160]}")
        alone = read_speed(neighbour, args.file_mb, args.rounds, errors)
        beside = {}
        for label, io in (("unlimited", {}), ("capped", capped)):
            flooder = container(client, f"bench-io-{tag}-f-{label}", volumes[1], FLOOD[args.flood], io)
            made.append(flooder)
            time.sleep(2)  # the flood under way before the neighbour reads
            beside[label] = read_speed(neighbour, args.file_mb, args.rounds, errors)
            flooder.remove(force=True)
            made.remove(flooder)

        def slowdown(speed):
            return round(alone / speed, 2) if alone and speed else None

        result = {
            "disks": disks,
            "cgroup": "v2" if os.path.exists("/sys/fs/cgroup/cgroup.controllers") else "v1",
            "weight_supported": diskio.weight_supported(),
            "flood": args.flood,
            "write_cap_mb_s": args.write_mbps,
            "file_mb": args.file_mb,
            "alone_mb_s": alone,
            "beside_unlimited_mb_s": beside["unlimited"],
            "beside_capped_mb_s": beside["capped"],
            "slowdown_unlimited": slowdown(beside["unlimited"]),
            "slowdown_capped": slowdown(beside["capped"]),
        }
        result["target_met"] = result["slowdown_capped"] is not None and result["slowdown_capped"] <= 2
    except Exception as exc:  # a bench reports what failed, in its errors, and still prints its line
        errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
    finally:
        for c in made:
            c.remove(force=True)
        for name in volumes:
            try:
                client.volumes.get(name).remove(force=True)
            except Exception as exc:  # noqa: BLE001  (absent is fine; anything else is reported)
                if "No such volume" not in str(exc):
                    errors.append(f"volume {name}: {str(exc)[:120]}")
    print(json.dumps({**result, "errors": len(errors), "error_examples": errors[:3], "commit": _setup.commit()}))


if __name__ == "__main__":
    main()
