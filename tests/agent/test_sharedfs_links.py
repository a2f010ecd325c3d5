"""The agent, root on the host, never follows a link a tenant put in his shared storage: it makes and deletes
checkpoint folders only where they belong. On a plain folder standing in for the mount (the same functions read
SHARED_FS_MOUNT); tests/agent/test_sharedfs.py runs them on JuiceFS."""

from pathlib import Path

import pytest

from agent import sharedfs as host_fs
from scheduler.sharedfs import SharedFsError

UID = "abc123"


@pytest.fixture
def mount(settings, tmp_path) -> Path:
    settings.SHARED_FS_MOUNT = str(tmp_path / "mnt")
    (tmp_path / "mnt" / "users" / "7").mkdir(parents=True)  # the user's directory, bound into his containers
    return tmp_path / "mnt"


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    """A folder of the host's, outside the shared storage, with something in it."""
    folder = tmp_path / "host" / UID
    folder.mkdir(parents=True)
    (folder / "precious").write_text("the host's")
    return folder.parent


def test_a_checkpoints_folder_replaced_by_a_link_is_not_followed_to_make_one(mount, elsewhere):
    (mount / "users" / "7" / "checkpoints").symlink_to(elsewhere)
    with pytest.raises(SharedFsError, match="checkpoints is a symbolic link"):
        host_fs.checkpoint_dir_ensure(7, "other1")
    assert not (elsewhere / "other1").exists()


def test_a_checkpoints_folder_replaced_by_a_link_is_not_followed_to_delete(mount, elsewhere):
    (mount / "users" / "7" / "checkpoints").symlink_to(elsewhere)
    assert host_fs.checkpoint_dir_remove(7, UID) is False
    assert (elsewhere / UID / "precious").read_text() == "the host's"


def test_a_checkpoint_folder_replaced_by_a_link_is_removed_itself_not_what_it_points_to(mount, elsewhere):
    checkpoints = mount / "users" / "7" / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / UID).symlink_to(elsewhere / UID)
    with pytest.raises(SharedFsError, match=f"{UID} is a symbolic link"):
        host_fs.checkpoint_dir_ensure(7, UID)
    assert host_fs.checkpoint_dir_remove(7, UID) is True
    assert not (checkpoints / UID).is_symlink() and (elsewhere / UID / "precious").read_text() == "the host's"
