"""The CLI end to end: login, submit with --upload and follow to the job's exit code, exec into a running job,
cp both ways, ps --json, cancel — against a real server, worker, node relay and Docker."""

import json
import stat
from pathlib import Path

import pytest

from portal.models import ApiToken, Job
from tests.conftest import TEST_IMAGE, make_node, wait_status
from tests.portal.test_jobs_and_preemption import exit_watcher

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]


def test_login_with_a_password_saves_a_private_profile_that_later_commands_use(cli, user, tmp_path):
    done = cli("login", "--url", cli.url, "--username", "alice", "--password", "alice-pass-123", signed_in=False)
    assert done.returncode == 0, done.stderr
    saved = Path(cli.config_home) / "gpucloud" / "config.toml"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert cli.token not in saved.read_text(), "a token of its own, named for this machine"
    assert ApiToken.objects.filter(user=user, name__startswith="gpucloud CLI on ").count() == 1
    assert cli("whoami", signed_in=False).stdout.strip() == "alice"
    assert cli("whoami", signed_in=False, GPUCLOUD_TOKEN=cli.token).stdout.strip() == "alice", "login replaced nothing"
    assert cli("whoami", signed_in=False, GPUCLOUD_TOKEN="wrong").returncode == 4, "the environment overrides the file"
    assert cli("whoami", "--json", signed_in=False, GPUCLOUD_TOKEN="wrong").returncode == 4

    assert cli("-p", "work", "whoami", signed_in=False).returncode == 4, "no such profile yet"
    other = cli("login", "--profile", "work", "--url", cli.url, "--token", cli.token, signed_in=False)
    assert other.returncode == 0, other.stderr
    assert cli("-p", "work", "whoami", signed_in=False).stdout.strip() == "alice"
    assert cli("whoami", signed_in=False, GPUCLOUD_PROFILE="default").stdout.strip() == "alice"
    assert 'default_profile = "work"' in saved.read_text(), "the last login is the default"


def test_a_wrong_password_a_missing_object_and_a_usage_mistake_have_their_own_exit_codes(cli, catalog):
    wrong = cli("login", "--url", cli.url, "--username", "alice", "--password", "nope", signed_in=False)
    assert wrong.returncode == 1 and "wrong username or password" in wrong.stderr
    assert cli("show", "j999999").returncode == 3
    assert cli("show", "x12").returncode == 2
    assert cli("submit", "--gpu-type", "RTX3090").returncode == 2, "no command"
    assert cli("whoami", signed_in=False).returncode == 4, "no profile yet"
    offers = json.loads(cli("offers", "--gpu-type", "RTX3090", "--json").stdout)
    assert [o["name"] for o in offers] == ["RTX3090"] and "free_cards" in offers[0]["capacity"]


def test_submit_with_upload_runs_the_command_in_the_code_and_follows_it_to_its_exit_code(cli, catalog, agent, tmp_path):
    code = tmp_path / "project"
    (code / "data").mkdir(parents=True)
    (code / "data" / "numbers.txt").write_text("6 7\n")
    (code / "train.sh").write_text('set -- $(cat data/numbers.txt); echo "answer=$(($1 * $2)) in $PWD"; exit 7\n')
    with exit_watcher(agent):
        done = cli(
            "submit", "--gpu-type", "RTX3090", "--gpus", "0.5", "--memory", "1G", "--cpus", "1",
            "--image", TEST_IMAGE, "--upload", str(code), "--", "sh", "train.sh",
        )  # fmt: skip
    assert done.returncode == 7, done.stderr
    assert "answer=42 in /root/checkpoints/code" in done.stdout
    job = Job.objects.get()
    assert job.workload.exit_code == 7 and job.workload.code.size_bytes > 0


def test_exec_cp_ps_and_cancel_on_a_running_job(cli, catalog, agent, tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "hello.txt").write_text("hello\n")
    started = cli(
        "submit", "-d", "--gpu-type", "RTX3090", "--gpus", "0.5", "--memory", "1G", "--cpus", "1",
        "--image", TEST_IMAGE, "--name", "sleeper", "--upload", str(tmp_path / "code"), "--", "sleep", "600",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    job = Job.objects.get(pk=int(started.stdout))
    wait_status(job.workload, "running")

    listed = json.loads(cli("ps", "--json").stdout)
    assert [(j["id"], j["name"], j["status"]) for j in listed["jobs"]] == [(job.pk, "sleeper", "running")]

    shell = cli("exec", "-i", f"j{job.pk}", input="echo in-$((6*7)) > /root/checkpoints/out.txt\nexit 3\n")
    assert shell.returncode == 3, shell.stderr
    command = cli("exec", str(job.pk), "--", "sh", "-c", "test -s /root/checkpoints/out.txt && exit 5")
    assert command.returncode == 5, command.stderr
    where = cli("exec", str(job.pk), "--", "sh", "-c", 'echo "in $PWD: $(cat hello.txt)"')
    assert "in /root/checkpoints/code: hello" in where.stdout, "the shell starts where the job's command runs"

    assert cli("cp", f"j{job.pk}:/root/checkpoints/out.txt", str(tmp_path)).returncode == 0
    assert (tmp_path / "out.txt").read_text() == "in-42\n"
    (tmp_path / "up.txt").write_text("sent up\n")
    assert cli("cp", str(tmp_path / "up.txt"), f"j{job.pk}:/root/checkpoints/").returncode == 0
    back = cli("exec", f"j{job.pk}", "--", "cat", "/root/checkpoints/up.txt")
    assert back.returncode == 0 and "sent up" in back.stdout
    renamed = cli("cp", str(tmp_path / "up.txt"), f"j{job.pk}:/root/checkpoints/renamed.txt")  # lists the folder
    assert renamed.returncode == 0 and "/root/checkpoints/renamed.txt" in renamed.stderr

    cancelled = cli("cancel", f"j{job.pk}")
    assert cancelled.returncode == 0, cancelled.stderr
    wait_status(job.workload, "stopped")
    assert json.loads(cli("show", f"j{job.pk}", "--json").stdout)["status"] == "stopped"
    assert cli("exec", f"j{job.pk}").returncode == 1, "a job that does not run has no shell (409)"


def test_submit_elastic_asks_for_a_range_and_ps_shows_the_cards_it_holds_now(cli, catalog):
    make_node("sim:4xRTX3090")
    common = ["submit", "-d", "--gpu-type", "RTX3090", "--image", str(catalog["image"].pk), "--memory", "1G"]
    done = cli(*common, "--gpus", "2", "--elastic", "1:4", "--", "python", "train.py")
    assert done.returncode == 0, done.stderr
    job = Job.objects.get(pk=int(done.stdout.strip()))
    assert (job.workload.elastic_min, job.workload.elastic_max, job.workload.gpu_count) == (1, 4, 2)
    listed = json.loads(cli("ps", "--json").stdout)["jobs"]
    assert [(j["cards"], j["elastic_min"], j["elastic_max"]) for j in listed] == [(2, 1, 4)]
    assert "2 of 1-4×RTX3090" in cli("ps").stdout

    wrong = cli(*common, "--gpus", "2", "--elastic", "4", "--", "true")
    assert wrong.returncode == 2 and "MIN:MAX" in wrong.stderr
    refused = cli(*common, "--gpus", "2", "--elastic", "3:4", "--", "true")  # the server's check, named
    assert refused.returncode == 1 and "elastic_min" in refused.stderr
    assert Job.objects.count() == 1
