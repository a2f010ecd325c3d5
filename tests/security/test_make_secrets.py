"""config/prod/make_secrets.sh: the production stack's secrets, a file each, made once and kept.

Run for real (as root, as on a deployment): owners and modes, values kept across runs, a host added later, the
PostgreSQL list of host roles rewritten in place (the file the postgres container has mounted), and a GPU server's
folder refused until its passwords are copied from the control plane's.
"""

import os
import stat
import subprocess
from pathlib import Path

import pytest
from django.conf import settings

SCRIPT = Path(settings.BASE_DIR) / "config" / "prod" / "make_secrets.sh"
APP_FILES = ("secret_key", "postgres_password", "db_web_password", "redis_password", "registry_password")


def make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


@pytest.fixture(autouse=True)
def as_root():
    if os.geteuid() != 0:
        pytest.fail("make_secrets.sh sets owners: run the suite as root (make test does on this machine)")


def test_the_control_planes_secrets_are_random_private_files_kept_across_runs(tmp_path):
    folder = tmp_path / "secrets"
    done = make("control", str(folder), "gpu1")
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    values = {}
    for name in APP_FILES:
        path = folder / name
        info = path.stat()
        # The control plane's processes run as uid 10001 and read these; nobody else may.
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (10001, 0o400), name
        values[name] = path.read_text().strip()
        assert len(values[name]) >= 48 and values[name].isalnum()
    assert len(set(values.values())) == len(values)  # each its own
    host = {name: (folder / "hosts" / "gpu1" / name) for name in ("database_password", "redis_password")}
    assert all(path.stat().st_uid == 0 and stat.S_IMODE(path.stat().st_mode) == 0o400 for path in host.values())
    roles = folder / "db_node_roles"
    assert roles.read_text() == f"gpu1={host['database_password'].read_text().strip()}\n"
    inode = roles.stat().st_ino

    again = make("control", str(folder), "gpu2")  # a host added later: only its passwords are new
    assert again.returncode == 0, again.stderr
    assert {name: (folder / name).read_text().strip() for name in APP_FILES} == values
    lines = roles.read_text().splitlines()
    assert [line.split("=")[0] for line in lines] == ["gpu1", "gpu2"]
    assert lines[0] == f"gpu1={host['database_password'].read_text().strip()}"
    assert roles.stat().st_ino == inode  # rewritten in place: the postgres container's mount sees the new list
    # The shared storage's metadata password is the operator's (its database's): an empty file, kept once written.
    optional = folder / "shared_fs_meta_password"
    assert optional.read_text() == "" and optional.stat().st_uid == 10001
    optional.chmod(0o600)
    optional.write_text("their-own\n")
    assert make("control", str(folder)).returncode == 0
    assert optional.read_text() == "their-own\n" and stat.S_IMODE(optional.stat().st_mode) == 0o400


def test_a_bad_host_name_is_refused_naming_it(tmp_path):
    done = make("control", str(tmp_path / "s"), "gpu 1;rm")
    assert done.returncode != 0 and "not a host name" in done.stderr


def test_a_gpu_servers_folder_needs_its_passwords_from_the_control_plane_and_gets_its_own_key(tmp_path):
    control, node = tmp_path / "control", tmp_path / "node"
    assert make("control", str(control), "gpu1").returncode == 0
    refused = make("node", str(node))
    assert refused.returncode != 0 and "copy it from the control plane" in refused.stderr
    node.mkdir(exist_ok=True)
    for path in (control / "hosts" / "gpu1").iterdir():
        (node / path.name).write_text(path.read_text())
    done = make("node", str(node))
    assert done.returncode == 0, done.stderr
    key = (node / "secret_key").read_text().strip()
    assert key != (control / "secret_key").read_text().strip()  # its own, not the control plane's
    assert all(stat.S_IMODE(path.stat().st_mode) == 0o400 and path.stat().st_uid == 0 for path in node.iterdir())
