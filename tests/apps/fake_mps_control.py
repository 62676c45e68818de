"""A stand-in for `nvidia-cuda-mps-control`, for tests without a GPU (test_mps_confine.py puts a
program of that name first on pilotd's PATH that runs this file).

Each run appends one JSON line to $FAKE_MPS_RECORD: its argv, pid, CUDA_MPS_PIPE_DIRECTORY,
CUDA_MPS_LOG_DIRECTORY and, as a client, what it read on stdin. Like the real one:
  -d        starts a control daemon in the background (the command returns at once): it writes
            nvidia-cuda-mps-control.pid in the pipe directory and a control.log in the log
            directory, and answers commands on a UNIX socket `control` in the pipe directory
            (`get_server_list`: no server; `quit`: it ends) until `quit`
  (none)    a client: sends each line of stdin to the daemon and prints the answers; without a
            daemon it says "Cannot find MPS control daemon process" and exits with status 1
Switches for the failure tests: FAKE_MPS_START_FAILS=1 (-d fails at once), FAKE_MPS_DIES=1 (the
daemon writes its pid file and exits, as one that cannot run).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

PIPE = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
LOG = os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
CONTROL = os.path.join(PIPE, "control")
PID_FILE = os.path.join(PIPE, "nvidia-cuda-mps-control.pid")


def record(**extra: object) -> None:
    path = os.environ.get("FAKE_MPS_RECORD")
    if not path:
        return
    line = {"argv": sys.argv[1:], "pid": os.getpid(), "pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
            "log": os.environ.get("CUDA_MPS_LOG_DIRECTORY"), "time": time.time(), **extra}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def daemon() -> None:
    """The background control daemon (the grandchild of `-d`)."""
    with open(PID_FILE, "w") as f:
        f.write(f"{os.getpid()}\n")
    with open(os.path.join(LOG, "control.log"), "a") as f:
        f.write(f"[fake] Control {os.getpid()} starting control daemon using socket {CONTROL}\n")
    record(event="daemon up")
    if os.environ.get("FAKE_MPS_DIES"):
        record(event="daemon died")
        with open(os.path.join(LOG, "control.log"), "a") as f:
            f.write("[fake] Control died: no GPU\n")
        os._exit(1)
    if os.path.exists(CONTROL):
        os.unlink(CONTROL)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(CONTROL)
    server.listen(16)
    while True:
        conn, _ = server.accept()
        with conn, conn.makefile("rw") as stream:
            for line in stream:
                command = line.strip()
                record(event="command", command=command)
                if command == "quit":
                    os.unlink(CONTROL)
                    os.unlink(PID_FILE)
                    record(event="daemon quit")
                    stream.write("\n")
                    stream.flush()
                    os._exit(0)
                stream.write("\n" if command == "get_server_list" else f"unknown {command}\n")
                stream.flush()


def start() -> int:
    if os.environ.get("FAKE_MPS_START_FAILS"):
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    if os.fork():
        return 0
    os.setsid()
    if os.fork():
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # let the caller's pipes close
        os.dup2(devnull, fd)
    daemon()
    return 0


def client() -> int:
    text = sys.stdin.read()
    record(stdin=text)
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(CONTROL)
    except OSError:
        print("Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    with conn, conn.makefile("rw") as stream:
        for line in text.splitlines():
            stream.write(line + "\n")
            stream.flush()
            sys.stdout.write(stream.readline())
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["-d"]:
        record()
        sys.exit(start())
    sys.exit(client())
