"""The shared file storage (JuiceFS) as a host sees it: time to mount, MB/s through the mount, a new user's wait.

Two "hosts" are two ``juicefs mount`` processes of one fresh volume (each with
its own cache). Host 1 writes a file (fsync'd), host 2 reads it cold (its cache
empty: the bytes come from the data store), then again (its local cache).
A new user's first launch waits until this host's client enforces the quota
(at most one JuiceFS heartbeat); later launches only check it.

    python bench/sharedfs_io.py [--mb 256] [--store postgres|embedded]

``postgres``: metadata and data in PostgreSQL (BENCH_PG, default
postgres://postgres@127.0.0.1:5432; two databases created and dropped), as in
the several-host setup. ``embedded``: SQLite metadata and local files, as
``make run``. One JSON line per store: {"store", "mb", "mount_s", "write_mb_s",
"read_cold_mb_s", "read_cached_mb_s", "new_user_wait_s", "ready_check_ms"}.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import _setup

PG = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")


def _psql(sql: str) -> None:
    subprocess.run(["psql", f"{PG}/postgres", "-qc", sql], check=True)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _write(path: Path, mb: int) -> None:
    block = os.urandom(1024 * 1024)
    with open(path, "wb") as f:
        for _ in range(mb):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())


def _read(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(4 * 1024 * 1024):
            pass


def run(store: str, mb: int) -> dict:
    from django.test import override_settings

    from agent import sharedfs as host_fs
    from scheduler import sharedfs

    tag = uuid.uuid4().hex[:8]
    base = Path(tempfile.mkdtemp(prefix="gs-bench-"))
    if store == "postgres":
        dbs = [f"gs_bench_{tag}_meta", f"gs_bench_{tag}_data"]
        for name in dbs:
            _psql(f"CREATE DATABASE {name}")
        server = PG.split("://", 1)[1].split("@", 1)[-1]
        values = dict(
            SHARED_FS_META=f"{PG}/{dbs[0]}?sslmode=disable",
            SHARED_FS_STORAGE="postgres",
            SHARED_FS_BUCKET=f"{server}/{dbs[1]}?sslmode=disable",
        )
        os.environ["SHARED_FS_ACCESS_KEY"] = PG.split("://", 1)[1].split("@", 1)[0].split(":")[0]
    else:
        dbs = []
        values = dict(
            SHARED_FS_META=f"sqlite3://{base}/meta.db", SHARED_FS_STORAGE="file", SHARED_FS_BUCKET=f"{base}/data/"
        )
    values.update(SHARED_FS_NAME=f"bench-{tag}", SHARED_FS_CACHE_MB=4096)

    def host(n: int) -> dict:
        where = base / f"host{n}"
        return {"SHARED_FS_MOUNT": str(where / "mnt"), "SHARED_FS_CACHE_DIR": str(where / "cache")}

    result = {"store": store, "mb": mb}
    try:
        with override_settings(**values):
            sharedfs.volume_format()
            with override_settings(**host(1)):
                result["mount_s"] = round(_timed(host_fs.mount_ensure), 2)
                result["new_user_wait_s"] = round(_timed(lambda: host_fs.user_dir_ready(1)), 2)
                start = time.perf_counter()
                for _ in range(100):
                    host_fs.user_dir_ready(1)
                result["ready_check_ms"] = round((time.perf_counter() - start) * 10, 2)
                target = Path(host_fs.user_dir_on_host(1)) / "big.bin"
                result["write_mb_s"] = round(mb / _timed(lambda: _write(target, mb)), 1)
            with override_settings(**host(2)):
                host_fs.mount_ensure()
                seen = Path(host_fs.user_dir_on_host(1)) / "big.bin"
                result["read_cold_mb_s"] = round(mb / _timed(lambda: _read(seen)), 1)
                result["read_cached_mb_s"] = round(mb / _timed(lambda: _read(seen)), 1)
    finally:
        with override_settings(**values):
            for n in (1, 2):
                for pid in host_fs.unmount(host(n)["SHARED_FS_MOUNT"]):
                    os.kill(pid, signal.SIGKILL)  # a client that did not end (ours)
        for name in dbs:
            _psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        shutil.rmtree(base, ignore_errors=True)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--store", choices=["postgres", "embedded"], action="append")
    args = _setup.parse(parser, mb=16)
    os.environ.setdefault("SECRET_KEY", "bench-only-0123456789abcdef0123456789abcdef")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    results = []
    for store in args.store or ["postgres", "embedded"]:
        results.append(run(store, args.mb))
        print(json.dumps(results[-1]), flush=True)
    _setup.report({"stores": results}, errors=0)


if __name__ == "__main__":
    main()
