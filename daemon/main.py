"""`pilotd`: start the daemon in the foreground (systemd runs it the same way)."""

from __future__ import annotations

import logging
import signal
import sys

import click

from .protocol import socket_path
from .server import Daemon, DaemonError


def make_backend(name: str, sim_kernels: tuple[str, ...], devices: list[int] | None):
    if name == "sim":
        from .backend_sim import SimBackend
        from .sim_kernels import load_kernel_files

        return SimBackend(load_kernel_files(list(sim_kernels)))
    from .backend_cuda import CudaBackend

    return CudaBackend(devices)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--backend", type=click.Choice(["cuda", "sim"]), default="cuda", show_default=True,
              help="cuda: the real GPU; sim: CPU simulation for tests.")
@click.option("--socket", "socket_", metavar="PATH", envvar="PILOT_SOCKET",
              help="Main socket path [default: /run/pilot/pilot.sock for root, else "
                   "$XDG_RUNTIME_DIR/pilot/pilot.sock].")
@click.option("--vgpus-per-gpu", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option("--device", "devices", type=int, multiple=True, help="GPU ordinal to serve (repeatable).")
@click.option("--capacity", type=int, default=None,
              help="Bytes of device memory granted per GPU (default: the card's).")
@click.option("--sim-kernels", type=click.Path(exists=True, dir_okay=False), multiple=True,
              help="Python file of kernel emulations for --backend sim (repeatable).")
@click.option("--spin-us", type=click.IntRange(0, 10000), default=50, show_default=True,
              help="Microseconds a vGPU thread polls for the next call before it sleeps.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True)
def main(backend: str, socket_: str | None, vgpus_per_gpu: int, devices: tuple[int, ...],
         capacity: int | None, sim_kernels: tuple[str, ...], spin_us: int, log_level: str) -> None:
    """Serve CUDA programs run under libpilot.so."""
    logging.basicConfig(
        level=getattr(logging, log_level.upper()),
        format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    path = socket_ or socket_path(for_daemon=True)
    try:
        be = make_backend(backend, sim_kernels, list(devices) or None)
        daemon = Daemon(be, path, vgpus_per_gpu=vgpus_per_gpu,
                        devices=None if backend == "sim" or not devices else list(range(len(devices))),
                        capacity=capacity, spin_us=spin_us)
    except (DaemonError, ImportError, OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    except Exception as exc:  # a backend that cannot start (no driver, no GPU)
        raise click.ClickException(f"cannot start the {backend} backend: {exc}") from exc

    def stop(signum: int, frame: object) -> None:
        daemon.request_stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        daemon.run()
    except DaemonError as exc:
        raise click.ClickException(str(exc)) from exc


if __name__ == "__main__":
    main()
