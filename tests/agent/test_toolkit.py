"""A host with real cards starts its agent only on an NVIDIA Container Toolkit of at least 1.17.8 (CVE-2025-23266,
CVE-2025-23267). The stand-ins print exactly what the toolkit's own binaries print for ``--version`` (their
sources at those tags: urfave/cli's version printer over internal/info for nvidia-ctk, the hook's and the
runtime's own Printf, libnvidia-container's print_version for nvidia-container-cli)."""

import stat

import pytest

from agent import actions, toolkit
from agent.gpus import simulated_inventory
from agent.management.commands.node_agent import agent_start
from scheduler.models import Node

pytestmark = pytest.mark.django_db

CTK_1_17_8 = "NVIDIA Container Toolkit CLI version 1.17.8\ncommit: f202b80a9b9d0db00d9b1d73c0128c8962c55f4d\n"
CTK_1_17_7 = "NVIDIA Container Toolkit CLI version 1.17.7\ncommit: bae3e7842ebe26812d8bd6a9be6a14a83dc91d8f\n"
HOOK_1_17_8 = "NVIDIA Container Runtime Hook version 1.17.8\ncommit: f202b80a9b9d0db00d9b1d73c0128c8962c55f4d\n"
# The runtime prints its own lines, then (after a blank line) runc's: those name another version.
RUNTIME_1_18_0 = (
    "NVIDIA Container Runtime version 1.18.0\ncommit: f8daa5e26de9fd7eb79259040b6dd5a52060048c\nspec: 1.2.1\n\n"
    "runc version 1.1.12\ncommit: v1.1.12-0-g51d5e94\nspec: 1.0.2-dev\ngo: go1.20.13\nlibseccomp: 2.5.4\n"
)
CLI_1_17_8 = (
    "cli-version: 1.17.8\nlib-version: 1.17.8\nbuild date: 2025-05-30T13:47+00:00\n"
    "build revision: 6eda4d76c8c5f8fc174e4abca83e513fb4dd63b0\nbuild compiler: x86_64-linux-gnu-gcc-7 7.5.0\n"
    "build platform: x86_64\nbuild flags: -D_GNU_SOURCE -D_FORTIFY_SOURCE=2 -DNDEBUG -std=gnu11 -O2 -g\n"
)
CTK_1_17_8_RC = "NVIDIA Container Toolkit CLI version 1.17.8-rc.1\ncommit: 3e1b2a6c1f0e5d4c3b2a1908f7e6d5c4b3a29180\n"
CTK_1_18_0_RC = "NVIDIA Container Toolkit CLI version 1.18.0-rc.1\ncommit: 0a1b2c3d4e5f60718293a4b5c6d7e8f901234567\n"


@pytest.fixture
def tool(tmp_path, settings):
    """Make NVIDIA_CTK a stand-in that prints ``said`` for ``--version`` and exits with ``status``."""

    def install(said: str, *, status: int = 0):
        path = tmp_path / "nvidia-ctk"
        (tmp_path / "said").write_text(said)
        path.write_text(
            "#!/bin/sh\n"
            '[ "$1" = --version ] || { echo "unexpected arguments: $*" >&2; exit 2; }\n'
            f'cat "{tmp_path}/said"\n'
            f"exit {status}\n"
        )
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
        settings.NVIDIA_CTK = str(path)
        return path

    return install


@pytest.mark.parametrize(
    ("said", "version"),
    [(CTK_1_17_8, "1.17.8"), (HOOK_1_17_8, "1.17.8"), (RUNTIME_1_18_0, "1.18.0"), (CLI_1_17_8, "1.17.8")],
    ids=["nvidia-ctk", "nvidia-container-toolkit-hook", "nvidia-container-runtime", "nvidia-container-cli"],
)
def test_a_fixed_toolkit_is_accepted_whichever_of_its_binaries_says_its_version(tool, said, version):
    tool(said)
    assert str(toolkit.toolkit_require()) == version


def test_a_release_candidate_of_a_later_minor_is_accepted(tool):
    tool(CTK_1_18_0_RC)
    assert str(toolkit.toolkit_require()) == "1.18.0-rc.1"


@pytest.mark.parametrize(
    ("said", "found"), [(CTK_1_17_7, "1.17.7"), (CTK_1_17_8_RC, "1.17.8-rc.1")], ids=["1.17.7", "1.17.8-rc.1"]
)
def test_an_older_toolkit_is_refused_naming_the_version_found_and_the_one_needed(tool, said, found):
    path = tool(said)
    with pytest.raises(toolkit.ToolkitError) as refused:
        toolkit.toolkit_require()
    message = refused.value.message
    assert f"it is {found} (`{path} --version`)" in message
    assert "at least 1.17.8 is needed" in message and "CVE-2025-23266" in message


@pytest.mark.parametrize(
    ("said", "status"), [("nvidia-ctk: command not understood\n", 0), (CTK_1_17_8, 1)], ids=["no-version", "failed"]
)
def test_a_version_that_cannot_be_read_is_refused_as_unknown(tool, said, status):
    tool(said, status=status)
    with pytest.raises(toolkit.ToolkitError, match="its version is unknown.*at least 1.17.8 is needed"):
        toolkit.toolkit_require()


def test_a_missing_tool_is_refused_naming_the_path(settings, tmp_path):
    settings.NVIDIA_CTK = str(tmp_path / "nowhere" / "nvidia-ctk")
    with pytest.raises(toolkit.ToolkitError, match=f"`{settings.NVIDIA_CTK} --version` did not run"):
        toolkit.toolkit_require()


@pytest.fixture
def real_cards(monkeypatch):
    """The host's cards as NVML would report them (simulated=False), without NVML."""

    def discover(backend, *, node_name, sim_default):
        return simulated_inventory("sim:2xA100-80GB", node_name), False

    monkeypatch.setattr(actions, "discover", discover)


def test_a_host_with_real_cards_and_an_old_toolkit_does_not_register(tool, real_cards):
    tool(CTK_1_17_7)
    with pytest.raises(toolkit.ToolkitError, match="it is 1.17.7"):
        actions.agent_register("toolkit-old")
    assert not Node.objects.filter(name="toolkit-old").exists()


def test_the_agent_refuses_to_start_there_with_the_reason(tool, real_cards):
    tool(CTK_1_17_7)
    # A ServiceError: the node_agent command turns it into its exit message (CommandError).
    with pytest.raises(toolkit.ToolkitError, match="it is 1.17.7.*start the agent again"):
        agent_start("toolkit-old-start", "")
    assert not Node.objects.filter(name="toolkit-old-start").exists()


def test_a_host_with_real_cards_and_a_fixed_toolkit_registers(tool, real_cards):
    tool(CTK_1_17_8)
    node = actions.agent_register("toolkit-fixed")
    assert not node.simulated and node.gpus.count() == 2


def test_a_host_with_simulated_cards_needs_no_toolkit(settings, tmp_path):
    settings.GPU_BACKEND = "sim:1xT4"
    settings.NVIDIA_CTK = str(tmp_path / "nowhere" / "nvidia-ctk")
    assert actions.agent_register("toolkit-sim").simulated
