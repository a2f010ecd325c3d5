"""The NVML backend with NVML-shaped data: real pynvml structs, a /proc with real cgroup lines."""

import types

import pynvml
import pytest

from scheduler.telemetry.documents import Card, Tenant, TenantShare
from scheduler.telemetry.nvml import NvmlBackend

UUID = "GPU-8f1c0000-0000-0000-0000-000000000001"
CID_A = "a" * 64
CID_B = "b" * 64
MIB = 1024 * 1024


def fake_nvml(*, processes, samples, fan_supported=False):
    """pynvml's constants and errors, with the device calls answering from the given structs."""

    def process(pid, memory):
        info = pynvml.c_nvmlProcessInfo_v3_t()
        info.pid, info.usedGpuMemory = pid, memory
        return info

    def sample(pid, sm, ts):
        s = pynvml.c_nvmlProcessUtilizationSample_t()
        s.pid, s.smUtil, s.memUtil, s.timeStamp = pid, sm, 0, ts
        return s

    def not_supported(*args):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    rates = pynvml.c_nvmlUtilization_t()
    rates.gpu, rates.memory = 83, 41
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
