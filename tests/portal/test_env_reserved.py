"""A tenant's environment never sets what the NVIDIA Container Toolkit's hooks or the platform read: refused at
submission, naming ``env`` (or ``params``, whose names become variables of an array's tasks) and the variable."""

import pytest

from portal.models import Job, JobArray
from tests.portal.test_arrays import body

pytestmark = pytest.mark.django_db

REFUSED = [
    "LD_PRELOAD",  # CVE-2025-23266: a library loaded into the toolkit's hook
    "LD_AUDIT",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_REQUIRE_CUDA",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "GPUCLOUD_CHECKPOINT_DIR",
    "MASTER_ADDR",
    "RANK",
    "AUTO_TMPDIR",
    "SLURM_ARRAY_TASK_ID",
]


def job(catalog, env) -> dict:
    return {"image": catalog["image"].pk, "gpu_type": catalog["rtx3090"].pk, "gpus": "1", "command": "true", "env": env}


@pytest.mark.parametrize("name", REFUSED)
def test_a_variable_the_toolkit_or_the_platform_reads_is_refused_naming_env_and_the_variable(
    api, catalog, sim_node, name
):
    response = api.post("/api/v1/jobs/", job(catalog, {"LR": "3e-4", name: "x"}), format="json")
    assert response.status_code == 400, response.data
    assert name in response.data["env"][0] and "may not be set" in response.data["env"][0]
    assert not Job.objects.exists()


def test_loader_variables_are_refused_with_the_way_to_set_them_in_the_command(api, catalog, sim_node):
    response = api.post("/api/v1/jobs/", job(catalog, {"LD_PRELOAD": "/usr/lib/libtcmalloc.so"}), format="json")
    assert "in your command" in response.data["env"][0]


def test_library_paths_and_the_tenants_own_choice_of_cards_are_allowed(api, catalog, sim_node):
    env = {"LD_LIBRARY_PATH": "/opt/conda/lib", "CUDA_VISIBLE_DEVICES": "0", "ld_preload": "not the loader's"}
    response = api.post("/api/v1/jobs/", job(catalog, env), format="json")
    assert response.status_code == 201, response.data
    assert Job.objects.get().workload.env == env


def test_an_array_parameter_cannot_be_named_as_a_reserved_variable(api, catalog, sim_node):
    response = api.post("/api/v1/arrays/", body(catalog, params={"RANK": ["0", "1"]}), format="json")
    assert response.status_code == 400 and "RANK" in response.data["params"][0], response.data
    response = api.post("/api/v1/arrays/", body(catalog, array="0-1", env={"LD_PRELOAD": "/x.so"}), format="json")
    assert response.status_code == 400 and "LD_PRELOAD" in response.data["env"][0], response.data
    assert not JobArray.objects.exists() and not Job.objects.exists()


def test_the_console_form_names_the_env_field(client, user, catalog, sim_node):
    client.force_login(user)
    form = {
        "name": "f",
        "gpu_type": catalog["rtx3090"].pk,
        "image": catalog["image"].pk,
        "gpus": "1",
        "cpu_cores": 1,
        "memory_gb": 1,
        "command": "true",
        "priority": 1,
        "env": "LR=1e-3\nNVIDIA_DRIVER_CAPABILITIES=all\n",
    }
    response = client.post("/jobs/new/", form)
    page = response.content.decode()
    assert response.status_code == 200 and 'data-field="env"' in page and "NVIDIA_DRIVER_CAPABILITIES" in page
    assert not Job.objects.exists()
