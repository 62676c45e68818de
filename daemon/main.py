"""`pilotd`: start the daemon in the foreground (systemd runs it the same way, Type=notify).

Settings come from the TOML file (--config, default /etc/pilot/pilotd.toml when it exists), and
command-line options override it. A bad setting stops the start with one line naming it.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import time
from typing import Any

import click

from pilot import __version__
from pilot.daemon.config import DEFAULT_CONFIG_PATH, Config, ConfigError, load_config
from pilot.daemon.protocol import socket_path
from pilot.daemon.router import mps as mps_control
from pilot.daemon.router.recovery import Handover, exec_afresh, handover_from_environment
from pilot.daemon.router.server import Daemon, DaemonError
from pilot.daemon.scheduling.policy_host import PolicyStartError, load_policy
from pilot.daemon.telemetry.logs import setup_logging

log = logging.getLogger("pilot.main")
MAX_CONNECTIONS = 32


def make_backend(name: str, sim_kernels: tuple[str, ...], gpus: tuple[int, ...] | None,
                 sim_devices: int = 1, gpu_wait: str = "auto", mps: bool = False) -> Any:
    """`gpu_wait` (config `[daemon] gpu_wait`): how the driver makes pilotd's threads wait in a
    synchronization; the sim has no such threads and ignores it. `mps` (`[isolation] mps`): the
    CUDA backend must find its contexts to be MPS clients (router/mps.py); the sim has none."""
    if name == "sim":
        from pilot.daemon.backends.sim import SimBackend
        from pilot.daemon.sim_kernels import load_kernel_files

        return SimBackend(load_kernel_files(list(sim_kernels)), device_count=sim_devices)
    # Every tenant's streams live in pilotd's one context per GPU, and the driver maps a context's
    # streams onto CUDA_DEVICE_MAX_CONNECTIONS hardware queues (8 by default): streams sharing a
    # queue serialize, so independent tenants would wait for each other (natively and under MPS
    # each process has queues of its own). 32 is the most the driver takes; an operator's own
    # value wins. Read by the driver at cuInit, so it is set before the backend starts.
    # Not under MPS ([isolation] mps): there each client takes that many of the server's
    # connections (60 clients per GPU at MPS's default of 2, fewer with more each), and an
    # engine serves one tenant, like one native MPS client (its engines inherit this choice).
    if not mps:
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", str(MAX_CONNECTIONS))
    from pilot.daemon.backends.cuda import CudaBackend

    return CudaBackend(list(gpus) if gpus else None, gpu_wait=gpu_wait, mps=mps)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="pilotd", message="%(prog)s %(version)s")
@click.option("--config", "config_path", metavar="PATH",
              help="TOML settings [default: /etc/pilot/pilotd.toml if it exists].")
@click.option("--backend", type=click.Choice(["cuda", "sim"]),
              help="cuda (default): the GPUs; sim: CPU simulation for tests.")
@click.option("--socket", "socket_", metavar="PATH", envvar="PILOT_SOCKET",
              help="Main socket [default: /run/pilot/pilot.sock for root, else "
                   "$XDG_RUNTIME_DIR/pilot/pilot.sock].")
@click.option("--control-socket", metavar="PATH",
              help="pilotctl's socket [default: control.sock beside --socket].")
@click.option("--vgpus-per-gpu", type=click.IntRange(1, 64), help="vGPU threads started per GPU [2].")
@click.option("--max-vgpus-per-gpu", type=click.IntRange(1, 256),
              help="vGPU threads a GPU may grow to, one per session [32].")
@click.option("--device", "devices", type=int, multiple=True,
              help="GPU index to serve (repeatable) [default: all].")
@click.option("--capacity", metavar="SIZE",
              help="Device memory granted per GPU, e.g. 20GiB [default: the card's].")
@click.option("--enforce-capacity/--no-enforce-capacity", default=None,
              help="Keep managed memory resident on each GPU within its capacity (emulates a "
                   "smaller GPU; docs/POLICIES.md).")
@click.option("--managed-device-memory/--no-managed-device-memory", default=None,
              help="Serve cudaMalloc with managed memory, which the capacity enforcer and the "
                   "memory policies can move.")
@click.option("--state-dir", metavar="DIR", help="Where quotas persist.")
@click.option("--metrics-address", metavar="HOST:PORT", help='Prometheus exporter ("" disables).')
@click.option("--admin-group", metavar="GROUP", help="Group allowed to change quotas, kill, drain.")
@click.option("--sim-kernels", type=click.Path(exists=True, dir_okay=False), multiple=True,
              help="Python file of kernel emulations for --backend sim (repeatable).")
@click.option("--sim-devices", type=click.IntRange(1, 16),
              help="GPUs the sim backend presents [default: 1].")
@click.option("--spin-us", type=click.IntRange(0, 10000),
              help="Microseconds a vGPU thread polls for the next call before it sleeps.")
@click.option("--spinners", metavar="N|auto",
              help="pilotd threads that may spin at once waiting for a call or the GPU; the rest "
                   "sleep [0: no limit] (auto: a quarter of the cores).")
@click.option("--endpoint-spin", type=click.Choice(["auto", "always"]),
              help="Whether vGPU threads spin for the next call: auto (not while busy tenants x 2 "
                   "exceed the CPUs) or always [auto].")
@click.option("--gpu-wait", type=click.Choice(["auto", "spin", "yield", "blocking"]),
              help="How pilotd's threads wait for the GPU in a synchronization [auto].")
@click.option("--callback-timeout", metavar="DURATION",
              help="A host callback the program does not answer this long ends its session "
                   "[60s] (0: never).")
@click.option("--policy", metavar="NAME", help="Scheduling policy [default: none]; see pilotctl status.")
@click.option("--policy-plugin", "policy_plugins", metavar="FILE|MODULE", multiple=True,
              help="Python file or module that registers more policies (repeatable).")
@click.option("--policy-max-wait", metavar="DURATION",
              help="Longest a launch may wait for the policy, e.g. 30s (0: no limit).")
@click.option("--isolated-tenant", metavar="TENANT", hidden=True,
              help="Serve this tenant alone (an isolated tenant's pilotd, started by pilotd).")
@click.option("--without-mps", is_flag=True, hidden=True,
              help="[isolation] mps off: an isolated tenant's pilotd whose tenant's kernel "
                   "faulted under MPS (started by pilotd, without MPS's environment).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--log-format", type=click.Choice(["text", "json"]))
def main(config_path: str | None, backend: str | None, socket_: str | None, control_socket: str | None,
         vgpus_per_gpu: int | None, max_vgpus_per_gpu: int | None, devices: tuple[int, ...],
         capacity: str | None, enforce_capacity: bool | None, managed_device_memory: bool | None,
         state_dir: str | None, metrics_address: str | None, admin_group: str | None,
         sim_kernels: tuple[str, ...], sim_devices: int | None, spin_us: int | None,
         spinners: str | None, endpoint_spin: str | None,
         gpu_wait: str | None, callback_timeout: str | None, policy: str | None,
         policy_plugins: tuple[str, ...],
         policy_max_wait: str | None, isolated_tenant: str | None, without_mps: bool,
         log_level: str | None,
         log_format: str | None) -> None:
    """Serve CUDA programs run under libpilot.so."""
    try:
        overrides = {
            "backend": backend, "socket": socket_, "control_socket": control_socket,
            "vgpus_per_gpu": vgpus_per_gpu, "max_vgpus_per_gpu": max_vgpus_per_gpu,
            "gpus": tuple(devices) or None,
            "capacity": capacity,
            "enforce_capacity": enforce_capacity, "managed_device_memory": managed_device_memory,
            "state_dir": state_dir, "metrics_address": metrics_address,
            "admin_group": admin_group, "sim_kernels": tuple(sim_kernels) or None,
            "sim_devices": sim_devices,
            "spin_us": spin_us, "spinners": spinners, "endpoint_spin": endpoint_spin,
            "gpu_wait": gpu_wait,
            "log_level": log_level, "log_format": log_format,
            "policy": policy, "policy_plugins": tuple(policy_plugins) or None,
            "policy_max_wait": policy_max_wait, "callback_timeout": callback_timeout,
            "isolated_tenant": isolated_tenant, "isolation_mps": False if without_mps else None,
        }
        config = load_config(config_path, overrides)
    except (ConfigError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    setup_logging(config.log_level, config.log_format)
    # A crash in native code (the driver, a library, the C fast path) leaves every thread's
    # Python stack on stderr (the journal under systemd) instead of nothing.
    faulthandler.enable()
    sys.setswitchinterval(config.switch_interval)
    path = config.socket or socket_path(for_daemon=True)
    control_path = config.control_socket_path(path)
    try:
        policy = load_policy(config)  # before the backend: a wrong name stops the start at once
    except PolicyStartError as exc:
        raise click.ClickException(str(exc)) from exc
    # After a GPU fault the process before this one handed over its sockets and faults
    handover = handover_from_environment()
    if handover.exec_at:
        log.info("restarted after a GPU fault: %.3f s from the exec to here", time.time() - handover.exec_at)
    try:  # before the backend: CUDA reads the MPS settings at cuInit
        mps = mps_control.take_part(config, restarted=bool(handover.exec_at))
    except mps_control.MpsError as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        serve(config, config_path, overrides, path, control_path, policy, handover, mps)
    finally:  # not reached by a restart in place (an exec), which keeps the control daemon
        if mps is not None:
            mps.stop()


def serve(config: Config, config_path: str | None, overrides: dict[str, Any], path: str,
          control_path: str, policy: Any, handover: Handover,
          mps: mps_control.MpsControl | None) -> None:
    """Set up the backend and the daemon, and serve until stopped."""
    started = time.time()
    try:
        be = make_backend(config.backend, config.sim_kernels, config.gpus, config.sim_devices,
                          config.gpu_wait, config.isolation_mps)
        daemon = Daemon(be, config, path, control_path, policy, handover=handover)
        daemon.mps = mps
        if handover.exec_at:
            log.info("backend and daemon set up in %.3f s", time.time() - started)
        daemon.reread_config = lambda: load_config(config_path, overrides)  # SIGHUP
        daemon.restart = exec_afresh
    except (DaemonError, ImportError, OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    except Exception as exc:  # a backend that cannot start (no driver, no GPU)
        raise click.ClickException(f"cannot start the {config.backend} backend: {exc}") from exc

    def stop(signum: int, frame: object) -> None:
        daemon.request_stop()

    def reload(signum: int, frame: object) -> None:
        daemon.request_reload()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, reload)
    log.info("pilotd %s starting (pid %d, config %s)", daemon.version, os.getpid(),
             config_path or (DEFAULT_CONFIG_PATH if os.path.exists(DEFAULT_CONFIG_PATH) else "defaults"))
    try:
        daemon.run()
    except DaemonError as exc:
        raise click.ClickException(str(exc)) from exc
    if daemon.exit_status:
        sys.exit(daemon.exit_status)


if __name__ == "__main__":
    main()
