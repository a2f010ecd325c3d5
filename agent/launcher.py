"""Containers on the node's Docker engine, through the docker SDK.

``container_spec`` turns a placed workload into the arguments of
``containers.create`` (a pure function); the rest talk to Docker. Nothing here
may run inside a database transaction: callers in ``agent.actions`` commit
first and call these after.
"""

from __future__ import annotations

import functools
import io
import logging
import os
import tarfile
import time
from dataclasses import dataclass

import docker
import requests
from django.conf import settings

from agent import collector, diskio, disks, hostview, mps
from agent.labels import LABEL
from agent.sharedfs import user_dir_on_host
from core.errors import InvalidInput
from scheduler import envnames, registry, sharedfs
from scheduler.models import WorkloadKind
from scheduler.services.code import code_check

log = logging.getLogger(__name__)
VOLUME_IN_USE_WAIT_S = 10

SNAPSHOT_REPOSITORY = "gpucloud-snapshot"
# What root in a rented container keeps: enough to install packages and run
# services, nothing that reaches the host (no SYS_ADMIN, NET_ADMIN, SYS_PTRACE).
KEPT_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "NET_BIND_SERVICE"]
# What a training container needs of the NVIDIA driver (the toolkit's "driver capabilities"): compute (CUDA,
# OpenCL: libcuda and the PTX JIT) and utility (nvidia-smi, NVML). Not graphics or display (OpenGL, Vulkan,
# DRM device nodes) nor video (NVENC/NVDEC): less of the host's driver in a tenant's container. Said
# explicitly: unset, the toolkit gives utility alone, so CUDA would not load in an image that does not set it.
DRIVER_CAPABILITIES = ("compute", "utility")


@dataclass(frozen=True)
class CardShare:
    uuid: str
    milli: int
    memory_mb: int
    card_memory_mb: int = 0


@dataclass(frozen=True)
class Rendezvous:
    """Where a container stands in its work: single-node work is rank 0 of 1 on loopback; a gang's
    member is rank ``rank`` of ``len(hosts)`` nodes, and reaches rank 0 at ``master_addr``:``master_port``.
    On the fenced tenants' network every member has a fixed address of its own (``address``, chosen by
    its host before it starts: ``agent.gangs``) that every fellow member reaches on any port, and
    ``master_addr`` is rank 0's; elsewhere (an operator's own network mode) it is rank 0's host address."""

    rank: int = 0
    hosts: tuple[tuple[str, int], ...] = ()  # per rank: (host address, cards there); empty: one node
    master_addr: str = ""
    master_port: int = 29500
    address: str = ""  # this member's own fixed address on the tenants' network ("": Docker picks)
    host_address: str = ""  # this member's host's address

    @property
    def nnodes(self) -> int:
        return max(len(self.hosts), 1)


HOSTFILE = "/etc/gpucloud/hostfile"


# The interface of a container's one network, the tenants' (Docker names a container's first one eth0).
INTERFACE = "eth0"


def rendezvous_env(workload, rendezvous: Rendezvous, *, local_cards: int) -> dict[str, str]:
    """The contract torchrun, Lightning and DeepSpeed read, the same for every job and instance.

    Launcher inputs only, one process per card: WORLD_SIZE counts every card of the work, NNODES the
    nodes, NODE_RANK this node's place, NPROC_PER_NODE its cards (``torchrun --nnodes $NNODES --node-rank
    $NODE_RANK --nproc-per-node $NPROC_PER_NODE --master-addr $MASTER_ADDR --master-port $MASTER_PORT``;
    Lightning's own launcher reads NODE_RANK). Never what a launcher sets for each process it starts
    (RANK, LOCAL_RANK, GROUP_RANK, LOCAL_WORLD_SIZE, TORCHELASTIC_RUN_ID: ``envnames.LAUNCHED``): with
    LOCAL_RANK Lightning takes its processes for started already, with TORCHELASTIC_RUN_ID for torchrun's.
    AUTO_TMPDIR is the folder that survives preemption, stop and resume (the seed's Lightning template
    saves its checkpoints there). A gang's MASTER_ADDR is rank 0's address for every member, rank 0
    included; on the fenced network that is its container's, and GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME
    name the interface every member reaches the others on (gloo and NCCL bind and advertise its address)."""
    gang = is_member(workload, rendezvous)
    if workload.kind == WorkloadKind.JOB:
        keep = checkpoint_dir(workload)
    else:
        keep = settings.INSTANCE_DATA_PATH
    env = {
        "MASTER_ADDR": (rendezvous.master_addr if gang else "") or "127.0.0.1",
        "MASTER_PORT": str(rendezvous.master_port),
        "WORLD_SIZE": str(workload.gpu_count),
        "NODE_RANK": str(rendezvous.rank),
        "NNODES": str(rendezvous.nnodes),
        "NPROC_PER_NODE": str(local_cards),
        "GPUCLOUD_HOSTFILE": HOSTFILE,
        "AUTO_TMPDIR": keep,
    }
    if gang and settings.INSTANCE_NETWORK_MODE == "fenced":
        env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = INTERFACE
    if elastic_gang(workload):
        env.update(elastic_env(workload, rendezvous, local_cards=local_cards))
    return env


def elastic_gang(workload) -> bool:
    """Elastic work placed as a gang: its members may join and leave while it runs (``services.elastic``)."""
    return workload.elastic_min is not None and workload.is_gang


def is_member(workload, rendezvous: Rendezvous) -> bool:
    """Whether the container is a gang's member: of work on several nodes, or of an elastic gang (which may have
    one member now and more later: each has its fixed address on the tenants' network from the start)."""
    return rendezvous.nnodes > 1 or elastic_gang(workload)


# torchrun's elastic rendezvous keeps no state of its own between the rounds a member's joining or leaving
# starts: with the store shared between the rendezvous and the workers (torch's default since 2.4) a round
# after a scale-up never gets rank 0's address and every member waits for ever (measured with torch 2.13 on
# this machine; pytorch/pytorch#135712). Each round then takes a free port on rank 0's member for its workers'
# store, which the fence lets through (the gang's members reach each other on any port).
ELASTIC_STORE_NOT_SHARED = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
# Leaving members fail their fellows' collectives (gloo and NCCL see the peer gone) and each such failure
# counts against torchrun's restarts, as joins do not: enough for a long job's joins and leaves.
ELASTIC_MAX_RESTARTS = 100


def elastic_env(workload, rendezvous: Rendezvous, *, local_cards: int) -> dict[str, str]:
    """torchrun's own defaults (it reads ``PET_<OPTION>`` for each option not given on its command line) for
    an elastic gang: every member's ``torchrun train.py`` joins the job's c10d rendezvous, hosted by rank
    0's member (which the platform never removes while the job runs), with 1 to ``elastic_max`` members and
    this member's cards as its processes; a member that joins or leaves makes every torchrun restart its
    processes in a new world (``services.elastic``). ``PET_LOCAL_ADDR``: this member's address, which torchrun
    gives its fellows (by default its host name, which no other host resolves)."""
    master = rendezvous.master_addr or "127.0.0.1"
    local = rendezvous.address or rendezvous.host_address or master
    return {
        "PET_NNODES": f"1:{workload.elastic_max}",
        "PET_NPROC_PER_NODE": str(local_cards),
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": f"{master}:{rendezvous.master_port}",
        # One rendezvous a placement: a requeued job's members never meet a round of its last placement.
        "PET_RDZV_ID": f"{workload.uid}-{workload.preemptions}",
        "PET_RDZV_CONF": (
            f"is_host={'true' if rendezvous.rank == 0 else 'false'},last_call_timeout={settings.ELASTIC_LAST_CALL_S}"
        ),
        "PET_MAX_RESTARTS": str(ELASTIC_MAX_RESTARTS),
        "PET_LOCAL_ADDR": local,
        **ELASTIC_STORE_NOT_SHARED,
    }


def hostfile(workload, rendezvous: Rendezvous) -> bytes:
    """One line per node, rank 0 first: ``<host address> slots=<cards>`` (DeepSpeed's and MPI's format)."""
    hosts = rendezvous.hosts or (("127.0.0.1", workload.gpu_count),)
    return "".join(f"{address} slots={cards}\n" for address, cards in hosts).encode()


def checkpoint_dir(workload) -> str:
    """Where a job checkpoints (its AUTO_TMPDIR), as its container sees it: with the shared storage on, its
    folder there (``sharedfs.job_tmpdir``), which every host mounts, so it outlives the host the job ran
    on and a requeued job — a gang or one node's — resumes from it wherever it lands; without it (one host),
    its own volume on its node."""
    return sharedfs.job_tmpdir(workload.uid)


@functools.cache
def docker_client() -> docker.DockerClient:
    return docker.DockerClient(base_url=settings.DOCKER_BASE_URL, timeout=120)


@functools.cache
def engine_info() -> dict:
    """The engine's own description (data root, storage driver), read once."""
    return docker_client().info()


def docker_root() -> str:
    """The engine's data root (its layers and volumes), as the host sees it."""
    return engine_info()["DockerRootDir"]


def container_spec(
    workload,
    *,
    node,
    shares: list[CardShare],
    with_code: bool = False,
    rendezvous: Rendezvous | None = None,
    name: str | None = None,
) -> dict:
    """Arguments for ``containers.create`` for a placed workload (``with_code``: a job that came with its code,
    which runs in JOB_CODE_PATH; ``rendezvous``: a gang's member, named ``name`` on its node)."""
    rendezvous = rendezvous or Rendezvous()
    gang = is_member(workload, rendezvous)
    uuids = [s.uuid for s in shares]
    gpu_environment, device_requests = gpu_request(node, uuids)
    environment = {
        # The stored environment, less what the NVIDIA Container Toolkit or a fraction's MPS client reads:
        # refused at submission, dropped here from work stored before that rule (and what says a launcher
        # started its processes already, which the platform no longer sets either); the platform's own names
        # are set below, after it, so they win (scheduler/envnames.py).
        **envnames.launched_dropped(envnames.hook_safe(workload.env or {})),
        **gpu_environment,
        "GPUCLOUD_WORKLOAD_ID": str(workload.pk),
        "GPUCLOUD_GPU_SHARE": f"{workload.gpu_share:g}",
        "GPUCLOUD_DATA_DIR": settings.INSTANCE_DATA_PATH,
    }
    environment["GPUCLOUD_GPU_SIMULATED"] = "1" if node.simulated else "0"
    volumes = {workload.volume_name: {"bind": settings.INSTANCE_DATA_PATH, "mode": "rw"}}
    if sharedfs.enabled():
        # The owner's directory of the shared file storage (the same on every host), never the volume's root.
        volumes[user_dir_on_host(workload.owner_id)] = {"bind": settings.SHARED_FS_PATH, "mode": "rw"}
        environment["GPUCLOUD_SHARED_DIR"] = settings.SHARED_FS_PATH
    environment.update(rendezvous_env(workload, rendezvous, local_cards=len(shares) or workload.gpu_count))
    if workload.kind == WorkloadKind.JOB:
        # The job's own volume (its code, and its checkpoints where there is no shared storage: then it
        # resumes on its node); with the shared storage its checkpoints are there (``checkpoint_dir``).
        volumes[workload.volume_name] = {"bind": settings.JOB_CHECKPOINT_PATH, "mode": "rw"}
        environment.update(
            {"GPUCLOUD_CHECKPOINT_DIR": checkpoint_dir(workload), "GPUCLOUD_RESUME_COUNT": str(workload.preemptions)}
        )
    if with_code:
        environment["GPUCLOUD_CODE_DIR"] = settings.JOB_CODE_PATH
    # A fraction: MPS caps the compute share and pins the memory of the one visible card. Whole cards
    # say 100 % and their full memory: set every time, because a committed disk (a saved image, or a
    # snapshot when the cards change) keeps the environment of the container it came from.
    if shares:
        environment["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, workload.gpu_milli // 10))
        environment["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{i}={s.memory_mb}M" for i, s in enumerate(shares))
    # ...and the card's MPS server enforces it, where the tenant cannot unset it (agent/mps.py).
    mps_volumes, mps_environment = mps.client_spec(node, shares)
    volumes.update(mps_volumes)
    volumes.update(hostview.lxcfs_volumes())  # free and /proc show the container's own limits
    environment.update(mps_environment)
    host_cpus = os.cpu_count() or 1
    cpu_cores, memory_mb = workload.held_cpu_cores, workload.held_memory_mb
    if cpu_cores > host_cpus:
        if not (node.simulated and settings.NODE_OVERCOMMIT_SIMULATED):
            # Never quietly give less than was asked (and billed): Docker would cap the quota at the host.
            raise InvalidInput(f"asks for {cpu_cores} CPU cores; this host has {host_cpus}", field="cpu_cores")
        # A demo host that says it oversubscribes the machine (simulated cards, NODE_OVERCOMMIT_SIMULATED).
        log.info("%s asks for %s CPU cores; this simulated host oversubscribes its %s", workload, cpu_cores, host_cpus)
        cpu_cores = host_cpus
    spec = dict(
        image=workload.image_ref,
        command=workload.command or settings.INSTANCE_IDLE_COMMAND,
        name=name or workload.container_name,
        hostname=f"{workload.kind}-{workload.pk}" + (f"-r{rendezvous.rank}" if rendezvous.rank else ""),
        labels={
            f"{LABEL}.deployment": settings.DEPLOYMENT_ID,
            f"{LABEL}.workload": str(workload.pk),
            f"{LABEL}.uid": workload.uid,
            f"{LABEL}.kind": workload.kind,
            f"{LABEL}.owner": str(workload.owner_id),
            f"{LABEL}.node": node.name,
            f"{LABEL}.gpus": ",".join(uuids),
            f"{LABEL}.simulated": "1" if node.simulated else "0",
            f"{LABEL}.rank": str(rendezvous.rank),
        },
        environment=environment,
        nano_cpus=int(cpu_cores * 1e9),
        mem_limit=f"{memory_mb}m",
        pids_limit=settings.INSTANCE_PIDS_LIMIT,
        # PyTorch data loaders pass tensors through /dev/shm (Docker's default is 64 MB); it counts
        # against the memory limit, so it never exceeds half of it.
        shm_size=f"{min(settings.INSTANCE_SHM_MB, memory_mb // 2)}m",
        security_opt=["no-new-privileges"],
        cap_drop=["ALL"],
        cap_add=KEPT_CAPABILITIES,
        volumes=volumes,
        log_config=log_config(),
    )
    spec.update(diskio.io_options(workload.gpu_share, diskio.devices(docker_root())))
    if with_code:
        spec["working_dir"] = settings.JOB_CODE_PATH
    if settings.INSTANCE_NETWORK_MODE == "fenced":
        spec["network"] = settings.INSTANCE_NETWORK
    else:
        spec["network_mode"] = settings.INSTANCE_NETWORK_MODE
    if gang and rendezvous.address and settings.INSTANCE_NETWORK_MODE == "fenced":
        # The member's fixed address, known to its fellows (and their hosts' fences) before it starts.
        # Its fellows reach it there on any port: nothing of a gang is published on its host.
        version = docker.constants.DEFAULT_DOCKER_API_VERSION  # what the SDK checks options against
        endpoint = docker.types.EndpointConfig(version, ipv4_address=rendezvous.address)
        spec["networking_config"] = {settings.INSTANCE_NETWORK: endpoint}
    if (
        settings.INSTANCE_PUBLISH_PORTS
        and settings.INSTANCE_NETWORK_MODE != "none"
        and workload.kind != WorkloadKind.JOB
    ):
        # Each service's port to a host port Docker picks (read back after start: container_ports).
        bind = settings.INSTANCE_PORT_BIND_IP
        spec["ports"] = {f"{port}/tcp": (bind, None) for port in settings.INSTANCE_SERVICE_PORTS.values()}
    if device_requests:
        spec["device_requests"] = device_requests
    return spec


def gpu_request(node, uuids: list[str]) -> tuple[dict[str, str], list[docker.types.DeviceRequest]]:
    """(environment, device requests) that give a container exactly the cards ``uuids`` and the driver's
    DRIVER_CAPABILITIES, through the NVIDIA Container Toolkit.

    - The request names Docker's "nvidia" device driver, the cards by UUID (an index can name another card
      after a reboot or a driver update; the toolkit takes "GPU-..." UUIDs wherever it takes indexes) and the
      driver capabilities. Docker then adds the toolkit's prestart hook and appends
      ``NVIDIA_VISIBLE_DEVICES=<device_ids>`` and ``NVIDIA_DRIVER_CAPABILITIES=<the request's driver
      capabilities>`` to the container's environment (moby daemon/nvidia_linux.go, setNvidiaGPUs; Docker's
      "GPU access" page). Only where the node's engine has the toolkit (``nvidia_runtime``) and the cards are
      real: an engine without it refuses any GPU device request, and simulated cards are nothing of Docker's.
    - The environment says the same, so whichever copy a tool reads it reads the same cards, and an image's
      own ENV (CUDA images set ``NVIDIA_VISIBLE_DEVICES=all``; some set ``NVIDIA_DRIVER_CAPABILITIES=all``)
      never widens them where the toolkit is the engine's default runtime.
    - Without cards, "void": per the toolkit's docs (Specialized Configurations with Docker) the runtime then
      behaves as runc: no device, no driver file, no hook. "none" still mounts the driver and runs the hooks,
      and the toolkit's 1.18.2 release notes fix a bug where "none" made every card available.
    """
    environment = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(uuids) or "void",
        "NVIDIA_DRIVER_CAPABILITIES": ",".join(DRIVER_CAPABILITIES),
    }
    if not (uuids and node.nvidia_runtime and not node.simulated):
        return environment, []
    request = docker.types.DeviceRequest(
        driver="nvidia", device_ids=list(uuids), capabilities=[["gpu", *DRIVER_CAPABILITIES]]
    )
    return environment, [request]


def log_config() -> docker.types.LogConfig:
    """Docker's own log of a container: the collector (``collector.py``) reads it into the workload's log.

    The "local" driver, capped (two files of WORKLOG_DOCKER_MAX_MB / 2), in non-blocking mode: a
    container printing faster than the engine writes loses lines from its WORKLOG_DOCKER_BUFFER_MB
    buffer instead of stalling in write(2) or slowing the engine's other containers.
    """
    return docker.types.LogConfig(
        type="local",
        config={
            "max-size": f"{max(1, settings.WORKLOG_DOCKER_MAX_MB // 2)}m",
            "max-file": "2",
            "compress": "false",
            "mode": "non-blocking",
            "max-buffer-size": f"{settings.WORKLOG_DOCKER_BUFFER_MB}m",
        },
    )


def _find(name: str):
    try:
        return docker_client().containers.get(name)
    except docker.errors.NotFound:
        return None


def _ensure_volume(name: str, labels: dict, *, size_gb: int | None = None) -> None:
    """Create the Docker volume if missing; with ``size_gb`` (and INSTANCE_DISK_QUOTA) it is a fixed-size disk."""
    client = docker_client()
    options = disks.disk_ensure(name, size_gb) if size_gb and settings.INSTANCE_DISK_QUOTA else None
    try:
        client.volumes.get(name)
    except docker.errors.NotFound:
        client.volumes.create(name=name, labels=labels, driver="local", driver_opts=options or {})


def data_volume_ensure(workload, *, node_name: str) -> None:
    """The work's data disk on this engine (made if missing, ``disk_gb`` with INSTANCE_DISK_QUOTA)."""
    labels = {
        f"{LABEL}.deployment": settings.DEPLOYMENT_ID,
        f"{LABEL}.uid": workload.uid,
        f"{LABEL}.node": node_name,
        f"{LABEL}.disk_gb": str(workload.disk_gb),
    }
    _ensure_volume(workload.volume_name, labels, size_gb=workload.disk_gb)


def container_launch(workload, spec: dict, *, code: bytes | None = None, files: dict[str, bytes] | None = None) -> str:
    """Start the workload's container, reusing its disk if it has run before; returns its id.

    ``code`` (a job's .tar.gz) is extracted into JOB_CODE_PATH on its data disk after the
    container is created and before it starts, so the command finds it there; ``files``
    (absolute path -> content: the hostfile) are written into a new container the same way.

    A stopped container keeps its disk. If it now gets other cards than last
    time, or other mounts (one made before the shared storage moved to
    ``SHARED_FS_PATH``), its disk is committed to a snapshot image and a new
    container is created from it, so the user's files stay.
    """
    client = docker_client()
    existing = _find(spec["name"])
    if existing is not None and workload.kind == WorkloadKind.JOB:
        # A job starts afresh each time (its state is in the checkpoint volume, and its
        # environment says how often it was resumed).
        collector.settle(existing.name)
        container_gone(existing)
        hostview.pins.unpinned(existing.id)
        existing = None
    if existing is not None and _same_setup(existing, spec):
        if existing.status != "running":
            hostview.container_start(client, existing, spec, host_cpus=engine_info()["NCPU"])
        return existing.id
    if existing is not None:
        existing.stop(timeout=settings.INSTANCE_STOP_GRACE_S)
        snapshot = existing.commit(repository=SNAPSHOT_REPOSITORY, tag=workload.uid)
        existing.remove()
        hostview.pins.unpinned(existing.id)
        spec = {**spec, "image": snapshot.id}
    data_volume_ensure(workload, node_name=spec["labels"][f"{LABEL}.node"])
    _ensure_image(spec["image"])
    # The writable layer's size, where it can be set (on btrfs it counts the image too: disks.py).
    image_bytes = int(client.images.get(spec["image"]).attrs.get("Size") or 0)
    spec = {**spec, **disks.system_disk_options(engine_info()["Driver"], image_bytes)}
    container = hostview.container_create(client, spec, host_cpus=engine_info()["NCPU"])  # pinned to its own cores
    if code is not None:
        _code_extract(container, code)
    if files:
        _files_put(container, files)
    container.start()
    return container.id


def _files_put(container, files: dict[str, bytes]) -> None:
    """Write ``files`` (absolute path -> content, read-only for the tenant) into the created container."""
    if not container.put_archive("/", _archive(files)):
        raise RuntimeError("Docker did not take the platform's files")


def _archive(files: dict[str, bytes], *, folders: tuple[str, ...] = ()) -> bytes:
    """A tar to put at the container's root: ``files`` (absolute path -> content, read-only for the tenant)
    with every folder above them, and ``folders`` themselves (folders 0755)."""
    parents = {os.path.dirname(path).strip("/") for path in files}
    above = {"/".join(p.split("/")[: i + 1]) for p in parents if p for i in range(p.count("/") + 1)}
    every = sorted(above | {folder.strip("/") for folder in folders})
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in every:
            entry = tarfile.TarInfo(name)
            entry.type, entry.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(entry)
        for path, content in files.items():
            entry = tarfile.TarInfo(path.strip("/"))
            entry.size, entry.mode = len(content), 0o444
            tar.addfile(entry, io.BytesIO(content))
    return buffer.getvalue()


def _code_extract(container, archive: bytes) -> None:
    """Extract the .tar.gz ``archive`` into JOB_CODE_PATH of the created (not yet started) container.

    Docker extracts it inside the container's filesystem (the data volume is mounted for
    the copy), so a member cannot land on the host whatever its name. Docker expands it outside the tenant's
    cgroup: it is checked again first (``code_check``: its expanded size), for an archive stored before that check."""
    code_check(archive)
    folder = _archive({}, folders=(settings.JOB_CODE_PATH,))
    if not (container.put_archive("/", folder) and container.put_archive(settings.JOB_CODE_PATH, archive)):
        raise RuntimeError("Docker did not take the job's code")


def _same_setup(container, spec: dict) -> bool:
    """The container has the spec's cards and mounts (volume name or bind source -> path), so it is reused."""
    if container.labels.get(f"{LABEL}.gpus") != spec["labels"][f"{LABEL}.gpus"]:
        return False
    mounts = container.attrs.get("Mounts") or []
    have = {(m.get("Name") if m.get("Type") == "volume" else m.get("Source"), m.get("Destination")) for m in mounts}
    return have == {(source, bind["bind"]) for source, bind in spec["volumes"].items()}


def _ensure_image(ref: str) -> None:
    """Pull ``ref`` the first time this host uses it (from the platform's registry, with its credentials)."""
    try:
        docker_client().images.get(ref)
    except docker.errors.ImageNotFound:
        image_pull(ref)


def image_missing(workload) -> bool:
    """Whether launching the work needs its image pulled first: no container of it to start again (an
    instance's disk; a job starts afresh each time) and no ``image_ref`` on this engine."""
    if workload.kind != WorkloadKind.JOB and _find(workload.container_name) is not None:
        return False
    try:
        docker_client().images.get(workload.image_ref)
    except docker.errors.ImageNotFound:
        return True
    return False


def image_pull(ref: str) -> None:
    """Pull ``ref`` into this host's engine; RegistryError says which image, from where, and why not."""
    name = registry.image_name(ref)
    source = f" from the registry {name.registry}" if name.registry else ""
    _transfer(docker_client().api.pull, name, f"cannot pull image {ref}{source}")


def image_push(ref: str) -> None:
    """Push ``ref`` (which names a registry) from this host's engine; RegistryError says why not."""
    name = registry.image_name(ref)
    _transfer(docker_client().api.push, name, f"cannot push image {ref} to the registry {name.registry}")


class _EngineSaid(Exception):
    """An error the engine reported inside a pull's or push's progress stream (its HTTP status was 200)."""


def _transfer(call, name: registry.ImageName, failure: str) -> None:
    """The engine's pull or push of ``name``, with the registry's credentials, followed to its end."""
    credentials = registry.credentials(name.registry)
    try:
        for message in call(name.path, tag=name.tag, stream=True, decode=True, auth_config=credentials):
            if "error" in message:
                raise _EngineSaid(message["error"])
    except (docker.errors.APIError, requests.RequestException, _EngineSaid) as exc:
        raise registry.RegistryError(f"{failure}: {_why(exc)}") from exc


def _why(exc: Exception) -> str:
    text = getattr(exc, "explanation", None) or str(exc)
    return (str(text).splitlines() or [type(exc).__name__])[0][:160]


def container_ports(name: str) -> dict[str, int]:
    """Published ports of a running container: container port -> host port ({} when none)."""
    container = _find(name)
    if container is None:
        return {}
    container.reload()
    published = {}
    for key, bindings in (container.ports or {}).items():
        if bindings:
            published[key.split("/")[0]] = int(bindings[0]["HostPort"])
    return published


def container_stop(name: str, *, grace_s: int) -> int | None:
    """SIGTERM, then SIGKILL after ``grace_s``; returns the exit code, None if there is no container."""
    container = _find(name)
    if container is None:
        return None
    try:
        container.stop(timeout=grace_s)
        container.reload()
    except docker.errors.NotFound:  # removed meanwhile (a concurrent reconcile)
        return None
    finally:
        hostview.pins.unpinned(container.id)  # stopped, or gone (an error: the next reconcile reads it again)
    return container.attrs["State"]["ExitCode"]


def container_logs_tail(name: str) -> str:
    """The last JOB_LOG_TAIL_BYTES of the container's output ("" if it is gone)."""
    container = _find(name)
    if container is None:
        return ""
    return container.logs(tail=2000)[-settings.JOB_LOG_TAIL_BYTES :].decode(errors="replace")


def container_delete(name: str) -> None:
    """Remove the container only (its volumes stay), once its output is in the workload's log. Already
    gone, or going, is fine."""
    container = _find(name)
    if container is None:
        return
    collector.settle(name)
    try:
        container_gone(container)
    finally:
        hostview.pins.unpinned(container.id)


def container_gone(container) -> None:
    """Remove ``container`` (force); gone already is fine. Where another caller is removing it (two reconciles,
    or a relaunch meeting a cleanup: Docker's 409 "removal of container ... is already in progress"), wait until
    it is gone, so that its name is free when this returns (a job's relaunch creates a container of that name)."""
    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        return
    except docker.errors.APIError as exc:
        if exc.status_code != 409:
            raise
        try:
            container.wait(condition="removed", timeout=settings.INSTANCE_STOP_GRACE_S + 30)
        except docker.errors.NotFound:
            pass  # gone before the wait began


def volume_delete(name: str) -> None:
    """Delete a data volume, and first the relay's helpers that may hold it (an ended job's disk read through one
    just before its release: agent/relay/files.py). A helper Docker is still removing is not listed but holds the
    volume a moment longer ("volume is in use", 409): asked again for up to VOLUME_IN_USE_WAIT_S."""
    client = docker_client()
    deadline = time.monotonic() + VOLUME_IN_USE_WAIT_S
    while True:
        helpers = client.containers.list(
            all=True, filters={"label": f"{LABEL}.files-helper={name}"}, ignore_removed=True
        )
        for helper in helpers:
            container_gone(helper)
        try:
            client.volumes.get(name).remove(force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
            continue
        break
    disks.disk_delete(name)


def container_restart(name: str, *, grace_s: int) -> bool:
    container = _find(name)
    if container is None:
        return False
    container.restart(timeout=grace_s)
    return True


def container_commit(workload, ref: str) -> int:
    """Commit the (stopped) container's filesystem as image ``ref`` on this node; returns its size in bytes.

    The data volume is not part of it (volumes never are), as on AutoDL: a saved image
    holds the system disk. The container's settings that the platform sets at each
    launch (cards, share, labels) are set again by the next launch.
    """
    container = _find(workload.container_name)
    if container is None:
        raise InvalidInput("the instance's disk is gone from its node", field="instance")
    repository, _, tag = ref.rpartition(":")
    image = container.commit(
        repository=repository, tag=tag, message=f"saved from {workload.kind} {workload.uid}", pause=True
    )
    return int(image.attrs.get("Size") or 0)


def image_remove(ref: str) -> None:
    """Remove an image from this node's engine; already gone is fine."""
    try:
        docker_client().images.remove(ref, force=True)
    except docker.errors.ImageNotFound:
        pass


def container_remove(workload) -> None:
    """Delete the container, its data volume and any disk snapshot (not the user's shared storage)."""
    container_delete(workload.container_name)
    volume_delete(workload.volume_name)
    image_remove(f"{SNAPSHOT_REPOSITORY}:{workload.uid}")


@dataclass(frozen=True)
class ContainerState:
    id: str
    uid: str
    name: str
    running: bool
    exit_code: int | None
    oom_killed: bool
    kind: str = ""
    workload_id: int | None = None
    cores: tuple[int, ...] = ()  # the cores it is pinned to, while it holds them (hostview.LIVE)
    finished_at: float | None = None  # when it last ended (Docker's State.FinishedAt), a Unix time on this host


def finished_at_of(state: dict) -> float | None:
    """Docker's ``State.FinishedAt`` as a Unix time; None if it never ended ("0001-01-01T00:00:00Z", before 1970)
    or is not a Docker time."""
    ns = collector.docker_time_ns(state.get("FinishedAt") or "")
    return ns / 10**9 if ns > 0 else None


def _state(c) -> ContainerState:
    state = c.attrs.get("State", {})
    workload = c.labels.get(f"{LABEL}.workload", "")
    cpuset = hostview.cpuset_of(c.attrs) if c.status in hostview.LIVE else ""
    return ContainerState(
        c.id,
        c.labels.get(f"{LABEL}.uid", ""),
        c.name,
        c.status == "running",
        state.get("ExitCode"),
        bool(state.get("OOMKilled")),
        kind=c.labels.get(f"{LABEL}.kind", ""),
        workload_id=int(workload) if workload.isdigit() else None,
        cores=tuple(hostview.cpu_list(cpuset)),
        finished_at=None if c.status == "running" else finished_at_of(state),
    )


def containers_on_node(node_name: str) -> dict[str, ContainerState]:
    """Every container of this deployment that Docker has for this node, by workload uid."""
    labels = [f"{LABEL}.node={node_name}", f"{LABEL}.deployment={settings.DEPLOYMENT_ID}"]
    # One removed between Docker's list and its inspect of it is left out, not an error.
    containers = docker_client().containers.list(all=True, filters={"label": labels}, ignore_removed=True)
    return {state.uid: state for state in map(_state, containers)}


def containers_of(uid: str) -> list[ContainerState]:
    """This engine's containers of one workload (a gang's members of earlier placements included)."""
    labels = [f"{LABEL}.uid={uid}", f"{LABEL}.deployment={settings.DEPLOYMENT_ID}"]
    containers = docker_client().containers.list(all=True, filters={"label": labels}, ignore_removed=True)
    return [_state(c) for c in containers]


def network_addresses() -> set[str]:
    """The addresses the tenants' network has given to containers now (running ones: a stopped container's
    goes back to Docker)."""
    try:
        network = docker_client().networks.get(settings.INSTANCE_NETWORK)
    except docker.errors.NotFound:
        return set()
    attached = (network.attrs.get("Containers") or {}).values()
    return {c["IPv4Address"].split("/")[0] for c in attached if c.get("IPv4Address")}


def container_address(name: str) -> str:
    """The running container's address on the tenants' network ("" without one: network mode none)."""
    container = _find(name)
    if container is None:
        return ""
    networks = container.attrs.get("NetworkSettings", {}).get("Networks") or {}
    return (networks.get(settings.INSTANCE_NETWORK) or {}).get("IPAddress") or ""


def container_state(name: str) -> ContainerState | None:
    """One container's state, read now (None when Docker has no such container)."""
    container = _find(name)
    return None if container is None else _state(container)


def volumes_on_node(node_name: str) -> dict[str, str]:
    """Data volumes of this deployment's work on this node, by workload uid -> volume name."""
    labels = [f"{LABEL}.node={node_name}", f"{LABEL}.deployment={settings.DEPLOYMENT_ID}"]
    return {v.attrs["Labels"][f"{LABEL}.uid"]: v.name for v in docker_client().volumes.list(filters={"label": labels})}


def docker_version() -> str:
    return docker_client().version().get("Version", "")
