"""deploy/: the systemd unit, the profile.d snippet and the operator's guide stay correct.

The unit is checked two ways: `systemd-analyze verify` (systemd's own parser: unknown keys, bad
values, a missing binary) on a copy whose ExecStart is /bin/true, since pilotd is not installed
at /usr/local/bin here; and textually, for the settings pilotd depends on and against options
that would break CUDA or tenant identity.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pilot.daemon.config import DEFAULT_CONFIG_PATH
from pilot.daemon.sessions.staging import SHM_DIR

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
UNIT = DEPLOY / "pilotd.service"
SNIPPET = DEPLOY / "pilot.sh"


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """section -> key -> every value assigned (systemd allows repeated keys)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"assignment outside a section: {raw!r}"
        assert "=" in line, f"not an assignment: {raw!r}"
        key, value = line.split("=", 1)
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


@pytest.fixture(scope="module")
def service() -> dict[str, list[str]]:
    return parse_unit(UNIT.read_text())["Service"]


def one(service: dict[str, list[str]], key: str) -> str:
    values = service.get(key)
    assert values and len(values) == 1, f"{key}: expected one value, got {values}"
    return values[0]


@pytest.mark.parametrize("key, value", [
    ("Type", "notify"),
    ("NotifyAccess", "main"),
    ("WatchdogSec", "30s"),
    ("Restart", "on-failure"),
    ("RuntimeDirectory", "pilot"),
    ("RuntimeDirectoryMode", "0755"),
    ("StateDirectory", "pilot"),
    ("StateDirectoryMode", "0700"),
    ("KillSignal", "SIGTERM"),
    ("TimeoutStopSec", "30s"),
    ("NoNewPrivileges", "yes"),
    ("ProtectSystem", "strict"),
    ("ProtectHome", "read-only"),
    ("PrivateTmp", "yes"),
    ("ProtectKernelTunables", "yes"),
    ("ProtectKernelModules", "yes"),
    ("ProtectControlGroups", "yes"),
    ("LockPersonality", "yes"),
    ("RestrictRealtime", "yes"),
    ("SystemCallArchitectures", "native"),
    ("DevicePolicy", "closed"),
    ("MemoryHigh", "70%"),  # issue 12: a root daemon facing untrusted users has bounds
    ("MemoryMax", "80%"),
    ("TasksMax", "4096"),
    ("LimitCORE", "0"),
])
def test_unit_setting(service: dict[str, list[str]], key: str, value: str) -> None:
    assert one(service, key) == value


def test_exec_start_uses_the_default_config(service: dict[str, list[str]]) -> None:
    argv = one(service, "ExecStart").split()
    assert argv[0] == "/usr/local/bin/pilotd"
    assert argv[1:] == ["--config", DEFAULT_CONFIG_PATH]


def test_writable_paths_cover_sockets_state_and_staging(service: dict[str, list[str]]) -> None:
    paths = " ".join(service["ReadWritePaths"]).split()
    assert {"/run/pilot", "/var/lib/pilot", SHM_DIR} <= set(paths)


def test_devices_and_address_families(service: dict[str, list[str]]) -> None:
    assert any(v.split()[0] == "char-nvidia*" and "rw" in v.split()[1:] for v in service["DeviceAllow"])
    families = set(one(service, "RestrictAddressFamilies").split())
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= families  # clients and pilotctl; metrics over TCP


@pytest.mark.parametrize("key", [
    "MemoryDenyWriteExecute",  # the CUDA driver JIT-compiles and maps code
    "PrivateDevices",          # hides /dev/nvidia*
    "PrivateUsers",            # tenants' uids would all read as nobody
    "ProcSubset",              # hides /proc/driver/nvidia
    "ProtectProc",             # clients' /proc/<pid>
    "DynamicUser", "User",     # pilotd chowns staging files to clients: root
])
def test_unit_leaves_out_what_breaks_cuda_or_identity(service: dict[str, list[str]], key: str) -> None:
    assert key not in service


def test_install_section() -> None:
    assert parse_unit(UNIT.read_text())["Install"]["WantedBy"] == ["multi-user.target"]


def _verify(unit_text: str, tmp_path: Path) -> list[str]:
    """Lines that `systemd-analyze verify` printed about the unit (it exits 0 on mere warnings
    such as an unknown key, so those are what must be empty)."""
    copy = tmp_path / "pilotd.service"
    copy.write_text(unit_text)
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no", str(copy)],
                          capture_output=True, text=True, timeout=120)
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "pilotd.service" in ln]
    if proc.returncode != 0:
        lines.append(f"exit status {proc.returncode}: {proc.stderr.strip()}")
    return lines


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze not installed (Debian: apt-get install -y systemd)")
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    text = re.sub(r"(?m)^ExecStart=\S+", "ExecStart=/bin/true", UNIT.read_text())
    assert "ExecStart=/bin/true --config" in text
    assert _verify(text, tmp_path) == []
    # the check itself can fail: a bad value is reported (verify exits 0 on it)
    broken = text.replace("WatchdogSec=30s", "WatchdogSec=thirty")
    assert any("WatchdogSec" in ln or "sec value" in ln for ln in _verify(broken, tmp_path))


# ---- /etc/profile.d/pilot.sh ----

SHELLS = [s for s in ("sh", "dash", "bash") if shutil.which(s)]


def _libc() -> str:
    """The C library this process runs on: preloading it again changes nothing, so the shells
    below can export it as the "shim" and still start programs cleanly."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if re.search(r"/libc(\.so\.6|-[\d.]+\.so)$", path):
            return path
    pytest.skip("no glibc found in /proc/self/maps")


@pytest.fixture
def fake_pilot(tmp_path: Path) -> tuple[Path, Path]:
    """A `pilot` on PATH whose shim-path prints an existing, loadable library (and counts its
    calls)."""
    bindir, lib = tmp_path / "bin", tmp_path / "lib" / "libpilot.so"
    bindir.mkdir()
    lib.parent.mkdir()
    lib.symlink_to(_libc())
    script = bindir / "pilot"
    script.write_text(f'#!/bin/sh\necho x >> "{tmp_path}/calls"\n'
                      f'[ "$1" = shim-path ] && echo "{lib}"\n')
    script.chmod(0o755)
    return bindir, lib


def source(shell: str, bindir: Path | None, env: dict[str, str], then: str) -> str:
    path = f"{bindir}:/usr/bin:/bin" if bindir else "/usr/bin:/bin"
    proc = subprocess.run([shell, "-eu", "-c", f". '{SNIPPET}'; {then}"], capture_output=True,
                          text=True, timeout=30, env={"PATH": path, **env})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    return proc.stdout


@pytest.mark.parametrize("shell", SHELLS)
def test_snippet_preloads_nothing_by_default(shell: str, fake_pilot: tuple[Path, Path],
                                             tmp_path: Path) -> None:
    bindir, _ = fake_pilot
    out = source(shell, bindir, {}, 'echo "[${LD_PRELOAD:-}]"; alias pilot-run')
    assert out.splitlines()[0] == "[]"
    assert "pilot run --" in out.splitlines()[1]
    assert not (tmp_path / "calls").exists()  # no Python started for a plain login


@pytest.mark.parametrize("shell", SHELLS)
def test_snippet_opt_in_preload(shell: str, fake_pilot: tuple[Path, Path]) -> None:
    bindir, lib = fake_pilot
    env = {"PILOT_AUTO_PRELOAD": "1"}
    assert source(shell, bindir, env, 'echo "$LD_PRELOAD"').strip() == str(lib)
    # kept in front of an existing preload, and not doubled by a nested login shell
    env["LD_PRELOAD"] = "libm.so.6"
    out = source(shell, bindir, env, f". '{SNIPPET}'; echo \"$LD_PRELOAD\"")
    assert out.strip() == f"{lib} libm.so.6"


@pytest.mark.parametrize("shell", SHELLS)
def test_snippet_without_pilot_is_harmless(shell: str) -> None:
    if os.path.exists("/opt/pilot/bin/pilot"):
        pytest.skip("a system pilot is installed in /opt/pilot")
    out = source(shell, None, {"PILOT_AUTO_PRELOAD": "1"},
                 'echo "[${LD_PRELOAD:-}]"; alias pilot-run 2>/dev/null || echo no-alias')
    assert out.split() == ["[]", "no-alias"]


# ---- deploy/README.md ----

def test_readme_names_only_real_pilotctl_commands() -> None:
    from pilot.cli.pilotctl import main as pilotctl

    text = (DEPLOY / "README.md").read_text()
    used = set(re.findall(r"pilotctl (\w+)(?: (set|get|list|unset)\b)?", text))
    assert used, "the guide shows no pilotctl command"
    for cmd, sub in used:
        assert cmd in pilotctl.commands, f"README uses `pilotctl {cmd}`"
        if sub:
            assert sub in pilotctl.commands[cmd].commands, f"README uses `pilotctl {cmd} {sub}`"
    for name in ("pilotd.service", "pilotd.toml", "pilot.sh"):
        assert name in text and (DEPLOY / name).exists()
