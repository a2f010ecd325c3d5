"""The catalog's PyTorch image holds PyTorch: jobs on it through the CLI, on the real image (no stand-in).

The image is built once per engine by the same cached build ``manage.py build_images`` runs
(agent/framework_images.py): the first run on a machine builds it (about two minutes), later runs find it.
"""

import io
import re
from pathlib import Path

import docker
import pytest
from django.conf import settings
from django.core.management import call_command

from agent import framework_images
from portal.models import Image, ImageStatus
from tests.portal.test_jobs_and_preemption import exit_watcher

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]

PYTORCH = "gpucloud/pytorch:2.13.0-cpu"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lightning"


@pytest.fixture(scope="session")
def pytorch_image():
    """The PyTorch image on this engine, built by the product's own cached build (once per engine)."""
    client = docker.DockerClient(base_url=settings.DOCKER_BASE_URL, timeout=900)
    framework_images.ensure(PYTORCH, client)
    return PYTORCH


@pytest.fixture
def pytorch_catalog(catalog, pytorch_image):
    """The demo catalog, its PyTorch image made ready by build_images (which finds it built)."""
    row = Image.objects.get(docker_ref=PYTORCH)
    assert row.status == ImageStatus.BUILDING, "a new catalog row waits for its image"
    out = io.StringIO()
    call_command("build_images", "--only", PYTORCH, stdout=out)
    assert f"{PYTORCH}: cached" in out.getvalue()
    row.refresh_from_db()
    assert row.status == ImageStatus.READY
    return catalog


def submit(cli, *args: str):
    return cli(
        "submit", "--gpu-type", "RTX3090", "--gpus", "1", "--memory", "2G", "--cpus", "1", "--image", "pytorch",
        *args, timeout=300,
    )  # fmt: skip


def test_a_job_on_the_pytorch_image_imports_torch_and_lightning(cli, pytorch_catalog, agent):
    with exit_watcher(agent):
        done = submit(cli, "--", "python", "-c", "import torch, pytorch_lightning; print(torch.__version__)")
    assert done.returncode == 0, done.stderr
    assert "2.13.0+cpu" in done.stdout.split()


def test_the_lightning_example_trains_checkpoints_under_auto_tmpdir_and_resumes(cli, pytorch_catalog, agent):
    """Two runs in one job: the second starts from the first's last.ckpt and its global step goes on."""
    command = (
        "MAX_EPOCHS=2 python train.py && MAX_EPOCHS=4 python train.py && "
        'echo "AUTO_TMPDIR=$AUTO_TMPDIR" && ls "$AUTO_TMPDIR"'
    )
    with exit_watcher(agent):
        done = submit(cli, "--upload", str(EXAMPLE), "--", "sh", "-c", command)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    print(out)  # the losses, for the record
    losses = [float(loss) for loss in re.findall(r"^epoch \d+ global_step \d+ loss ([\d.]+)$", out, re.M)]
    steps = [int(step) for step in re.findall(r"^epoch \d+ global_step (\d+) loss", out, re.M)]
    assert len(losses) == 4 and losses[-1] < losses[0] / 2, losses
    tmpdir = re.search(r"^AUTO_TMPDIR=(\S+)$", out, re.M).group(1)
    assert "start: fresh" in out and f"done: global_step 16, checkpoint {tmpdir}/last.ckpt" in out
    assert f"start: resuming from {tmpdir}/last.ckpt at global_step 16" in out
    assert steps == [8, 16, 24, 32], "the second run goes on from the first's step"
    assert "last.ckpt" in out.split(f"AUTO_TMPDIR={tmpdir}", 1)[1].split()
