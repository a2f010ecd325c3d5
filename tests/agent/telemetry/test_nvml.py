"""The NVML backend with NVML-shaped data: real pynvml structs, a /proc with real cgroup lines.

The MPS cases copy what an H200 under classic MPS answered (../shared/GPU.md): the compute list and the MPS
list name each client with its own memory, the server is a compute process of its own, and the utilization
samples name the server's pid alone."""

import types

import pynvml
import pytest

from agent.telemetry.nvml import NvmlBackend
from scheduler.telemetry.documents import NO_READING, SHARED_CARD, Card, Tenant, TenantShare

UUID = "GPU-8f1c0000-0000-0000-0000-000000000001"
CID_A = "a" * 64
CID_B = "b" * 64
MIB = 1024 * 1024


def fake_nvml(*, processes, samples, fan_supported=False, mps_clients=(), names=None, gpu_util=83):
    """pynvml's constants and errors, with the device calls answering from the given structs.

    ``mps_clients``: (pid, memory) of the MPS list (None: the call is not supported); ``names``: pid -> process name.
    """

    def process(pid, memory):
        info = pynvml.c_nvmlProcessInfo_v3_t()
        info.pid, info.usedGpuMemory = pid, memory
        return pynvml.nvmlStructToFriendlyObject(info)  # what pynvml hands back

    def sample(pid, sm, ts):
        s = pynvml.c_nvmlProcessUtilizationSample_t()
        s.pid, s.smUtil, s.memUtil, s.timeStamp = pid, sm, 0, ts
        return s

    def not_supported(*args):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    rates = pynvml.c_nvmlUtilization_t()
    rates.gpu, rates.memory = gpu_util, 41
    memory = pynvml.c_nvmlMemory_t()
    memory.total, memory.used = 24576 * MIB, 9000 * MIB
    fake = types.SimpleNamespace(**{k: getattr(pynvml, k) for k in dir(pynvml) if not k.startswith("nvml")})
    fake.nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError
    fake.nvmlInit = fake.nvmlShutdown = lambda: None
    fake.nvmlDeviceGetHandleByUUID = lambda uuid: "handle"
    fake.nvmlDeviceGetUtilizationRates = lambda h: rates
    fake.nvmlDeviceGetMemoryInfo = lambda h: memory
    fake.nvmlDeviceGetPowerUsage = lambda h: 251_300
    fake.nvmlDeviceGetEnforcedPowerLimit = lambda h: 350_000
    fake.nvmlDeviceGetTemperature = lambda h, sensor: 67
    fake.nvmlDeviceGetClockInfo = lambda h, clock: 1695 if clock == pynvml.NVML_CLOCK_SM else 9751
    fake.nvmlDeviceGetFanSpeed = (lambda h: 55) if fan_supported else not_supported
    fake.nvmlDeviceGetPcieThroughput = lambda h, counter: 1200
    fake.nvmlDeviceGetTotalEccErrors = not_supported
    fake.nvmlEventSetCreate = not_supported
    fake.nvmlDeviceGetComputeRunningProcesses = lambda h: [process(*p) for p in processes]
    fake.nvmlDeviceGetMPSComputeRunningProcesses = (
        not_supported if mps_clients is None else lambda h: [process(*p) for p in mps_clients]
    )
    fake.nvmlSystemGetProcessName = lambda pid: (names or {}).get(pid) or not_supported()
    fake.nvmlDeviceGetProcessUtilization = lambda h, since: [sample(*s) for s in samples if s[2] > since]
    return fake


@pytest.fixture
def proc(tmp_path):
    """Host pids 101, 102 in container A (cgroup v1 lines), 201 in container B (v2), 301 a host process."""
    lines = {
        101: f"12:memory:/docker/{CID_A}\n11:cpu,cpuacct:/docker/{CID_A}\n",
        102: f"4:pids:/docker/{CID_A}\n",
        201: f"0::/system.slice/docker-{CID_B}.scope\n",
        301: "0::/user.slice/user-1000.slice/session-2.scope\n",
    }
    for pid, text in lines.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
    return tmp_path


def tenant(workload_id, container_id, milli):
    cap = 24576 * milli // 1000
    return Tenant(
        workload_id,
        f"u{workload_id}",
        f"w{workload_id}",
        "instance",
        1,
        container_id,
        2,
        4096,
        (TenantShare(UUID, milli, cap),),
    )


CARD = Card(0, UUID, "RTX3090", 24576)


def test_processes_are_attributed_to_the_container_they_run_in(proc):
    nvml = fake_nvml(
        processes=[(101, 3000 * MIB), (102, 1000 * MIB), (201, 2000 * MIB), (301, 3000 * MIB)],
        samples=[(101, 10, 5), (101, 20, 9), (102, 5, 9), (201, 50, 9), (301, 30, 9)],
    )
    a, b = tenant(1, CID_A, 300), tenant(2, CID_B, 700)
    backend = NvmlBackend([CARD], nvml=nvml, proc=proc)
    [card], own = backend.sample([CARD], [a, b], {})
    # A: pid 101's newest sample (20 %) + pid 102's 5 % = 25 % of the card, of a 0.3 share: 0.833
    assert own[(1, UUID)].util == pytest.approx(0.25 / 0.3)
    assert own[(1, UUID)].mem_used == 4000
    assert own[(2, UUID)].util == pytest.approx(0.5 / 0.7)
    assert own[(2, UUID)].mem_used == 2000, "the host process's 3000 MiB belongs to nobody"
    assert (card.util, card.mem_used, card.mem_total, card.power, card.temp) == (0.83, 9000, 24576, 251.3, 67)
    assert card.fan is None, "a field the card does not support is a gap"
    assert [t["workload"] for t in card.tenants] == [1, 2]


def test_a_tenant_with_no_kernel_since_the_last_sample_reads_idle(proc):
    nvml = fake_nvml(processes=[(101, 500 * MIB)], samples=[(101, 90, 5)])
    backend = NvmlBackend([CARD], nvml=nvml, proc=proc)
    a = tenant(1, CID_A, 1000)
    backend.sample([CARD], [a], {})
    nvml.nvmlDeviceGetProcessUtilization = lambda h, since: (_ for _ in ()).throw(pynvml.NVMLError_NotFound())
    _, own = backend.sample([CARD], [a], {})
    assert own[(1, UUID)].util == 0.0 and own[(1, UUID)].mem_used == 500


SERVER = 51  # the card's MPS server: a host process
SERVER_NAME = {SERVER: "nvidia-cuda-mps-server"}


def test_tenants_of_a_card_shared_through_mps_read_no_compute_but_their_own_memory(proc):
    # Two 0.5 clients, both busy: the card reads 100 %, NVML's per-process samples name only the server.
    clients = [(101, 19968 * MIB), (201, 19968 * MIB)]
    nvml = fake_nvml(
        processes=[(SERVER, 30 * MIB), *clients],
        mps_clients=clients,
        samples=[(SERVER, 96, 5)],
        names=SERVER_NAME,
        gpu_util=100,
    )
    a, b = tenant(1, CID_A, 500), tenant(2, CID_B, 500)
    [card], own = NvmlBackend([CARD], nvml=nvml, proc=proc).sample([CARD], [a, b], {})
    for workload_id in (1, 2):
        reading = own[(workload_id, UUID)]
        assert reading.util is None, "not 0.0: a busy client must not read idle"
        assert reading.util_absent == SHARED_CARD
        assert reading.mem_used == 19968, "its own memory, from the MPS client list"
    assert card.util == 1.0, "the card's own utilization stays"
    holders = {t["workload"]: t for t in card.tenants}
    assert holders[1]["util"] is None and holders[1]["util_absent"] == SHARED_CARD and holders[1]["mem_used"] == 19968


def test_the_mps_server_alone_marks_a_card_shared_where_the_driver_gives_no_client_list(proc):
    nvml = fake_nvml(
        processes=[(SERVER, 30 * MIB), (101, 700 * MIB)], mps_clients=None, samples=[(SERVER, 90, 5)], names=SERVER_NAME
    )
    _, own = NvmlBackend([CARD], nvml=nvml, proc=proc).sample([CARD], [tenant(1, CID_A, 300)], {})
    assert (own[(1, UUID)].util, own[(1, UUID)].util_absent, own[(1, UUID)].mem_used) == (None, SHARED_CARD, 700)


def test_a_tenant_with_no_process_on_a_shared_card_reads_idle(proc):
    nvml = fake_nvml(
        processes=[(SERVER, 30 * MIB), (101, 900 * MIB)],
        mps_clients=[(101, 900 * MIB)],
        samples=[(SERVER, 40, 5)],
        names=SERVER_NAME,
    )
    a, b = tenant(1, CID_A, 500), tenant(2, CID_B, 500)
    _, own = NvmlBackend([CARD], nvml=nvml, proc=proc).sample([CARD], [a, b], {})
    assert own[(1, UUID)].util is None
    assert (own[(2, UUID)].util, own[(2, UUID)].mem_used) == (0.0, 0), "nothing of it runs there: measured idle"


def test_a_host_process_that_is_not_an_mps_server_leaves_the_card_unshared(proc):
    nvml = fake_nvml(
        processes=[(301, 100 * MIB), (101, 900 * MIB)],
        samples=[(301, 50, 5), (101, 30, 5)],
        names={301: "/usr/bin/python3"},
    )
    _, own = NvmlBackend([CARD], nvml=nvml, proc=proc).sample([CARD], [tenant(1, CID_A, 1000)], {})
    assert own[(1, UUID)].util == pytest.approx(0.3) and own[(1, UUID)].util_absent is None


def test_a_process_list_the_driver_does_not_give_is_no_reading_not_idle(proc):
    nvml = fake_nvml(processes=[], samples=[])
    nvml.nvmlDeviceGetComputeRunningProcesses = nvml.nvmlDeviceGetMPSComputeRunningProcesses = lambda h: (
        _ for _ in ()
    ).throw(pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN))
    _, own = NvmlBackend([CARD], nvml=nvml, proc=proc).sample([CARD], [tenant(1, CID_A, 1000)], {})
    assert (own[(1, UUID)].util, own[(1, UUID)].util_absent, own[(1, UUID)].mem_used) == (None, NO_READING, None)
