"""With the shared storage on, a job's checkpoints are on it (its AUTO_TMPDIR), not on its node: a job stopped to
be resumed — preempted, or stopped by its own host's self-fence — may resume on any node; without it, on its own."""

import pytest

from agent.actions import agent_stop
from agent.selffence import SelfFence
from core.clock import AgentClock
from scheduler.models import Workload, WorkloadStatus
from tests.agent.test_agent import running_instance
from tests.agent.test_selffence import cut_off
from tests.conftest import make_node, remove_node_containers

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def node(settings, tmp_path):
    settings.SELF_FENCE_AFTER_S, settings.PREEMPTION_GRACE_S, settings.AGENT_STATE_DIR = 2, 1, tmp_path
    node = make_node("sim:1xRTX3090")
    yield node
    remove_node_containers(node.name)


def shared_storage_on(settings, tmp_path) -> None:
    """The shared storage on, after the launch (nothing is mounted here: the fence finds no client to ask)."""
    settings.SHARED_FS_META, settings.SHARED_FS_MOUNT = "postgres://meta.invalid/fs", str(tmp_path / "mnt")


@pytest.mark.parametrize("shared", [False, True])
def test_a_preempted_job_requeues_on_its_node_unless_its_checkpoints_are_on_the_shared_storage(
    user, node, base_image, settings, tmp_path, shared
):
    job = running_instance(user, node, base_image, kind="job", command=["sleep", "600"])
    if shared:
        shared_storage_on(settings, tmp_path)
    Workload.objects.filter(pk=job.pk).update(status=WorkloadStatus.STOPPING, preempt_requested=True)

    agent_stop(job.pk)

    job.refresh_from_db()
    assert (job.status, job.preemptions) == (WorkloadStatus.QUEUED, 1)
    assert job.pinned_node_id == (None if shared else node.pk)


def test_a_job_its_host_stopped_while_cut_off_may_resume_on_any_node(user, node, base_image, settings, tmp_path):
    job = running_instance(user, node, base_image, kind="job", command=["sleep", "600"])
    shared_storage_on(settings, tmp_path)
    fence = SelfFence(node.name, AgentClock())
    cut_off(fence, 3)
    assert fence.check() == [job.pk]
    fence.contact()

    assert fence.report() == [job.pk]

    job.refresh_from_db()
    assert job.status == WorkloadStatus.QUEUED and job.pinned_node_id is None
