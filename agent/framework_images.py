"""The catalog's framework images, built on a host from Debian's packages and pinned wheels (no registry needed).

Each recipe is a Debian 12 (bookworm) minbase root filesystem made by ``mmdebstrap`` from the apt sources this
host uses, with Python 3.11 and a virtual environment at ``/opt/venv`` (first on ``PATH``, so ``pip install``
works for the user), into which the recipe's wheels — every package pinned in ``config/images/<name>.txt`` —
are installed offline; then ``docker import``. Nothing runs with a network inside a container: the wheels are
downloaded on the host first (``pip download --no-deps``, with this host's pip configuration and index) and
kept under ``var/images/wheels``.

Built once and cached: the image carries the label ``org.gpucloud.recipe`` holding a hash of its recipe (the
packages, the pinned wheels, the apt sources, the image settings and ``BUILD_STEPS``, the version of the steps
below). An image already on the engine with the same hash is not built again; a build holds a file lock, so a
second builder waits and then finds it built. Each step prints what it does and how long it took.

``python -m agent.framework_images [REF ...]`` builds on the engine ``DOCKER_HOST`` names (every recipe when no
reference is given): what ``config/prod/build_images.sh`` runs, where no Django settings are loaded.
"""

import contextlib
import fcntl
import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPES_DIR = ROOT / "config" / "images"
SUITE = "bookworm"
RECIPE_LABEL = "org.gpucloud.recipe"
VENV = "/opt/venv"
ENV_PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
APT_SOURCES = ("/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list")
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "procps")
BUILD_STEPS = "2"  # part of every recipe's hash: change it when _rootfs or _changes change what an image holds


class BuildError(Exception):
    """A recipe that could not be built here; the message says which step and why."""


@dataclass(frozen=True)
class Recipe:
    ref: str  # what the catalog names: repository:tag, telling what it holds
    requirements: str = ""  # config/images/<file>: every Python package pinned; empty: none beyond pip
    probe: str = ""  # Python run in the built image (no network): prints what it holds, or fails the build


RECIPES = {
    r.ref: r
    for r in (
        Recipe("gpucloud/python:3.11-bookworm", probe="import sys; print(sys.version.split()[0])"),
        Recipe(
            "gpucloud/pytorch:2.13.0-cpu",
            "pytorch-cpu.txt",
            "import torch, pytorch_lightning, numpy; print(torch.__version__, pytorch_lightning.__version__)",
        ),
        Recipe(
            "gpucloud/tensorflow:2.21.0-cpu", "tensorflow-cpu.txt", "import tensorflow as tf; print(tf.__version__)"
        ),
    )
}


def cache_dir() -> Path:
    return Path(os.environ.get("IMAGE_BUILD_CACHE") or ROOT / "var" / "images")


def apt_sources() -> str:
    """The apt sources this host uses (mmdebstrap reads the same file), so images come from the same mirror."""
    for path in APT_SOURCES:
        if Path(path).is_file() and Path(path).read_text().strip():
            return path
    raise BuildError(f"no apt sources on this host (looked at {', '.join(APT_SOURCES)})")


def recipe_key(recipe: Recipe) -> str:
    parts = [SUITE, ",".join(BASE_PACKAGES), Path(apt_sources()).read_text(), ENV_PATH, recipe.probe]
    if recipe.requirements:
        parts.append((RECIPES_DIR / recipe.requirements).read_text())
    parts.append(BUILD_STEPS)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def built(client, ref: str, key: str) -> bool:
    """Whether the engine has ``ref`` built from this very recipe."""
    import docker

    try:
        labels = client.images.get(ref).attrs["Config"].get("Labels") or {}
    except docker.errors.ImageNotFound:
        return False
    return labels.get(RECIPE_LABEL) == key


@contextlib.contextmanager
def _lock(name: str):
    path = cache_dir() / "locks" / f"{name.replace('/', '_').replace(':', '_')}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _run(step: str, argv: list[str]) -> None:
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise BuildError(f"{step} failed (exit {done.returncode}):\n{tail}")


def _wheels(recipe: Recipe) -> Path:
    """The recipe's wheels on this host, downloaded once (pip skips files it has)."""
    folder = cache_dir() / "wheels" / Path(recipe.requirements).stem
    folder.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version"]
    _run("pip download", [*pip, "3.11", "-d", str(folder), "-r", str(RECIPES_DIR / recipe.requirements)])
    (folder / "requirements.txt").write_bytes((RECIPES_DIR / recipe.requirements).read_bytes())
    return folder


def _rootfs(recipe: Recipe, wheels: Path | None, tar: Path) -> None:
    """mmdebstrap: Debian minbase + Python, a venv at VENV and the wheels installed into it offline."""
    pip = f"{VENV}/bin/pip install --quiet --no-index --no-cache-dir --find-links /tmp/wheels -r /tmp/wheels/"
    hooks = [f'--customize-hook=chroot "$1" python3 -m venv {VENV}']
    if wheels is not None:
        hooks += [
            '--customize-hook=mkdir -p "$1/tmp/wheels"',
            f"--customize-hook=sync-in {wheels} /tmp/wheels",
            f'--customize-hook=chroot "$1" {pip}requirements.txt',
        ]
    hooks.append('--customize-hook=rm -rf "$1/tmp/wheels" "$1"/var/lib/apt/lists/*_Packages "$1"/var/cache/apt/*.bin')
    _run(
        "mmdebstrap",
        [
            "mmdebstrap", "--quiet", "--variant=minbase", "--skip=download/empty",
            '--aptopt=Apt::Install-Recommends "false"',
            "--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*", "--dpkgopt=path-include=/usr/share/locale/locale.alias",
            f"--include={','.join(BASE_PACKAGES)}", *hooks, SUITE, str(tar), apt_sources(),
        ],
    )  # fmt: skip


def _changes(key: str) -> list[str]:
    return [
        f"ENV PATH={ENV_PATH}",
        "ENV LANG=C.UTF-8",
        f"ENV VIRTUAL_ENV={VENV}",
        f"LABEL {RECIPE_LABEL}={key}",
        "WORKDIR /root",
        'CMD ["bash"]',
    ]


def _rootfs_cached(recipe: Recipe, key: str, say: Callable[[str], None]) -> Path:
    """The recipe's root filesystem as a tar, made once per recipe hash and kept: another engine (a host of the
    several-host setup, the production engine) imports the same tar instead of building it again."""
    ref = recipe.ref
    folder = cache_dir() / "rootfs"
    folder.mkdir(parents=True, exist_ok=True)
    stem = ref.replace("/", "_").replace(":", "_")
    tar = folder / f"{stem}-{key}.tar"
    if tar.exists():
        say(f"{ref}: [1-2/4] root filesystem cached ({tar.name})")
        return tar
    if not _has("mmdebstrap"):
        raise BuildError(f"cannot build {ref} here: mmdebstrap is missing (apt-get install mmdebstrap)")
    started = time.monotonic()
    wheels = None
    if recipe.requirements:
        say(f"{ref}: [1/4] wheels pinned in config/images/{recipe.requirements} ...")
        wheels = _wheels(recipe)
        say(f"{ref}: [1/4] wheels ready ({_mb(wheels)} MB) at {time.monotonic() - started:.0f}s")
    say(f"{ref}: [2/4] root filesystem: mmdebstrap {SUITE} minbase + Python 3.11 venv ...")
    partial = tar.with_suffix(".partial.tar")  # mmdebstrap picks its output format by the extension
    try:
        _rootfs(recipe, wheels, partial)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    for old in folder.glob(f"{stem}-*.tar"):  # an earlier recipe's
        if old != partial:
            old.unlink()
    partial.rename(tar)
    say(f"{ref}: [2/4] root filesystem {tar.stat().st_size >> 20} MB at {time.monotonic() - started:.0f}s")
    return tar


def ensure(ref: str, client, say: Callable[[str], None] = print) -> bool:
    """Make the engine behind ``client`` hold ``ref`` built from its recipe; returns whether it was built now."""
    recipe = RECIPES.get(ref)
    if recipe is None:
        raise BuildError(f"no recipe for {ref} (there are: {', '.join(RECIPES)})")
    key = recipe_key(recipe)
    if built(client, ref, key):
        say(f"{ref}: cached (recipe {key})")
        return False
    with _lock(ref):
        if built(client, ref, key):  # another builder finished it while this one waited
            say(f"{ref}: built by another process (recipe {key})")
            return False
        started = time.monotonic()
        tar = _rootfs_cached(recipe, key, say)
        say(f"{ref}: [3/4] docker import ({tar.stat().st_size >> 20} MB) ...")
        repository, tag = ref.rsplit(":", 1)
        client.api.import_image_from_file(str(tar), repository=repository, tag=f"building-{key}", changes=_changes(key))
        say(f"{ref}: [4/4] probe: {recipe.probe}")
        output = _probe(client, f"{repository}:building-{key}", recipe.probe)
        image = client.images.get(f"{repository}:building-{key}")
        image.tag(repository, tag)
        client.images.remove(f"{repository}:building-{key}")
        say(
            f"{ref}: built in {time.monotonic() - started:.0f}s, {image.attrs['Size'] / 1e6:.0f} MB "
            f"(recipe {key}); it says: {output}"
        )
        return True


def _probe(client, ref: str, code: str) -> str:
    import docker

    try:
        out = client.containers.run(ref, ["python", "-c", code], network_mode="none", remove=True)
    except docker.errors.ContainerError as exc:
        client.images.remove(ref, force=True)
        raise BuildError(f"{ref} does not hold what it names: {exc.stderr.decode(errors='replace')[-500:]}") from exc
    return out.decode().strip()


def _has(tool: str) -> bool:
    import shutil

    return shutil.which(tool) is not None


def _mb(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir()) >> 20


if __name__ == "__main__":
    import docker

    engine = docker.from_env(timeout=600)
    try:
        for wanted in sys.argv[1:] or list(RECIPES):
            ensure(wanted, engine, say=lambda line: print(line, file=sys.stderr, flush=True))
    except BuildError as exc:
        sys.exit(f"ERROR: {exc}")
