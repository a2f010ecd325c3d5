"""Job arrays from the CLI: a parameter sweep submitted, listed, shown per task and cancelled as one."""

import json

import pytest

from portal.models import Job
from scheduler.models import WorkloadCode
from tests.conftest import TEST_IMAGE, wait_for
from tests.portal.test_jobs_and_preemption import exit_watcher

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def test_a_sweep_is_one_submission_of_the_product_shown_per_task_and_cancelled_as_one(cli, catalog, sim_node):
    submitted = cli(
        "submit", "--gpu-type", "RTX3090", "--gpus", "0.5", "--memory", "1G", "--cpus", "1", "--image", TEST_IMAGE,
        "--param", "lr=1e-3,3e-4", "--param", "bs=32,64", "--max-running", "2", "--", "sleep", "600",
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    ref = submitted.stdout.strip()
    assert ref.startswith("a") and "4 tasks (spot)" in submitted.stderr

    listed = json.loads(cli("arrays", "--json").stdout)
    assert [(f"a{a['id']}", a["total"], a["spot"]) for a in listed] == [(ref, 4, True)]
    shown = json.loads(cli("show", ref, "--json").stdout)
    assert sorted((t["params"]["lr"], t["params"]["bs"]) for t in shown["tasks"]) == [
        ("1e-3", "32"), ("1e-3", "64"), ("3e-4", "32"), ("3e-4", "64"),
    ]  # fmt: skip

    assert cli("cancel", ref).returncode == 0
    after = json.loads(cli("show", ref, "--json").stdout)
    assert after["status"] == "cancelled" and after["counts"]["cancelled"] == 4


def test_an_array_spec_with_a_mistake_is_refused_naming_the_field(cli, catalog, sim_node):
    refused = cli("submit", "--gpu-type", "RTX3090", "--image", TEST_IMAGE, "--array", "9-1", "--", "true")
    assert refused.returncode == 1 and "array" in refused.stderr


def test_an_array_with_upload_sends_the_code_once_and_every_task_runs_in_it(cli, catalog, agent, tmp_path):
    code = tmp_path / "project"
    code.mkdir()
    (code / "say.txt").write_text("in\n")
    (code / "run.sh").write_text('echo "task $GPUCLOUD_ARRAY_INDEX lr=$GPUCLOUD_PARAM_LR $(cat say.txt) $PWD"\n')
    with exit_watcher(agent):
        submitted = cli(
            "submit", "--gpu-type", "RTX3090", "--gpus", "0.5", "--memory", "1G", "--cpus", "1",
            "--image", TEST_IMAGE, "--upload", str(code), "--param", "lr=1e-3,3e-4", "--", "sh", "run.sh",
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        ref = submitted.stdout.strip()

        def done():
            shown = json.loads(cli("show", ref, "--json").stdout)
            assert shown["counts"].get("failed", 0) == 0, shown
            return shown["counts"].get("done") == 2

        wait_for(done, timeout=90, what="both tasks to finish")
    assert WorkloadCode.objects.count() == 1  # sent and stored once
    for task in Job.objects.filter(array_id=int(ref[1:])):
        log = cli("logs", f"j{task.pk}").stdout
        assert f"task {task.array_index} lr={task.params['lr']} in /root/checkpoints/code" in log, log
