"""Run this host's node agent: register its cards, heartbeat, serve queue node.<name> and its relay, collect logs."""

import gc
import logging
import os
import signal
import socket
import threading
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import InterfaceError, OperationalError, connection

from agent import hostservices, launcher, mps
from agent.actions import agent_register
from agent.celery import app
from agent.collector import Collector
from agent.iptables import IptablesError
from agent.mps_watch import MpsWatch
from agent.network import fence_forever, fence_install
from agent.reconcile import agent_reconcile, heartbeat_forever, watch_container_exits
from agent.relay.server import RelayServer
from agent.selffence import SelfFence
from agent.sharedfs import mount_ensure
from agent.slowworker import SlowWorker, worker_args
from agent.telemetry.sampler import sampler_for
from core.clock import agent_clock
from core.errors import ServiceError
from scheduler import sharedfs

log = logging.getLogger(__name__)


def agent_start(name: str, relay_url: str, *, relay_tls_sha256: str = "", wait=time.sleep):
    """Fence the host, mount the shared storage, register: the node and where the storage is mounted.

    A host with real cards and an NVIDIA Container Toolkit older than 1.17.8, or one whose version cannot be
    read, does not register: ToolkitError (a ServiceError), and the command exits naming the version it found
    and the one needed (agent/toolkit.py says why the agent stops rather than fails each launch).

    While the control plane's database cannot be reached (it is starting too, or a moment away), the
    whole start is tried again — each step is idempotent — for ``NODE_START_PATIENCE_S``, then the agent
    gives up saying why, instead of dying at the first refused connection.
    """
    waited, delay = 0.0, 1.0
    while True:
        try:
            # Fence first: whatever this host runs that the database no longer assigns to it
            # (work lost or released while the agent was away) stops before it takes new work.
            agent_reconcile(name)
            if settings.INSTANCE_NETWORK_MODE == "fenced":
                fence_install()  # tenants' network fenced off before any of them runs here
            # The users' shared storage mounted before any work is placed here (it says why it cannot be).
            shared = mount_ensure() if sharedfs.enabled() else None
            node = agent_register(name, relay_url=relay_url, relay_tls_sha256=relay_tls_sha256)
            agent_clock.measure()
            return node, shared
        except (OperationalError, InterfaceError) as exc:
            connection.close()  # a broken connection is not reused
            if waited + delay > settings.NODE_START_PATIENCE_S:
                raise CommandError(
                    f"the control plane's database cannot be reached (given up after waiting {waited:.0f} s "
                    f"between tries): {exc}"
                ) from exc
            log.warning("the control plane's database cannot be reached (%s): trying again in %.0f s", exc, delay)
            wait(delay)
            waited += delay
            delay = min(delay * 2, 15.0)


class Command(BaseCommand):
    help = (
        "Run the node agent for this GPU host (a Celery worker on queue node.<name>, and one of worker "
        "processes on node.<name>.slow)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--name", default=settings.NODE_NAME or socket.gethostname().split(".")[0])
        parser.add_argument("--concurrency", type=int, default=2)
        parser.add_argument(
            "--slow-concurrency",
            type=int,
            default=settings.NODE_SLOW_CONCURRENCY,
            help="Worker processes of the slow queue node.<name>.slow (image pulls and commits, disks, moves).",
        )

    def handle(self, *args, name, concurrency, slow_concurrency, **options):
        # The terminal and files of this host's containers, for the web tier (which has no Docker).
        relay = RelayServer(name, api=launcher.docker_client().api)
        try:
            relay_url = relay.start()
        except OSError as exc:  # the port is taken, or the address is not this host's
            raise CommandError(f"the relay cannot listen on {relay.host}:{relay.port}: {exc}") from exc
        try:
            node, shared = agent_start(name, relay_url, relay_tls_sha256=relay.tls_sha256)
        except ServiceError as exc:
            raise CommandError(exc.message) from exc
        except IptablesError as exc:
            raise CommandError(f"the tenant network fence could not be installed: {exc}") from exc
        kind = "SIMULATED" if node.simulated else "NVML"
        cards = ", ".join(f"{g.index}:{g.model}" for g in node.gpus.all())
        host_cpus = os.cpu_count() or 1
        cpus = f"{node.cpu_cores} CPUs" + (
            f" (oversubscribing this machine's {host_cpus}: simulated cards)" if node.cpu_cores > host_cpus else ""
        )
        self.stdout.write(f"node {node.name}: {kind} GPUs [{cards}], {cpus}, queue {node.queue}")
        self.stdout.write(f"relay at {node.relay_url}")
        where = settings.SHARED_FS_PATH
        if shared:
            self.stdout.write(f"shared storage: JuiceFS {settings.SHARED_FS_NAME} at {shared}, in instances at {where}")
        else:
            self.stdout.write(f"shared storage: off (SHARED_FS_META is empty): instances get no {where}")
        stop = threading.Event()
        self_fence = SelfFence(node.name, agent_clock)  # its jobs stopped if it loses the control plane
        threading.Thread(
            target=heartbeat_forever,
            args=(node.name, node.epoch, stop),
            kwargs={
                "fence": self_fence,
                "clock": agent_clock,
                "on_superseded": lambda: os.kill(os.getpid(), signal.SIGTERM),
            },
            name="heartbeat",
            daemon=True,
        ).start()
        threading.Thread(target=self_fence.watch_forever, args=(stop,), name="self-fence", daemon=True).start()
        try:
            sampler = sampler_for(node, launcher.docker_client(), clock=agent_clock.time)
        except Exception:  # NVML gone since registration: the node still runs work, without live stats
            self.stderr.write("GPU sampling could not start; this node runs without live stats (see the log)")
            log.exception("GPU sampler on %s", node.name)
        else:
            threading.Thread(target=sampler.run_forever, args=(stop,), name="gpu-sampler", daemon=True).start()
        threading.Thread(target=watch_container_exits, args=(node.name, stop), daemon=True).start()
        if mps.enabled(node):  # one CUDA process per fractional container, every shared card's server up
            watch = MpsWatch(hostservices.mps_host())
            threading.Thread(
                target=watch.run_forever, args=(stop, settings.MPS_WATCH_S), name="mps-watch", daemon=True
            ).start()
        # Every container's output into its workload's log here (read through the relay).
        collector = Collector(node.name, launcher.docker_client().api).start()
        if settings.INSTANCE_NETWORK_MODE == "fenced":
            threading.Thread(target=fence_forever, args=(stop,), name="fence-check", daemon=True).start()
        # Slow operations on worker processes of their own, killed at their time limits (slowworker.py).
        slow = SlowWorker(node.name, concurrency=max(1, slow_concurrency))
        threading.Thread(target=slow.run_forever, args=(stop,), name="slow-queue", daemon=True).start()
        self.stdout.write(f"slow queue {node.slow_queue}: {max(1, slow_concurrency)} worker processes")
        # Start-up's objects live as long as the agent: kept out of the collector, whose full passes over
        # them stalled the relay's terminals by 80-280 ms on a busy host.
        gc.freeze()
        try:
            app.worker_main(
                worker_args(queue=node.queue, name=f"{node.name}@%h", pool="threads", concurrency=concurrency)
            )
        finally:
            stop.set()
            slow.stop()
            collector.stop()
            relay.stop()
