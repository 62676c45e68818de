"""pilotd's configuration: one TOML file, command-line overrides, and validation up front.

An operator edits `/etc/pilot/pilotd.toml` (`DEFAULT_CONFIG_PATH`); a mistake must stop the
daemon at start with a message naming the file and the dotted key, never be ignored or surface
as a strange failure later. So unknown sections and keys are errors (with a difflib suggestion),
and every value is converted and checked here. Layout (deploy/pilotd.toml documents each key):

    [daemon]
    backend = "cuda"               # "cuda" | "sim"
    socket = "/run/pilot/pilot.sock"   # default: the usual socket rule (root / per user)
    control_socket = "..."         # default: control.sock next to the main socket
    vgpus_per_gpu = 2              # 1..64: vGPU threads started per GPU
    max_vgpus_per_gpu = 32         # 1..256: more are started as sessions come (one each), up to this
    gpus = "all"                   # or a list of GPU indexes: [0, 1]
    spin_us = 50                   # 0..10000
    spinners = 0                   # threads spinning at once: 0 (no limit) | N | auto (cores/4)
    endpoint_spin = "auto"         # vGPU threads poll for calls: auto (not while 2 x busy > CPUs) | always
    gpu_wait = "auto"              # how pilotd's threads wait for the GPU: auto | spin | yield | blocking
    callback_timeout = "60s"       # a host callback unanswered this long ends its session; 0: never
    callback_hold_total = "10m"    # a session's callbacks may hold its stream this long in all; 0: no limit
    vgpus_per_tenant = 0           # vGPU threads of a GPU one tenant's sessions may hold; 0: a fair share
    switch_interval = "500us"      # Python thread switch interval (a busy vGPU thread vs the rest)
    fault_recovery = "restart"     # after a context-fatal GPU fault: "restart" in place | "exit"
    fault_poll_interval = "20ms"   # how often each GPU's context is checked for a fault; 0: never
    fast_launch = true             # plain launches go on their stream in C, without Python
    staging_spares = 1             # 0..16: staging areas of each size pinned ahead (16 + 2 MiB each)
    device_output = true           # kernels' printf output goes back to the program (one tenant)
    state_dir = "/var/lib/pilot"   # default: /var/lib/pilot (root), else $XDG_STATE_HOME/pilot
    admin_group = "pilot-admin"
    log_level = "info"             # debug | info | warning | error
    log_format = "text"            # text | json
    sim_kernels = []               # Python files of kernel emulations (backend "sim")
    sim_devices = 1                # GPUs the sim backend presents, 1..16
    [gpu]
    capacity = "70GiB"             # bytes granted per GPU (default: the card's memory)
    enforce_capacity = true        # keep managed memory resident on the GPU within the capacity
    managed_limit = "80GiB"        # managed bytes granted per GPU when enforcing (default: the card's)
    managed_device_memory = true   # serve cudaMalloc with managed memory (movable by the policies)
    [gpu.capacity_per_gpu]
    "0" = "40GiB"                  # keys are GPU indexes; they override gpu.capacity
    [policy]
    name = "none"                  # a registered policy (pilot.policies; `pilotctl status` lists them)
    max_wait = "30s"               # longest a launch may wait for the policy; 0 = no limit
    plugins = []                   # Python files or modules that register more policies
    [policy.<name>]                # that policy's knobs (validated by the policy)
    [pinned]
    limit = "64GiB"                # pinned host memory over every tenant (default: half the RAM)
    limit_per_tenant = "8GiB"      # per tenant (default: tenant_fraction of the limit)
    tenant_fraction = 0.25         # a tenant's default pinned limit, as a fraction of `limit`
    [limits]
    sessions_per_uid = 128         # live sessions one user may hold
    connections = 16384            # connections to pilotd's sockets at once (all users)
    connections_per_uid = 320      # connections one user may hold on each socket
    max_frame = "64KiB"            # largest frame before a session is attached (main, control, ...)
    [slurm]
    job_tenants = false            # a process in a Slurm job is tenant slurm:job_<id>, with only the
                                   # GPUs its prolog registered (none until then; deploy/slurm)
    [isolation]
    tenants = []                   # tenants whose work runs in a pilotd process of its own; "all"
    after_fault = true             # a tenant whose kernel faulted runs isolated until cleared
    capacity = "8GiB"              # per GPU for each isolated tenant's process, withheld from the
                                   # shared one (default: the same capacity, nothing withheld)
    idle_exit = "5m"               # an isolated tenant's process with no session ends after this
    fault_backoff = "10s"          # from the 2nd fault of a tenant's engine in an hour its programs wait
    fault_backoff_max = "10m"      # this (0: off), doubled for each more, at most this
    mps = false                    # isolated tenants' processes (and pilotd) are clients of pilotd's
                                   # own MPS control daemon: each its own GPU address space, run at
                                   # once; with tenants = "all": the confined mode (docs/SECURITY.md)
    mps_control = "nvidia-cuda-mps-control"  # the MPS control program: a name on PATH, or a path
    [nvml]
    poll_interval = "1s"
    [metrics]
    address = "127.0.0.1:19400"    # Prometheus endpoint: host:port, [v6]:port, :port; "" = off
    kernel_time = false            # charge tenants their kernels' GPU time (events per launch)
    tenant_labels = false          # label series with tenant names (every local user can read them)
    [tenants.<name>]               # name: [a-z0-9][a-z0-9_.-]*
    users = ["alice"]
    groups = ["ml"]
    sm_share = 25                  # % of each GPU's SMs its kernels may use (default: all)
    priority = "high"              # high, normal (default) or low (scheduling/priority.py)
    loop_preempt = false           # its kernels may also be preempted inside a block, at an outer
                                   # loop's back edge, the block run again from its start later:
                                   # correct for idempotent kernels only (docs/POLICIES.md)
    [priority]
    gated_inflight = 2             # GPU work in flight per session gated by a higher tenant
    active_window = "100ms"        # a tenant is active this long after each call it makes
    preempt = false                # gated sessions' kernels run as preemptible variants
    preempt_chunk = "auto"         # logical blocks a variant's block claims at a time (1..64),
                                   # or "auto": per kernel and grid, the original or chunk 1 or 8,
                                   # whichever measured fastest (scheduling/preempt_choice.py)
    preempt_parts = 1              # a launch's preemptible parts (1..16): with more than 1, a
                                   # resumed launch can be preempted again, up to this many parts
                                   # in all (each costs a wait and a launch, about 7.5 us on an
                                   # H200); the last part runs to the end
    preempt_chaos = 0              # a test setting (tests/gpu): > 0 runs every session below high
                                   # as gated, with its variants, and raises the retreat words at
                                   # random moments (exponential gaps of this mean, each held up
                                   # to as long); implies preempt; results must not change
    loop_preempt_programs = []     # programs (argv[0] or its base name) whose kernels get
                                   # loop-level preemption too, as [tenants.X] loop_preempt

Sizes are strings with a unit: KiB/MiB/GiB/TiB (powers of 1024, any case), KB/MB/GB/TB
(powers of 1000, written so: "8GB" is 8e9 bytes, "8gb" is refused) or B; fractions round down
to whole bytes. A number without a unit is refused unless it is 0 (a bare `capacity = 8` would be
an 8-byte GPU); GPU capacities and limits below SIZE_FLOOR (1 MiB) are refused too. Durations are numbers
(seconds) or strings with us, ms, s, m or h. Relative paths in the file are relative to the
file's directory (and `~` is expanded), so a config does not depend on the daemon's cwd.

A user or group may appear in one tenant only: membership must never be ambiguous, since the
tenant decides whose quota an allocation counts against.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from decimal import Decimal
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

DEFAULT_CONFIG_PATH = "/etc/pilot/pilotd.toml"

BACKENDS = ("cuda", "sim")
FAULT_RECOVERY = ("restart", "exit")
# The driver's schedule of pilotd's contexts (CU_CTX_SCHED_*): how a thread that synchronizes waits
GPU_WAITS = ("auto", "spin", "yield", "blocking")
ENDPOINT_SPINS = ("auto", "always")
_POLICY_NAME = re.compile(r"[a-z][a-z0-9_-]*")
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")
TENANT_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]*")
PRIORITIES = ("low", "normal", "high")  # a tenant's priority class, lowest first


def check_priority(value: Any) -> str:
    """A priority class name: high, normal or low (any case)."""
    name = value.strip().lower() if isinstance(value, str) else value
    if name not in PRIORITIES:
        raise ValueError(f"a priority is one of {', '.join(PRIORITIES)}, not {value!r}")
    return name


class ConfigError(ValueError):
    """A configuration that pilotd refuses to start with; the message is one line per mistake
    for the operator: `FILE: KEY: problem` or `FILE: unknown key KEY (did you mean ...?)`."""


# ---- units ----

MAX_SIZE = 2**64 - 1
SIZE_FLOOR = 2**20  # the smallest capacity, limit or quota that is not a mistake
_BINARY_UNITS = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # any case
_EXACT_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}  # as written
_DURATION_UNITS = {"": Decimal(1), "us": Decimal("1e-6"), "ms": Decimal("1e-3"), "s": Decimal(1),
                   "m": Decimal(60), "h": Decimal(3600)}
_NUMBER = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*")


def parse_bytes(text: str | int) -> int:
    """Bytes in `text`: "8GiB", "512 MiB", "1.5GB", "0", or an int (bytes, from code). A string
    needs a unit unless it is 0; binary units take any case, decimal ones and B only as written
    (`8gb`: binary or decimal?); a bare K/M/G/T is refused as ambiguous."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a size")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"{text!r} is not a size (negative)")
        return _at_most_64_bits(text)
    if isinstance(text, float):  # TOML `capacity = 8e9`
        if text.is_integer() and text >= 0:
            return _at_most_64_bits(int(text))
        raise ValueError(f"{text!r} is not a size (whole, non-negative bytes)")
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not a size")
    m = _NUMBER.fullmatch(text)
    if m is None:
        why = " (negative)" if text.strip().startswith("-") else ""
        raise ValueError(f"{text!r} is not a size{why}")
    number, unit = m.group(1), m.group(2)
    if not unit:
        if Decimal(number) == 0:
            return 0
        raise ValueError(f"{text!r} has no unit: write {number}GiB, {number}MiB, ... "
                         f"({number}B if you mean bytes)")
    mult = _EXACT_UNITS.get(unit) or _BINARY_UNITS.get(unit.lower())
    if mult is None:
        if unit.lower() in ("k", "m", "g", "t"):
            why = f"ambiguous unit {unit!r}: use {unit.upper()}iB or {unit.upper()}B"
        elif unit.upper() in _EXACT_UNITS:
            big = unit.upper()
            why = (f"write {big} for powers of 1000 or {big[:-1]}iB for powers of 1024" if len(big) > 1
                   else "write B for bytes")
        else:
            why = f"unknown unit {unit!r}; use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB"
        raise ValueError(f"{text!r} is not a size ({why})")
    value = Decimal(number) * mult
    if mult == 1 and value != value.to_integral_value():
        raise ValueError(f"{text!r} is not a size (fraction of a byte)")
    return _at_most_64_bits(int(value))  # rounds toward zero: whole bytes


def at_least_floor(n: int, what: str = "a capacity") -> int:
    """`n`, unless it is below SIZE_FLOOR: a mistake (a missing unit), not a useful size."""
    if n < SIZE_FLOOR:
        raise ValueError(f"{n} bytes is below the {SIZE_FLOOR >> 20} MiB floor for {what} "
                         "(a missing or wrong unit?)")
    return n


def size_text(n: int) -> str:
    """`n` bytes in the largest binary unit it is a whole number of, else to 2 decimals with the
    exact bytes beside: what pilot echoes back of a size it was given ("8GB" -> 7.45 GiB)."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            if n % scale == 0:
                return f"{n // scale} {unit}"
            return f"{n / scale:.2f} {unit} ({n} bytes)"
    return f"{n} B"


def _at_most_64_bits(n: int) -> int:
    """Sizes are 64-bit (CUDA's size_t): a larger one is a mistake, not a very large quota."""
    if n > MAX_SIZE:
        raise ValueError(f"{n} bytes is more than any size can be (16 EiB)")
    return n


def parse_duration(text: str | int | float) -> float:
    """Seconds in `text`: "500ms", "2s", "1m", "1h", "250us", or a number of seconds."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ValueError(f"{text!r} is not a duration")
    if isinstance(text, (int, float)):
        if not (text >= 0 and float(text) != float("inf")):  # also refuses NaN
            raise ValueError(f"{text!r} is not a duration (negative or not finite)")
        return float(text)
    m = _NUMBER.fullmatch(text)
    if m is None:
        why = " (negative)" if text.strip().startswith("-") else ""
        raise ValueError(f"{text!r} is not a duration{why}")
    mult = _DURATION_UNITS.get(m.group(2).lower())
    if mult is None:
        raise ValueError(f"{text!r} is not a duration (unknown unit {m.group(2)!r}; "
                         "use us, ms, s, m or h)")
    return float(Decimal(m.group(1)) * mult)


def _switch_interval(text: str | int | float) -> float:
    seconds = parse_duration(text)
    if not 1e-5 <= seconds <= 0.1:
        raise ValueError(f"{text!r} is out of range (10us to 100ms)")
    return seconds


def parse_address(text: str) -> tuple[str, int]:
    """(host, port) of "host:port", "[v6]:port" or ":port" (host "": every interface). Port 0
    asks the kernel for a free port (tests)."""
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not host:port")
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d{1,5})|([A-Za-z0-9.-]*):(\d{1,5})", text)
    if m is None:
        raise ValueError(f"{text!r} is not host:port (IPv6 as [::1]:9400)")
    host, port = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    if m.group(1):
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{text!r}: {host!r} is not an IPv6 address") from None
    elif host and any(not label or len(label) > 63 for label in host.split(".")):
        raise ValueError(f"{text!r}: {host!r} is not a host name or address")
    if int(port) > 65535:
        raise ValueError(f"{text!r}: port {port} is not in 0..65535")
    return host, int(port)


def default_state_dir() -> str:
    """/var/lib/pilot for root; a user's daemon keeps state in its XDG state directory."""
    if os.geteuid() == 0:
        return "/var/lib/pilot"
    xdg = os.environ.get("XDG_STATE_HOME", "")
    if os.path.isabs(xdg):  # the XDG spec says relative values are to be ignored
        return os.path.join(xdg, "pilot")
    return os.path.join(os.path.expanduser("~"), ".local", "state", "pilot")


# ---- the configuration ----

@dataclass(frozen=True)
class TenantDef:
    """A named tenant: everyone listed in `users`, or in one of `groups`, counts as it."""

    name: str
    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    sm_share: int | None = None  # percent of each GPU's SMs (resources/shares.py); None: no cap
    priority: str | None = None  # high, normal or low (resources/priorities.py); None: normal
    loop_preempt: bool = False  # loop-level preemption for its kernels (idempotent ones only)


@dataclass(frozen=True)
class Config:
    """Every setting of pilotd. Constructing one converts and validates each field (so
    `Config(capacity="8GiB")` works and `Config(vgpus_per_gpu=0)` raises ConfigError)."""

    backend: str = "cuda"
    socket: str | None = None
    control_socket: str | None = None
    vgpus_per_gpu: int = 2
    max_vgpus_per_gpu: int = 32
    gpus: tuple[int, ...] | None = None
    capacity: int | None = None
    capacity_per_gpu: dict[int, int] = field(default_factory=dict)
    enforce_capacity: bool = False
    managed_limit: int | None = None
    managed_device_memory: bool = False
    callback_timeout: float = 60.0
    callback_hold_total: float = 600.0
    vgpus_per_tenant: int = 0
    # Python's 5 ms let a thread holding the policy lock keep other vGPU threads waiting for it
    # (bench/RESULTS.md: 2.26x -> 1.08x for a program beside pageDoS under AMFit at 100%)
    switch_interval: float = 0.0005
    # After a context-fatal GPU fault the process cannot use the GPU again (router/recovery.py):
    # "restart" re-executes pilotd in place, "exit" stops it (status 3) for systemd to restart.
    fault_recovery: str = "restart"
    fault_poll_interval: float = 0.02
    fast_launch: bool = True
    staging_spares: int = 1
    device_output: bool = True
    policy: str = "none"
    policy_max_wait: float = 30.0
    policy_plugins: tuple[str, ...] = ()
    policy_settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    priority_gated_inflight: int = 2
    priority_active_window: float = 0.1
    priority_preempt: bool = False
    priority_preempt_chunk: int = 0  # 0: "auto"
    priority_preempt_parts: int = 1
    priority_preempt_chaos: float = 0.0
    priority_loop_preempt_programs: tuple[str, ...] = ()
    pinned_limit: int | None = None
    pinned_limit_per_tenant: int | None = None
    pinned_tenant_fraction: float = 0.25
    sessions_per_uid: int = 128
    connections: int = 16384
    connections_per_uid: int = 320
    max_frame: int = 64 << 10
    nvml_poll_interval: float = 1.0
    slurm_job_tenants: bool = False
    # Isolation (router/isolation.py): tenants served by a pilotd process of their own.
    isolation_tenants: tuple[str, ...] = ()  # ("all",) for every tenant
    isolation_after_fault: bool = True
    isolation_capacity: int | None = None  # per GPU, withheld; default: the same, not withheld
    isolation_idle_exit: float = 300.0
    # from a tenant's engine's second fault in an hour its next session waits fault_backoff x
    # 2^(k-2) s from its last, k its engine's faults in the last hour, at most
    # fault_backoff_max (0: off; router/fault_backoff.py)
    isolation_fault_backoff: float = 10.0
    isolation_fault_backoff_max: float = 600.0
    isolated_tenant: str | None = None  # set in the process that serves one isolated tenant
    # MPS (router/mps.py): engines and pilotd are clients of pilotd's own MPS control daemon
    isolation_mps: bool = False
    isolation_mps_control: str = "nvidia-cuda-mps-control"
    metrics_kernel_time: bool = False
    metrics_tenant_labels: bool = False
    # Outside 9100-9999, where Prometheus exporters' default ports are (9400: dcgm-exporter).
    metrics_address: str = "127.0.0.1:19400"
    state_dir: str = field(default_factory=default_state_dir)
    admin_group: str = "pilot-admin"
    log_level: str = "info"
    log_format: str = "text"
    spin_us: int = 50
    spinners: int | str = 0
    endpoint_spin: str = "auto"
    gpu_wait: str = "auto"
    sim_kernels: tuple[str, ...] = ()
    sim_devices: int = 1
    tenants: dict[str, TenantDef] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for f in fields(self):
            try:
                value = _CONVERT[f.name](getattr(self, f.name))
            except _Invalid as exc:
                raise ConfigError(exc.render(f.name)) from None
            except ValueError as exc:
                raise ConfigError(f"{f.name}: {exc}") from None
            object.__setattr__(self, f.name, value)

    def control_socket_path(self, main_socket: str) -> str:
        """The control socket: as configured, else `control.sock` beside the main socket."""
        if self.control_socket:
            return self.control_socket
        return os.path.join(os.path.dirname(main_socket), "control.sock")

    def capacity_for(self, gpu: int, physical: int) -> int:
        """Bytes granted on GPU `gpu` whose card has `physical` bytes: its own override, else
        the common capacity, else the card's memory. Not clipped to `physical`: a capacity
        above the card is the operator's decision (oversubscription with managed memory)."""
        if gpu in self.capacity_per_gpu:
            return self.capacity_per_gpu[gpu]
        return self.capacity if self.capacity is not None else physical

    @property
    def confined(self) -> bool:
        """The confined mode: every tenant's work in a pilotd process of its own (an engine),
        each a client of pilotd's MPS, so each has its own GPU address space (docs/SECURITY.md)."""
        return self.isolation_mps and "all" in self.isolation_tenants

    def metrics_host_port(self) -> tuple[str, int] | None:
        """(host, port) of the metrics endpoint, or None when disabled."""
        return parse_address(self.metrics_address) if self.metrics_address else None


class _Invalid(ValueError):
    """A bad value below a key (`sub`, dotted), or an unknown key among `choices`; `more`: the
    other mistakes found in the same value (each tenant table's, say)."""

    def __init__(self, msg: str, sub: str | None = None, choices: tuple[str, ...] | None = None,
                 more: tuple[_Invalid, ...] = ()):
        super().__init__(msg)
        self.msg, self.sub, self.choices, self.more = msg, sub, choices, more

    def render(self, key: str, where: str = "") -> str:
        """One line per mistake, each starting with `where`."""
        full = f"{key}.{self.sub}" if self.sub else key
        line = unknown_key_message(full, self.choices) if self.choices is not None else f"{full}: {self.msg}"
        return "\n".join([where + line, *(m.render(key, where) for m in self.more)])


def _all_of(found: list[_Invalid]) -> None:
    """Raise the mistakes found (the first, carrying the rest), if any."""
    if found:
        first = found[0]
        raise _Invalid(first.msg, first.sub, first.choices, (*first.more, *found[1:]))


def unknown_key_message(dotted: str, choices: tuple[str, ...] | list[str]) -> str:
    """`unknown key a.b (did you mean c?)` with difflib's closest choice, if any is close."""
    last = dotted.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(last, list(choices), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown key {dotted}{hint}"


def _choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        if isinstance(value, str) and value.lower() in options:
            return value.lower()
        close = difflib.get_close_matches(str(value).lower(), options, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ValueError(f"{value!r} is not one of {', '.join(options)}{hint}")

    return convert


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{value!r} is not true or false")
    return value


def _int_range(lo: int, hi: int) -> Callable[[Any], int]:
    def convert(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{value!r} is not an integer")
        if not lo <= value <= hi:
            raise ValueError(f"{value} is not in {lo}..{hi}")
        return value

    return convert


def _chunk(value: Any) -> int:
    """[priority] preempt_chunk: "auto" (0, the default) or 1..64."""
    if value == "auto" or (value == 0 and not isinstance(value, bool)):
        return 0
    try:
        return _int_range(1, 64)(value)
    except ValueError as exc:
        raise ValueError(f'{exc} (or "auto")') from None


def _spinners(value: Any) -> int | str:
    """"auto", or how many of pilotd's threads may spin at once (0: no limit)."""
    if isinstance(value, str) and value.lower() == "auto":
        return "auto"
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    try:
        return _int_range(0, 4096)(value)
    except ValueError:
        raise ValueError(f"{value!r} is not \"auto\" or an integer in 0..4096") from None


def spin_limit(spinners: int | str, cores: int | None = None) -> int:
    """The spin budget's size (daemon/native/spin_budget.h; 0: no limit): "auto" is a quarter of
    the cores pilotd may run on, at least 2, so the tenants' own processes keep the rest."""
    if spinners != "auto":
        return int(spinners)
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(2, cores // 4)


def _string(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{value!r} is not a non-empty string")
    return value


def _optional_string(value: Any) -> str | None:
    return None if value is None else _string(value)


def _gpu_index(value: Any) -> int:
    if isinstance(value, str) and value.isdigit():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a GPU index")
    return value


def _gpus(value: Any) -> tuple[int, ...] | None:
    if value is None or value == "all":
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{value!r} is not \"all\" nor a list of GPU indexes")
    if not value:
        raise ValueError("empty list: give \"all\" or at least one GPU index")
    out = tuple(_gpu_index(v) for v in value)
    if len(set(out)) != len(out):
        raise ValueError(f"{list(value)!r} lists a GPU twice")
    return out


def _capacity(value: Any) -> int | None:
    if value is None:
        return None
    return at_least_floor(parse_bytes(value))


def _pinned_limit(value: Any) -> int | None:
    """Host memory a tenant (or all) may pin: above 0, with no floor (pinned buffers are small)."""
    if value is None:
        return None
    n = parse_bytes(value)
    if n == 0:
        raise ValueError(f"{value!r}: a limit must be above 0 (leave it out for the default)")
    return n


def _capacity_per_gpu(value: Any) -> dict[int, int]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{value!r} is not a table of GPU index = size")
    out: dict[int, int] = {}
    for key, size in value.items():
        try:
            gpu = _gpu_index(key)
        except ValueError:
            raise _Invalid(f"{key!r} is not a GPU index (use \"0\", \"1\", ...)", sub=str(key)) from None
        if gpu in out:
            raise _Invalid(f"GPU {gpu} is given twice", sub=str(key))
        try:
            out[gpu] = at_least_floor(parse_bytes(size))
        except ValueError as exc:
            raise _Invalid(str(exc), sub=str(key)) from None
    return out


def _poll_interval(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"{value!r}: must be above 0")
    return seconds


def _fault_poll_interval(value: Any) -> float:
    """0 turns the watch off (faults are then noticed at the next call that returns one); at
    most 1 s, so a fault nobody calls into is still noticed soon."""
    seconds = parse_duration(value)
    if not 0 <= seconds <= 1:
        raise ValueError(f"{value!r}: must be between 0 and 1s")
    return seconds


def _policy_name(value: Any) -> str:
    """Syntax only, in any case (`MFit` is mfit): which names exist is the policy registry's to
    say, once plugins are loaded (pilot.daemon.scheduling.policy_host)."""
    if not isinstance(value, str) or not _POLICY_NAME.fullmatch(value.lower()):
        raise ValueError(f"{value!r} is not a policy name (a letter, then letters, digits, _ or -)")
    return value.lower()


def _plugins(value: Any) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{value!r} is not a list of plugin files or modules")
    return tuple(_string(v) for v in value)


def _policy_settings(value: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(value, dict):
        raise ValueError(f"{value!r} is not a table of policy knobs")
    out = {}
    for name, table in value.items():
        if not isinstance(table, dict):
            raise _Invalid(f"{table!r} is not a table", sub=str(name))
        out[str(name)] = dict(table)
    return out


def _fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"{value!r}: give a fraction above 0 and at most 1")
    return float(value)


def _frame_size(value: Any) -> int:
    """Before a session is attached a request is small (HELLO, ATTACH, a pilotctl command)."""
    size = parse_bytes(value) if isinstance(value, str) else value
    if isinstance(size, bool) or not isinstance(size, int) or not 1024 <= size <= 16 << 20:
        raise ValueError(f"{value!r}: must be between 1KiB and 16MiB")
    return size


def _metrics_address(value: Any) -> str:
    if value == "":
        return ""
    parse_address(value)
    return value


def _isolation_tenants(value: Any) -> tuple[str, ...]:
    """"all", or a list of tenant names as pilotctl shows them (user:alice, slurm:job_42, ml)."""
    if value == "all":
        return ("all",)
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{value!r}: give \"all\" or a list of tenant names")
    out = tuple(value)
    for v in out:
        if not isinstance(v, str) or not v or any(c.isspace() for c in v):
            raise ValueError(f"{v!r} is not a tenant name")
    return out


def _program(value: Any) -> str:
    """A program's name (looked up on PATH when it is run) or its path."""
    text = _string(value)
    if any(c.isspace() for c in text):
        raise ValueError(f"{value!r}: give one program, a name on PATH or a path (no arguments)")
    return text


def _paths(value: Any) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{value!r} is not a list of paths")
    return tuple(_string(v) for v in value)


def _names(value: Any, what: str) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{value!r} is not a list of {what} names")
    out: list[str] = []
    for v in value:
        if not isinstance(v, str) or not v or any(c.isspace() or c == ":" for c in v):
            raise ValueError(f"{v!r} is not a {what} name")
        if v not in out:
            out.append(v)
    return tuple(out)


_TENANT_KEYS = ("users", "groups", "sm_share", "priority", "loop_preempt")


def _tenants(value: Any) -> dict[str, TenantDef]:
    """Tenant tables (or TenantDefs) -> {name: TenantDef}, each user and group in one tenant, the
    shares adding up to 100% at most. Every mistake is found (one _Invalid carrying the rest)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{value!r} is not a table of tenants")
    out: dict[str, TenantDef] = {}
    found: list[_Invalid] = []
    owner: dict[tuple[str, str], str] = {}  # ("user"|"group", name) -> tenant
    for name, spec in value.items():
        try:
            out[name] = _tenant(name, spec, owner)
        except _Invalid as exc:
            found.append(exc)
    shares = {t.name: t.sm_share for t in out.values() if t.sm_share is not None and t.sm_share < 100}
    if sum(shares.values()) > 100:
        named = ", ".join(f"{t} {p}%" for t, p in shares.items())
        found.append(_Invalid(f"sm_share adds up to {sum(shares.values())}% of each GPU ({named}): "
                              "at most 100%"))
    _all_of(found)
    return out


def _tenant(name: Any, spec: Any, owner: dict[tuple[str, str], str]) -> TenantDef:
    """One tenant table; its mistakes raised together (see _tenants)."""
    if not isinstance(name, str) or not TENANT_NAME.fullmatch(name):
        raise _Invalid(f"tenant name {name!r} must match {TENANT_NAME.pattern}", sub=str(name))
    if isinstance(spec, TenantDef):
        if spec.name != name:
            raise _Invalid(f"TenantDef named {spec.name!r} under key {name!r}", sub=name)
        spec = {"users": spec.users, "groups": spec.groups, "sm_share": spec.sm_share,
                "priority": spec.priority, "loop_preempt": spec.loop_preempt}
    if not isinstance(spec, Mapping):
        raise _Invalid(f"{spec!r} is not a table with users and groups", sub=name)
    found = [_Invalid("", sub=f"{name}.{key}", choices=_TENANT_KEYS)
             for key in spec if key not in _TENANT_KEYS]
    members: dict[str, tuple[str, ...]] = {"users": (), "groups": ()}
    for key, kind in (("users", "user"), ("groups", "group")):
        try:
            members[key] = _names(spec.get(key, ()), kind)
        except ValueError as exc:
            found.append(_Invalid(str(exc), sub=f"{name}.{key}"))
        for member in members[key]:
            other = owner.setdefault((kind, member), name)
            if other != name:
                found.append(_Invalid(f"{kind} {member!r} is already in tenant {other!r}",
                                      sub=f"{name}.{key}"))
    if not members["users"] and not members["groups"] and not found:
        found.append(_Invalid("a tenant needs at least one user or group", sub=name))
    share = spec.get("sm_share")
    if share is not None and (isinstance(share, bool) or not isinstance(share, int)
                              or not 1 <= share <= 100):
        found.append(_Invalid(f"{share!r} is not a percentage from 1 to 100", sub=f"{name}.sm_share"))
    priority = spec.get("priority")
    if priority is not None:
        try:
            priority = check_priority(priority)
        except ValueError as exc:
            found.append(_Invalid(str(exc), sub=f"{name}.priority"))
    loop = spec.get("loop_preempt", False)
    if not isinstance(loop, bool):
        found.append(_Invalid(f"{loop!r} is not true or false", sub=f"{name}.loop_preempt"))
    _all_of(found)
    return TenantDef(name, members["users"], members["groups"], share, priority, loop is True)


_CONVERT: dict[str, Callable[[Any], Any]] = {
    "backend": _choice(BACKENDS),
    "socket": _optional_string,
    "control_socket": _optional_string,
    "vgpus_per_gpu": _int_range(1, 64),
    "max_vgpus_per_gpu": _int_range(1, 256),
    "gpus": _gpus,
    "capacity": _capacity,
    "capacity_per_gpu": _capacity_per_gpu,
    "enforce_capacity": _flag,
    "managed_limit": _capacity,
    "managed_device_memory": _flag,
    "callback_timeout": parse_duration,
    "callback_hold_total": parse_duration,
    "vgpus_per_tenant": _int_range(0, 256),
    "switch_interval": _switch_interval,
    "fault_recovery": _choice(FAULT_RECOVERY),
    "fault_poll_interval": _fault_poll_interval,
    "fast_launch": _flag,
    "staging_spares": _int_range(0, 16),
    "device_output": _flag,
    "policy": _policy_name,
    "policy_max_wait": parse_duration,
    "policy_plugins": _plugins,
    "policy_settings": _policy_settings,
    "priority_gated_inflight": _int_range(1, 1024),
    "priority_active_window": parse_duration,
    "priority_preempt": _flag,
    "priority_preempt_chunk": _chunk,
    "priority_preempt_parts": _int_range(1, 16),
    "priority_preempt_chaos": parse_duration,
    "priority_loop_preempt_programs": lambda v: _names(v, "program"),
    "pinned_limit": _pinned_limit,
    "pinned_limit_per_tenant": _pinned_limit,
    "pinned_tenant_fraction": _fraction,
    "sessions_per_uid": _int_range(1, 65536),
    "connections": _int_range(16, 1 << 20),
    "connections_per_uid": _int_range(4, 1 << 20),
    "max_frame": _frame_size,
    "nvml_poll_interval": _poll_interval,
    "slurm_job_tenants": _flag,
    "isolation_tenants": _isolation_tenants,
    "isolation_after_fault": _flag,
    "isolation_capacity": _capacity,
    "isolation_idle_exit": parse_duration,
    "isolation_fault_backoff": parse_duration,
    "isolation_fault_backoff_max": parse_duration,
    "isolated_tenant": _optional_string,
    "isolation_mps": _flag,
    "isolation_mps_control": _program,
    "metrics_kernel_time": _flag,
    "metrics_tenant_labels": _flag,
    "metrics_address": _metrics_address,
    "state_dir": _string,
    "admin_group": _string,
    "log_level": _choice(LOG_LEVELS),
    "log_format": _choice(LOG_FORMATS),
    "spin_us": _int_range(0, 10000),
    "spinners": _spinners,
    "endpoint_spin": _choice(ENDPOINT_SPINS),
    "gpu_wait": _choice(GPU_WAITS),
    "sim_kernels": _paths,
    "sim_devices": _int_range(1, 16),
    "tenants": _tenants,
}

# TOML section -> {key: Config field}; [tenants] is handled apart (its keys are names).
SECTIONS: dict[str, dict[str, str]] = {
    "daemon": {k: k for k in ("backend", "socket", "control_socket", "vgpus_per_gpu",
                              "max_vgpus_per_gpu", "gpus", "callback_timeout", "callback_hold_total",
                              "vgpus_per_tenant", "switch_interval",
                              "fault_recovery", "fault_poll_interval", "fast_launch", "device_output",
                              "staging_spares",
                              "spin_us", "spinners", "endpoint_spin", "gpu_wait",
                              "state_dir",
                              "admin_group", "log_level", "log_format",
                              "sim_kernels", "sim_devices")},
    "gpu": {k: k for k in ("capacity", "capacity_per_gpu", "enforce_capacity", "managed_limit",
                           "managed_device_memory")},
    "policy": {"name": "policy", "max_wait": "policy_max_wait", "plugins": "policy_plugins"},
    "priority": {"gated_inflight": "priority_gated_inflight", "preempt": "priority_preempt",
                 "preempt_chunk": "priority_preempt_chunk", "preempt_chaos": "priority_preempt_chaos",
                 "preempt_parts": "priority_preempt_parts",
                 "active_window": "priority_active_window",
                 "loop_preempt_programs": "priority_loop_preempt_programs"},
    "pinned": {"limit": "pinned_limit", "limit_per_tenant": "pinned_limit_per_tenant",
               "tenant_fraction": "pinned_tenant_fraction"},
    "limits": {k: k for k in ("sessions_per_uid", "connections", "connections_per_uid", "max_frame")},
    "nvml": {"poll_interval": "nvml_poll_interval"},
    "slurm": {"job_tenants": "slurm_job_tenants"},
    "isolation": {"tenants": "isolation_tenants", "after_fault": "isolation_after_fault",
                  "capacity": "isolation_capacity", "idle_exit": "isolation_idle_exit",
                  "fault_backoff": "isolation_fault_backoff",
                  "fault_backoff_max": "isolation_fault_backoff_max",
                  "mps": "isolation_mps", "mps_control": "isolation_mps_control"},
    "metrics": {"address": "metrics_address", "kernel_time": "metrics_kernel_time",
                "tenant_labels": "metrics_tenant_labels"},
}
_PATH_FIELDS = ("socket", "control_socket", "state_dir")


_SIZE_FIELDS = ("capacity", "capacity_per_gpu", "managed_limit", "pinned_limit",
                "pinned_limit_per_tenant", "isolation_capacity")


def _unit_given(name: str, value: Any) -> None:
    """A size in the file is a string with a unit: a TOML number (other than 0) is refused, since
    `capacity = 8` reads as 8 bytes where 8 GiB was meant."""
    if name not in _SIZE_FIELDS:
        return
    if isinstance(value, Mapping):
        for key, size in value.items():
            try:
                _unit_given(name, size)
            except ValueError as exc:
                raise _Invalid(str(exc), sub=str(key)) from None
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and value != 0:
        raise ValueError(f"{value!r} has no unit: write \"{value}GiB\", \"{value}MiB\", ... "
                         f"(\"{value}B\" if you mean bytes)")


def _file_values(data: dict[str, Any], base_dir: str, path: str,
                 errors: list[str]) -> dict[str, tuple[str, Any]]:
    """The parsed TOML document -> {field: (dotted key, raw value)}; each unknown name adds an
    error to `errors` (and is left out)."""
    raw: dict[str, tuple[str, Any]] = {}
    sections = (*SECTIONS, "tenants")
    for section, table in data.items():
        if section not in sections and not isinstance(table, dict):
            errors.append(f"{path}: {unknown_key_message(section, sections)}")
            continue
        if section not in sections:
            close = difflib.get_close_matches(section, sections, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            errors.append(f"{path}: unknown section [{section}]{hint}")
            continue
        if not isinstance(table, dict):
            errors.append(f"{path}: {section}: must be a table ([{section}])")
            continue
        if section == "tenants":
            raw["tenants"] = ("tenants", table)
            continue
        keys = SECTIONS[section]
        for key, value in table.items():
            dotted = f"{section}.{key}"
            if section == "policy" and isinstance(value, dict):  # [policy.<name>]: its knobs
                settings = raw.setdefault("policy_settings", ("policy", {}))[1]
                settings[key] = value
                continue
            if key not in keys:
                errors.append(f"{path}: {unknown_key_message(dotted, tuple(keys))}")
                continue
            name = keys[key]
            if name in _PATH_FIELDS and isinstance(value, str) and value:
                value = os.path.join(base_dir, os.path.expanduser(value))
            elif name == "isolation_mps_control" and isinstance(value, str) and "/" in value:
                # a path is relative to the file; a bare name is looked up on PATH when run
                value = os.path.join(base_dir, os.path.expanduser(value))
            elif name in ("sim_kernels", "policy_plugins") and isinstance(value, list):
                # plugins may also be module names; only paths are made relative to the file
                value = [os.path.join(base_dir, os.path.expanduser(v))
                         if isinstance(v, str) and v and (name == "sim_kernels" or v.endswith(".py"))
                         else v for v in value]
            raw[name] = (dotted, value)
    return raw


def load_config(path: str | None, overrides: dict[str, Any] | None = None) -> Config:
    """The configuration from `path` (None: DEFAULT_CONFIG_PATH if it exists, else defaults),
    then `overrides` (command-line values keyed by Config field; None values are ignored).
    Raises ConfigError naming the file (or `command line`) and the key; with several mistakes,
    one line for each (every one is found in one pass)."""
    if path is None and os.path.exists(DEFAULT_CONFIG_PATH):
        path = DEFAULT_CONFIG_PATH
    values: dict[str, Any] = {}
    errors: list[str] = []
    if path is not None:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such file") from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
        base_dir = os.path.dirname(os.path.abspath(path))
        for name, (dotted, value) in _file_values(data, base_dir, path, errors).items():
            try:
                _unit_given(name, value)
                values[name] = _convert(name, value, f"{path}: ", dotted)
            except _Invalid as exc:
                errors.append(exc.render(dotted, f"{path}: "))
            except ValueError as exc:
                errors.append(str(exc) if isinstance(exc, ConfigError) else f"{path}: {dotted}: {exc}")
    for name, value in (overrides or {}).items():
        if name not in _CONVERT:
            errors.append(f"command line: {unknown_key_message(name, tuple(_CONVERT))}")
        elif value is not None:
            try:
                values[name] = _convert(name, value, "command line: ", "--" + name.replace("_", "-"))
            except ConfigError as exc:
                errors.append(str(exc))
    if errors:
        raise ConfigError("\n".join(errors))
    return Config(**values)
def _convert(name: str, value: Any, where: str, key: str) -> Any:
    try:
        return _CONVERT[name](value)
    except _Invalid as exc:
        if name == "tenants" and key.startswith("--"):
            key = "tenants"
        raise ConfigError(exc.render(key, where)) from None
    except ValueError as exc:
        raise ConfigError(f"{where}{key}: {exc}") from None
