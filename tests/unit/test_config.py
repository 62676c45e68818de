"""pilotd's configuration (daemon/config.py): units, the TOML layout, validation that names the
file and key, command-line overrides, defaults, and the shipped example deploy/pilotd.toml."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from pilot import policies
from pilot.daemon import config
from pilot.daemon.config import (
    Config,
    ConfigError,
    TenantDef,
    load_config,
    parse_address,
    parse_bytes,
    parse_duration,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "pilotd.toml"
GiB = 2**30


@pytest.fixture(autouse=True)
def as_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every test runs as an unprivileged user with a known home and no system config."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setattr(config, "DEFAULT_CONFIG_PATH", str(tmp_path / "absent" / "pilotd.toml"))


def write(tmp_path: Path, text: str, name: str = "pilotd.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ---- units ----

@pytest.mark.parametrize(("text", "expected"), [
    ("8GiB", 8 * GiB), ("512 MiB", 512 * 2**20), ("1.5GB", 1_500_000_000), ("1024B", 1024),
    (4096, 4096), (0, 0), ("0", 0), ("0.0", 0), ("1kib", 1024), ("2 KB", 2000), ("3TB", 3 * 10**12),
    ("1TiB", 2**40), ("7B", 7), ("  16gib ", 16 * GiB), ("1.1GiB", int(1.1 * GiB)), (".5KiB", 512),
    (8e9, 8_000_000_000),
])
def test_parse_bytes(text: str | int, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["-1", -1, "-8GiB", "8 Gigs", "GiB", "", "1.5", "1e9", "8G",
                                  "1,000", True, None, 1.5, "8GiB8", "1024", "8", "8gb", "8Gb",
                                  "8kB", "7b"])
def test_parse_bytes_rejects(text: object) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(text))):
        parse_bytes(text)  # type: ignore[arg-type]


def test_parse_bytes_explains_ambiguous_and_unknown_units() -> None:
    with pytest.raises(ValueError, match="ambiguous unit 'G': use GiB or GB"):
        parse_bytes("8G")
    with pytest.raises(ValueError, match=r"'8' has no unit: write 8GiB, 8MiB, \.\.\. \(8B if you "
                                         r"mean bytes\)"):
        parse_bytes("8")
    with pytest.raises(ValueError, match="write GB for powers of 1000 or GiB for powers of 1024"):
        parse_bytes("8gb")
    with pytest.raises(ValueError, match="unknown unit 'Gigs'"):
        parse_bytes("8 Gigs")


@pytest.mark.parametrize(("text", "expected"), [
    ("500ms", 0.5), ("2s", 2.0), ("1m", 60.0), ("1h", 3600.0), ("250us", 0.00025), (1.5, 1.5),
    (3, 3.0), ("0.25", 0.25), (" 10 S ", 10.0),
])
def test_parse_duration(text: str | float, expected: float) -> None:
    assert parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["-1s", -2, "soon", "5 parsecs", "", float("nan"), float("inf"), True])
def test_parse_duration_rejects(text: object) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)  # type: ignore[arg-type]


def test_parse_address() -> None:
    assert parse_address("127.0.0.1:9400") == ("127.0.0.1", 9400)
    assert parse_address("[::1]:9400") == ("::1", 9400)
    assert parse_address(":9400") == ("", 9400)
    assert parse_address("metrics.example:0") == ("metrics.example", 0)
    for bad in ("localhost", "h:70000", "[nope]:1", "a..b:1", "h:-1"):
        with pytest.raises(ValueError):
            parse_address(bad)


# ---- defaults ----

def test_defaults(tmp_path: Path) -> None:
    c = Config()
    assert (c.backend, c.socket, c.control_socket, c.vgpus_per_gpu, c.gpus, c.capacity) == (
        "cuda", None, None, 2, None, None)
    assert (c.policy, c.nvml_poll_interval, c.metrics_address, c.admin_group) == (
        "none", 1.0, "127.0.0.1:19400", "pilot-admin")
    assert (c.log_level, c.log_format, c.spin_us, c.sim_kernels) == ("info", "text", 50, ())
    assert c.capacity_per_gpu == {} and c.tenants == {} and c.switch_interval == 0.0005
    assert c.state_dir == str(tmp_path / "home" / ".local" / "state" / "pilot")
    assert load_config(None) == c  # no file at DEFAULT_CONFIG_PATH: defaults only


def test_state_dir_for_root_and_xdg(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", "/xdg/state")
    assert Config().state_dir == "/xdg/state/pilot"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/ignored")
    assert Config().state_dir.endswith("/home/.local/state/pilot")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert Config().state_dir == "/var/lib/pilot"


def test_control_socket_path_and_capacity_for() -> None:
    c = Config()
    assert c.control_socket_path("/run/pilot/pilot.sock") == "/run/pilot/control.sock"
    assert Config(control_socket="/x/c.sock").control_socket_path("/run/pilot/pilot.sock") == "/x/c.sock"
    assert c.capacity_for(0, 80 * GiB) == 80 * GiB
    c = Config(capacity="70GiB", capacity_per_gpu={1: 40 * GiB})
    assert c.capacity_for(0, 80 * GiB) == 70 * GiB
    assert c.capacity_for(1, 80 * GiB) == 40 * GiB
    assert c.metrics_host_port() == ("127.0.0.1", 19400)
    assert Config(metrics_address="").metrics_host_port() is None


def test_direct_construction_validates() -> None:
    with pytest.raises(ConfigError, match=r"^vgpus_per_gpu: 0 is not in 1\.\.64$"):
        Config(vgpus_per_gpu=0)
    with pytest.raises(ConfigError, match=r"^tenants\.Bad: tenant name"):
        Config(tenants={"Bad": TenantDef("Bad", ("a",))})
    assert Config(log_level="DEBUG").log_level == "debug"


# ---- the file ----

FULL = """
[daemon]
backend = "sim"
socket = "/s/pilot.sock"
control_socket = "ctl.sock"
vgpus_per_gpu = 4
gpus = [0, 2]
spin_us = 0
gpu_wait = "blocking"
state_dir = "/var/lib/p"
admin_group = "gpu-admins"
log_level = "debug"
log_format = "json"
sim_kernels = ["k.py", "/abs/k2.py"]

[gpu]
capacity = "70GiB"

[gpu.capacity_per_gpu]
"0" = "40GiB"
2 = "1000MB"

[policy]
name = "madvise"

[nvml]
poll_interval = "500ms"

[metrics]
address = "[::1]:9401"

[tenants.ml-team]
users = ["alice", "bob"]
groups = ["ml"]

[tenants.vision]
groups = ["cv", "cv"]
"""


def test_load_full_file(tmp_path: Path) -> None:
    c = load_config(write(tmp_path, FULL))
    assert c == Config(
        backend="sim", socket="/s/pilot.sock", control_socket=str(tmp_path / "ctl.sock"),
        vgpus_per_gpu=4, gpus=(0, 2), spin_us=0, gpu_wait="blocking", state_dir="/var/lib/p",
        admin_group="gpu-admins",
        log_level="debug", log_format="json", sim_kernels=(str(tmp_path / "k.py"), "/abs/k2.py"),
        capacity=70 * GiB, capacity_per_gpu={0: 40 * GiB, 2: 10**9}, policy="madvise",
        nvml_poll_interval=0.5, metrics_address="[::1]:9401",
        tenants={"ml-team": TenantDef("ml-team", ("alice", "bob"), ("ml",)),
                 "vision": TenantDef("vision", (), ("cv",))})


def test_gpus_all_and_default_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, '[daemon]\ngpus = "all"\nvgpus_per_gpu = 3\n')
    monkeypatch.setattr(config, "DEFAULT_CONFIG_PATH", path)
    c = load_config(None)
    assert c.gpus is None and c.vgpus_per_gpu == 3


def test_explicit_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.toml: no such file$"):
        load_config(str(tmp_path / "nope.toml"))


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[daemon\nbackend = 1\n")
    with pytest.raises(ConfigError, match=f"^{re.escape(path)}: not valid TOML"):
        load_config(path)


@pytest.mark.parametrize(("text", "message"), [
    ("[daemon]\nvgpu_per_gpu = 2", "unknown key daemon.vgpu_per_gpu (did you mean vgpus_per_gpu?)"),
    ("[daemon]\nzzz = 2", "unknown key daemon.zzz"),
    ("[deamon]\nbackend = 'sim'", "unknown section [deamon] (did you mean daemon?)"),
    ("backend = 'sim'", "unknown key backend"),
    ("daemon = 1", "daemon: must be a table"),
    ("[gpu]\ncapacity = '8 Gigs'", "gpu.capacity: '8 Gigs' is not a size"),
    ("[gpu]\ncapacity = 0", "gpu.capacity: 0 bytes is below the 1 MiB floor for a capacity"),
    ("[gpu]\ncapacity = 8", 'gpu.capacity: 8 has no unit: write "8GiB", "8MiB", ... ("8B" if'),
    ("[gpu]\ncapacity = 8e9", "gpu.capacity: 8000000000.0 has no unit"),
    ("[gpu]\ncapacity = '8'", "gpu.capacity: '8' has no unit"),
    ("[gpu]\ncapacity = '512KiB'", "gpu.capacity: 524288 bytes is below the 1 MiB floor"),
    ("[gpu.capacity_per_gpu]\n'0' = 40", "gpu.capacity_per_gpu.0: 40 has no unit"),
    ("[gpu.capacity_per_gpu]\n'0' = '40KB'", "gpu.capacity_per_gpu.0: 40000 bytes is below the 1 MiB"),
    ("[pinned]\nlimit_per_tenant = 4096", "pinned.limit_per_tenant: 4096 has no unit"),
    ("[gpu]\ncapcity = '8GiB'", "unknown key gpu.capcity (did you mean capacity?)"),
    ("[gpu.capacity_per_gpu]\nx = '1GiB'", "gpu.capacity_per_gpu.x: 'x' is not a GPU index"),
    ("[gpu.capacity_per_gpu]\n0 = '-1GiB'", "gpu.capacity_per_gpu.0: '-1GiB' is not a size"),
    ("[daemon]\nbackend = 'gpu'", "daemon.backend: 'gpu' is not one of cuda, sim"),
    ("[daemon]\nvgpus_per_gpu = 65", "daemon.vgpus_per_gpu: 65 is not in 1..64"),
    ("[daemon]\nvgpus_per_gpu = true", "daemon.vgpus_per_gpu: True is not an integer"),
    ("[daemon]\nspin_us = 10001", "daemon.spin_us: 10001 is not in 0..10000"),
    ("[daemon]\ngpu_wait = 'sleep'", "daemon.gpu_wait: 'sleep' is not one of auto, spin, yield, blocking"),
    ("[daemon]\nswitch_interval = '1s'", "daemon.switch_interval: '1s' is out of range"),
    ("[daemon]\nswitch_interval = 0", "daemon.switch_interval: 0 is out of range"),
    ("[daemon]\ngpus = 'some'", "daemon.gpus: 'some' is not \"all\""),
    ("[daemon]\ngpus = []", "daemon.gpus: empty list"),
    ("[daemon]\ngpus = [0, 0]", "daemon.gpus: [0, 0] lists a GPU twice"),
    ("[daemon]\ngpus = [-1]", "daemon.gpus: -1 is not a GPU index"),
    ("[daemon]\nsocket = ''", "daemon.socket: '' is not a non-empty string"),
    ("[daemon]\nstate_dir = 3", "daemon.state_dir: 3 is not a non-empty string"),
    ("[daemon]\nlog_level = 'verbose'", "daemon.log_level: 'verbose' is not one of"),
    ("[daemon]\nlog_format = 'jsn'",
     "daemon.log_format: 'jsn' is not one of text, json (did you mean json?)"),
    ("[daemon]\nsim_kernels = 'k.py'", "daemon.sim_kernels: 'k.py' is not a list of paths"),
    ("[policy]\nname = 'Not A Name'", "policy.name: 'Not A Name' is not a policy name"),
    ("[policy]\npolicy = 'mfit'", "unknown key policy.policy"),
    ("[nvml]\npoll_interval = '0s'", "nvml.poll_interval: '0s': must be above 0"),
    ("[nvml]\npoll_interval = 'often'", "nvml.poll_interval: 'often' is not a duration"),
    ("[metrics]\naddress = 'localhost'", "metrics.address: 'localhost' is not host:port"),
    ("[tenants.Ml]\nusers = ['a']", "tenants.Ml: tenant name 'Ml' must match"),
    ("[tenants._x]\nusers = ['a']", "tenants._x: tenant name '_x' must match"),
    ("[tenants.ml]\nuser = ['a']", "unknown key tenants.ml.user (did you mean users?)"),
    ("[tenants.ml]\nusers = 'a'", "tenants.ml.users: 'a' is not a list of user names"),
    ("[tenants.ml]\ngroups = ['a b']", "tenants.ml.groups: 'a b' is not a group name"),
    ("[tenants.ml]\n", "tenants.ml: a tenant needs at least one user or group"),
    ("tenants = 1", "tenants: must be a table"),
    ("[tenants.a]\nusers = ['x']\n[tenants.b]\nusers = ['y', 'x']",
     "tenants.b.users: user 'x' is already in tenant 'a'"),
    ("[tenants.a]\ngroups = ['g']\n[tenants.b]\ngroups = ['g']",
     "tenants.b.groups: group 'g' is already in tenant 'a'"),
])
def test_errors_name_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: {message}"), str(info.value)


def test_same_user_may_be_named_as_user_and_group(tmp_path: Path) -> None:
    """Users and groups are separate name spaces: a user "ml" and a group "ml" may differ."""
    c = load_config(write(tmp_path, "[tenants.a]\nusers = ['ml']\n[tenants.b]\ngroups = ['ml']\n"))
    assert set(c.tenants) == {"a", "b"}


# ---- overrides ----

def test_overrides_win_and_none_is_ignored(tmp_path: Path) -> None:
    path = write(tmp_path, "[daemon]\nvgpus_per_gpu = 4\nbackend = 'sim'\n[gpu]\ncapacity = '1GiB'\n")
    c = load_config(path, {"vgpus_per_gpu": 8, "backend": None, "capacity": "2GiB",
                           "gpus": (1,), "nvml_poll_interval": "2s", "socket": "rel.sock"})
    assert (c.vgpus_per_gpu, c.backend, c.capacity, c.gpus) == (8, "sim", 2 * GiB, (1,))
    assert c.nvml_poll_interval == 2.0
    assert c.socket == "rel.sock"  # command-line paths stay as given (relative to the cwd)


def test_override_errors_name_the_option(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^command line: --vgpus-per-gpu: 0 is not in 1\.\.64$"):
        load_config(None, {"vgpus_per_gpu": 0})
    with pytest.raises(ConfigError, match=r"^command line: unknown key vgpu_per_gpu \(did you mean "
                                          r"vgpus_per_gpu\?\)$"):
        load_config(None, {"vgpu_per_gpu": 2})


def test_every_mistake_of_a_file_is_reported_in_one_pass(tmp_path: Path) -> None:
    """An operator fixing a file sees all of its mistakes at once, one line each: unknown names,
    then bad values, in file order, then the command line's."""
    path = write(tmp_path, "[daemon]\nvgpus_per_gpu = 0\nzzz = 1\n[gpu]\ncapacity = 8\n"
                           "[policy]\nname = 'MFit'\n[deamon]\nx = 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, {"spin_us": -1})
    assert str(info.value).splitlines() == [
        f"{path}: unknown key daemon.zzz",
        f"{path}: unknown section [deamon] (did you mean daemon?)",
        f"{path}: daemon.vgpus_per_gpu: 0 is not in 1..64",
        f'{path}: gpu.capacity: 8 has no unit: write "8GiB", "8MiB", ... ("8B" if you mean bytes)',
        "command line: --spin-us: -1 is not in 0..10000"]


def test_every_mistake_in_tenant_tables_is_reported(tmp_path: Path) -> None:
    path = write(tmp_path, "[tenants.a]\nusers = ['x']\nsm_share = 101\nuser = 1\n"
                           "[tenants.b]\nusers = ['x']\n[tenants.C]\nusers = ['y']\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).splitlines() == [
        f"{path}: unknown key tenants.a.user (did you mean users?)",
        f"{path}: tenants.a.sm_share: 101 is not a percentage from 1 to 100",
        f"{path}: tenants.b.users: user 'x' is already in tenant 'a'",
        f"{path}: tenants.C: tenant name 'C' must match {config.TENANT_NAME.pattern}"]


def test_shares_over_100_percent_of_a_gpu_are_refused(tmp_path: Path) -> None:
    text = "[tenants.a]\nusers = ['x']\nsm_share = 90\n[tenants.b]\nusers = ['y']\nsm_share = {}\n"
    with pytest.raises(ConfigError, match=r"tenants: sm_share adds up to 170% of each GPU \(a 90%, "
                                          r"b 80%\): at most 100%$"):
        load_config(write(tmp_path, text.format(80)))
    c = load_config(write(tmp_path, text.format(10)))
    assert (c.tenants["a"].sm_share, c.tenants["b"].sm_share) == (90, 10)
    assert load_config(write(tmp_path, text.format(100))).tenants["b"].sm_share == 100  # no cap


def test_loop_level_preemption_is_chosen_per_tenant_or_program(tmp_path: Path) -> None:
    c = load_config(write(tmp_path, "[tenants.sim]\nusers = ['x']\nloop_preempt = true\n"
                                    "[tenants.web]\nusers = ['y']\n"
                                    "[priority]\nloop_preempt_programs = ['jacobi', '/opt/bin/lbm']\n"))
    assert (c.tenants["sim"].loop_preempt, c.tenants["web"].loop_preempt) == (True, False)
    assert c.priority_loop_preempt_programs == ("jacobi", "/opt/bin/lbm")
    assert load_config(None).priority_loop_preempt_programs == ()  # off by default
    with pytest.raises(ConfigError, match=r"tenants.sim.loop_preempt: 'yes' is not true or false"):
        load_config(write(tmp_path, "[tenants.sim]\nusers = ['x']\nloop_preempt = 'yes'\n"))
    with pytest.raises(ConfigError, match=r"priority.loop_preempt_programs: 'lbm' is not a list"):
        load_config(write(tmp_path, "[priority]\nloop_preempt_programs = 'lbm'\n"))


def test_preemptible_parts_of_a_launch(tmp_path: Path) -> None:
    assert load_config(None).priority_preempt_parts == 1  # preempted once, the rest runs
    assert load_config(write(tmp_path, "[priority]\npreempt_parts = 4\n")).priority_preempt_parts == 4
    for bad in ("0", "17", "'many'"):
        with pytest.raises(ConfigError, match=r"priority.preempt_parts"):
            load_config(write(tmp_path, f"[priority]\npreempt_parts = {bad}\n"))


@pytest.mark.parametrize("name", ["MFit", "mfit", "MADVISE", "AMFit"])
def test_policy_names_take_any_case(tmp_path: Path, name: str) -> None:
    c = load_config(write(tmp_path, f"[policy]\nname = '{name}'\n"), {"policy": None})
    assert c.policy == name.lower() and c.policy in policies.available()
    assert load_config(None, {"policy": name}).policy == name.lower()


# ---- the shipped example ----

def test_example_file_loads_as_the_defaults() -> None:
    assert load_config(str(EXAMPLE)) == Config()


def test_every_example_setting_is_valid(tmp_path: Path) -> None:
    """Uncommenting every `#key = value` / `#[table]` line of the example still loads, and each
    documented default is the real default."""
    text = EXAMPLE.read_text()
    settings = re.compile(r'(?m)^#(?=\[|"?[a-z0-9_]+"?\s*=)')
    assert len(settings.findall(text)) >= 20
    c = load_config(write(tmp_path, settings.sub("", text)))
    assert c.tenants == {"ml-team": TenantDef("ml-team", ("alice", "bob"), ("ml",), 25, "high")}
    assert c.capacity == 70 * GiB and c.capacity_per_gpu == {0: 40 * GiB}
    assert c.managed_limit == 80 * GiB  # an example value: the default is the card's memory
    assert c.isolation_capacity == 8 * GiB  # an example value: the default is a quarter
    # each policy's documented knobs are its defaults (madvise's budget and salus's capacity are
    # example values)
    assert set(c.policy_settings) == {"mfit", "amfit", "madvise", "salus"}
    for name, table in c.policy_settings.items():
        documented = policies.create(name, table).settings
        default = policies.create(name).settings
        diff = {k for k in table if getattr(documented, k) != getattr(default, k)}
        assert diff <= {"budget", "capacity"}, (name, diff)
    defaults = Config(socket="/run/pilot/pilot.sock", control_socket="/run/pilot/control.sock",
                      state_dir="/var/lib/pilot", capacity=c.capacity,
                      capacity_per_gpu=c.capacity_per_gpu, tenants=c.tenants,
                      managed_limit=c.managed_limit, policy_settings=c.policy_settings,
                      isolation_capacity=c.isolation_capacity)
    assert c == defaults


def test_switch_interval_takes_durations(tmp_path: Path) -> None:
    path = tmp_path / "pilotd.toml"
    path.write_text("[daemon]\nswitch_interval = '500us'\n")
    assert load_config(str(path)).switch_interval == 0.0005


def test_issue27_limits_and_opt_ins(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, '[limits]\nsessions_per_uid = 4\nconnections = 100\n'
                                      'connections_per_uid = 10\nmax_frame = "16KiB"\n'
                                      '[pinned]\ntenant_fraction = 0.5\n[metrics]\ntenant_labels = true\n'
                                      '[daemon]\ncallback_hold_total = "1m"\nvgpus_per_tenant = 3\n'))
    assert (cfg.sessions_per_uid, cfg.connections, cfg.connections_per_uid, cfg.max_frame) == (
        4, 100, 10, 16 << 10)
    assert (cfg.pinned_tenant_fraction, cfg.metrics_tenant_labels) == (0.5, True)
    assert (cfg.callback_hold_total, cfg.vgpus_per_tenant) == (60.0, 3)
    defaults = load_config(None)
    assert not defaults.metrics_tenant_labels and defaults.pinned_tenant_fraction == 0.25
    for bad in ("[pinned]\ntenant_fraction = 0\n", '[limits]\nmax_frame = "1GiB"\n'):
        with pytest.raises(ConfigError):
            load_config(write(tmp_path, bad))


def test_gpu_wait_and_mps_reach_the_cuda_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """`[daemon] gpu_wait` is handed to CudaBackend, which sets the contexts' schedule (checked on
    the GPU by tests/gpu/backend_cuda_smoke.py, step gpu_wait); the sim takes none."""
    import pilot.daemon.backends.cuda as cuda_backend
    from pilot.daemon.main import make_backend

    made: list[tuple[object, str, bool]] = []

    class Recorder:
        def __init__(self, devices: object = None, gpu_wait: str = "auto", mps: bool = False) -> None:
            made.append((devices, gpu_wait, mps))

    monkeypatch.setattr(cuda_backend, "CudaBackend", Recorder)
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    # [isolation] mps: it checks its contexts are clients, and leaves MPS's hardware queues alone
    # (each client takes that many of the server's: fewer clients with more)
    make_backend("cuda", (), None, mps=True)
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in os.environ
    make_backend("cuda", (), (1,), 1, "blocking")
    assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
    make_backend("cuda", (), None)
    assert made == [(None, "auto", True), ([1], "blocking", False), (None, "auto", False)]


def test_isolation_mps_settings(tmp_path: Path) -> None:
    """[isolation] mps and mps_control (router/mps.py); `confined` is tenants = "all" with mps."""
    c = load_config(write(tmp_path, '[isolation]\ntenants = "all"\nmps = true\n'
                                    'mps_control = "bin/mps-control"\n'))
    assert c.isolation_mps and c.confined
    assert c.isolation_mps_control == str(tmp_path / "bin" / "mps-control")  # beside the file
    bare = load_config(write(tmp_path, '[isolation]\nmps = true\nmps_control = "my-mps"\n'))
    assert bare.isolation_mps_control == "my-mps" and not bare.confined  # looked up on PATH
    defaults = load_config(None)
    assert not defaults.isolation_mps and not defaults.confined
    assert defaults.isolation_mps_control == "nvidia-cuda-mps-control"
    assert not Config(isolation_tenants=("all",)).confined  # isolated, but not over MPS
    for bad, key in (('mps = "yes"', "isolation.mps"),
                     ('mps_control = "mps -d"', "isolation.mps_control"),
                     ('mps_control = ""', "isolation.mps_control")):
        with pytest.raises(ConfigError, match=re.escape(key)):
            load_config(write(tmp_path, f"[isolation]\n{bad}\n"))


def test_preempt_chaos_is_a_duration_and_off_by_default(tmp_path: Path) -> None:
    assert load_config(None).priority_preempt_chaos == 0.0
    c = load_config(write(tmp_path, '[priority]\npreempt_chaos = "2ms"\n'))
    assert c.priority_preempt_chaos == pytest.approx(0.002)
    with pytest.raises(ConfigError):
        load_config(write(tmp_path, '[priority]\npreempt_chaos = "soon"\n'))
