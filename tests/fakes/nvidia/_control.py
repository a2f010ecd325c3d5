"""Fake ``nvidia-cuda-mps-control``'s command line: options, usage, and the front-end that sends commands
(standard input, one a line) to the daemon of ``CUDA_MPS_PIPE_DIRECTORY``. The daemon itself is
``_daemon.py``, loaded only for ``-d`` / ``-f`` (this part runs on every command, so it imports little).
See the package docstring for where each answer comes from.
"""

from __future__ import annotations

import json
import os
import socket
import sys

# run2's ``card`` step: ``nvidia-cuda-mps-control -h`` on r580.159.04, whole.
USAGE = """CUDA MPS Control for Linux/Unix/QNX.
Copyright (C) 2003 - 2025 NVIDIA Corporation.

  This program allows multiple CUDA processes to share a single GPU context. For information on how to use the CUDA MPS, see the nvidia-cuda-mps-control manual page.

nvidia-cuda-mps-control [options] [command]
OPTIONS:
  -h,--help                Print this message
  -d,--daemon              Setup the daemon in the background
  -f,--forground           Setup the daemon in the foreground
  -M,--multiuser-server    Enable multi-user mode
  -q,--ready-devices      Prepare the daemon to query devices on startup

COMMAND:
  start_server -uid <user id>
                       Start a new instance of nvidia-cuda-mps-server with the given user ID
  quit
                       Terminate the controller
  get_server_list
                       Print out a list of servers
  get_server_status <PID>
                       Print out the status of the server
  get_client_list <PID>
                       List the client applications connected to the server
  get_device_client_list [<PID>]
                       List the devices and their client applications
  ps [-p PID]
                       Report a snapshot of the current client processes
  set_default_active_thread_percentage <percentage>
                       Set default active thread percentage for upcoming servers
  get_default_active_thread_percentage
                       Query the current default available thread percentage
  set_active_thread_percentage <PID> <percentage>
                       Override the active thread percentage of the MPS server
  get_active_thread_percentage <PID>
                       Query the current active thread percentage of the MPS server
  set_default_device_pinned_mem_limit <dev> <value>
                       Set default device pinned memory for upcoming servers
  get_default_device_pinned_mem_limit <dev>
                       Query the current default pinned memory limit for the device
  set_device_pinned_mem_limit <PID> <dev> <value>
                       Override the device pinned memory limit for MPS servers
  get_device_pinned_mem_limit <PID> <dev>
                       Query the current device pinned memory limit of the MPS server for the device
  set_default_client_priority <priority>
                       Sets default client priority for incoming clients
  get_default_client_priority
                       Query the current priority value that will be used for new clients
  terminate_client <server PID> <client PID>
                       Terminate all the outstanding GPU work of the MPS client process running on the MPS server
  device_query [<PID>] [--csv]
                       Enumerate all usable devices"""  # noqa: E501

NO_DAEMON = "Cannot find MPS control daemon process"  # a string of the r535 binary; the man page: status 1
ERR_CONNECT = "MPS client failed to connect to the MPS control daemon or the MPS server"  # CUDA's 805, run4
PIPE_DEFAULT, LOG_DEFAULT = "/tmp/nvidia-mps", "/var/log/nvidia-mps"


def pipe_directory() -> str:
    return os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or PIPE_DEFAULT


def log_directory() -> str:
    return os.environ.get("CUDA_MPS_LOG_DIRECTORY") or LOG_DEFAULT


def send(sock: socket.socket, message: dict) -> bool:
    try:
        sock.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        return False
    return True


def connect(path: str) -> socket.socket:
    """A unix socket at ``path``, even one past the 107 bytes a socket address holds (pytest's temporary
    directories): through ``/proc/self/fd`` of its directory."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if len(path) < 100:
        try:
            sock.connect(path)
        except OSError:
            sock.close()
            raise
        return sock
    fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        sock.connect(f"/proc/self/fd/{fd}/{os.path.basename(path)}")
    except OSError:
        sock.close()
        raise
    finally:
        os.close(fd)
    return sock


def front_end(commands: list[str]) -> int:
    """Sends each command to the daemon of ``CUDA_MPS_PIPE_DIRECTORY`` and prints its answer. Through
    ``control_privileged`` where this caller may connect to it (root, or the daemon's own user: the socket
    is 0755), else through ``control``. Status 0 whenever the daemon answered, refused or not."""
    pipe = pipe_directory()
    sock = None
    for name in ("control_privileged", "control"):
        try:
            sock = connect(os.path.join(pipe, name))
            break
        except OSError:
            continue
    if sock is None:
        print(NO_DAEMON)
        return 1
    with sock, sock.makefile("rb") as replies:
        send(sock, {"hello": "ui"})
        for command in commands:
            command = command.strip()
            if not command:
                continue
            if not send(sock, {"command": command}):
                return 1
            line = replies.readline()
            if not line:
                return 1
            answer = json.loads(line)
            if answer["out"]:
                print(answer["out"], flush=True)
            if answer.get("closing"):
                replies.read()  # quit returns once the daemon is gone
                return int(answer.get("status", 0))
    return 0


def main(argv: list[str]) -> int:
    daemon = foreground = multiuser = False
    words: list[str] = []
    for arg in argv:
        if words:
            words.append(arg)
        elif arg in ("-h", "--help"):
            print(USAGE)
            return 0
        elif arg in ("-d", "--daemon"):
            daemon = True
        elif arg in ("-f", "--forground"):
            foreground = True
        elif arg in ("-M", "--multiuser-server"):
            multiuser = True
        elif arg in ("-q", "--ready-devices"):
            pass
        elif arg.startswith("-"):
            print(USAGE)  # measured: ``-p 3 -a <toml>`` printed this and exited 0, starting nothing
            return 0
        else:
            words.append(arg)
    if daemon or foreground:
        from _daemon import start

        return start(multiuser, foreground and not daemon)
    if words:
        return front_end([" ".join(words)])
    return front_end(sys.stdin.read().splitlines())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
