"""The BusyBox stand-in: a tiny image built on the node itself, for tests and benchmarks that need a container
but no framework (the catalog's images are real: agent/framework_images.py).

The root filesystem is a static busybox with its applets, a root user and the
usual empty directories, imported with ``docker import``: a few MB, starting in
well under a second.
"""

import io
import shutil
import subprocess
import tarfile

from agent.launcher import docker_client
from core.errors import InvalidInput
from portal.services.demo import STANDIN_IMAGE

BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")
DIRECTORIES = {
    "bin": 0o755,
    "etc": 0o755,
    "root": 0o700,
    "tmp": 0o1777,
    "proc": 0o555,
    "sys": 0o555,
    "dev": 0o755,
    "var": 0o755,
    "usr": 0o755,
    "home": 0o755,
}
FILES = {
    "etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
    "etc/group": "root:x:0:\nnogroup:x:65534:\n",
    "etc/hosts": "127.0.0.1 localhost\n::1 localhost\n",
}


def find_busybox() -> str:
    for path in BUSYBOX_CANDIDATES:
        if shutil.which(path):
            return path
    raise InvalidInput("busybox is not installed: apt-get install busybox-static", field="busybox")


def rootfs_tar(busybox: str) -> bytes:
    applets = subprocess.run([busybox, "--list"], check=True, capture_output=True, text=True).stdout.split()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, mode in DIRECTORIES.items():
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        tar.add(busybox, arcname="bin/busybox")
        for applet in applets:
            if applet != "busybox":
                info = tarfile.TarInfo(f"bin/{applet}")
                info.type, info.linkname = tarfile.SYMTYPE, "busybox"
                tar.addfile(info)
        for name, text in FILES.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def image_exists(ref: str) -> bool:
    import docker

    try:
        docker_client().images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


def stand_in_build(ref: str) -> None:
    """Build the busybox base image and tag it ``ref`` (repository:tag)."""
    repository, _, tag = ref.rpartition(":") if ":" in ref.split("/")[-1] else (ref, "", "latest")
    docker_client().api.import_image_from_data(
        rootfs_tar(find_busybox()),
        repository=repository,
        tag=tag,
        changes=["ENV PATH=/bin", "WORKDIR /root", 'CMD ["sh"]'],
    )


def image_tag(source: str, ref: str) -> None:
    repository, _, tag = ref.rpartition(":") if ":" in ref.split("/")[-1] else (ref, "", "latest")
    docker_client().images.get(source).tag(repository, tag)


def stand_in_ensure(ref: str = STANDIN_IMAGE) -> None:
    """Make the BusyBox stand-in exist on this engine as ``STANDIN_IMAGE``, and as ``ref`` (another name a test
    gives it) when that is missing."""
    if not image_exists(STANDIN_IMAGE):
        stand_in_build(STANDIN_IMAGE)
    if not image_exists(ref):
        image_tag(STANDIN_IMAGE, ref)
