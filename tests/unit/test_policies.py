"""The policy interface (policies/): registry, plugins, knobs, views, decisions, the base class and
the example plugin tests/policies_examples/hold_file.py. Pure Python, no daemon, no GPU."""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pilot import policies
from pilot.policies import (
    RUN,
    AllocationView,
    Bytes,
    Decision,
    KernelView,
    LaunchView,
    NonePolicy,
    NvmlView,
    Policy,
    PolicyConfigError,
    RangeView,
    Seconds,
    SessionView,
    UnknownPolicy,
    Verdict,
    available,
    create,
    load_plugin,
    parse_settings,
    register,
)
from pilot.policies import registry as reg

HOLD_FILE = Path(__file__).resolve().parents[1] / "policies_examples" / "hold_file.py"
BUILTINS = ["amfit", "madvise", "mfit", "none", "salus"]
PLANNED: list[str] = []


@pytest.fixture(autouse=True)
def clean_registry() -> Iterator[None]:
    """Each test sees the built-ins only, and what it registers is gone after it."""
    saved, saved_plugins = dict(reg._registry), dict(reg._plugin_modules)
    for name, cls in saved.items():
        if not cls.__module__.startswith("pilot.policies."):
            del reg._registry[name]  # a plugin some other test loaded
    yield
    reg._registry.clear()
    reg._registry.update(saved)
    reg._plugin_modules.clear()
    reg._plugin_modules.update(saved_plugins)


def launch(footprint: tuple[RangeView, ...] = (), attempts: int = 1) -> LaunchView:
    return LaunchView(id=7, session=3, tenant="a", pid=100, gpu=0, vgpu=1, kernel="k",
                      grid=(1, 1, 1), block=(32, 1, 1), stream=0, footprint=footprint,
                      requested_at=10.0, now=12.5, attempts=attempts)


def plugin_error(spec: object, rest: str) -> str:
    """The pattern of load_plugin's message for `spec` followed by `rest` (a regex)."""
    return rf"^policy plugin {re.escape(str(spec))}: {rest}"


# ---- registry ----

def test_builtins() -> None:
    names = available()
    assert list(names) == BUILTINS
    assert names["none"] is NonePolicy and NonePolicy.implemented
    assert [n for n, c in names.items() if not c.implemented] == PLANNED
    assert all(c.summary and c.name == n for n, c in names.items())
    assert policies.DEFAULT == "none"
    assert not (NonePolicy.decides_launches or NonePolicy.needs_footprint or NonePolicy.needs_kernel_end)


def test_create_none() -> None:
    p = create("none")
    assert type(p) is NonePolicy and p.settings is None
    assert create("none", {}).settings is None


def test_unknown_name() -> None:
    with pytest.raises(UnknownPolicy) as e:
        create("nonee")
    msg = str(e.value)
    assert "'nonee'" in msg and "did you mean 'none'" in msg
    assert "available: 'amfit', 'madvise', 'mfit', 'none', 'salus'" in msg
    assert "not implemented yet" not in msg
    assert isinstance(e.value, PolicyConfigError) and isinstance(e.value, ValueError)


def test_unimplemented_refused() -> None:
    class Later(Policy):
        name = "later-design"
        summary = "a design name only"
        implemented = False

    register(Later)
    try:
        with pytest.raises(UnknownPolicy, match=r"'later-design' .* is not implemented in this"):
            create("later-design")
        with pytest.raises(UnknownPolicy, match=r"not implemented yet: 'later-design'"):
            create("nonee")
    finally:
        reg._registry.pop("later-design")


def test_register_refusals() -> None:
    class Dup(Policy):
        name = "none"

    taken = r"name 'none' .* is taken by pilot\.policies\.none\.NonePolicy"
    with pytest.raises(PolicyConfigError, match=taken):
        register(Dup)
    assert available()["none"] is NonePolicy
    assert register(NonePolicy) is NonePolicy  # the same class again: harmless

    for bad in ("", "Upper", "has space", "dot.ted", "-lead"):
        cls = type("Bad", (Policy,), {"name": bad})
        with pytest.raises(PolicyConfigError, match="must be lower case"):
            register(cls)
    with pytest.raises(PolicyConfigError, match="not a Policy subclass"):
        register(object)  # type: ignore[type-var]


def test_register_and_create_custom() -> None:
    @register
    class Mine(Policy):
        name = "mine"
        summary = "test"

    assert "mine" in available() and list(available()) == sorted(available())
    assert isinstance(create("mine"), Mine)


# ---- plugins ----

def test_plugin_by_path() -> None:
    assert load_plugin(str(HOLD_FILE)) == ("hold-file",)
    assert load_plugin(str(HOLD_FILE)) == ("hold-file",)  # again: nothing more
    assert available()["hold-file"].decides_launches


def test_plugin_by_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pol_by_module.py").write_text(
        "from pilot.policies import Policy, register\n"
        "@register\n"
        "class A(Policy):\n    name = 'mod-a'\n"
        "@register\n"
        "class B(Policy):\n    name = 'mod-b'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "pol_by_module", raising=False)
    assert load_plugin("pol_by_module") == ("mod-a", "mod-b")
    assert load_plugin("pol_by_module") == ("mod-a", "mod-b")
    assert create("mod-b").name == "mod-b"
    sys.modules.pop("pol_by_module", None)


def test_plugin_errors(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.py")
    with pytest.raises(PolicyConfigError, match=plugin_error(missing, r"no such file")):
        load_plugin(missing)
    with pytest.raises(PolicyConfigError, match=r"policy plugin no_such_mod_xyz: ModuleNotFoundError"):
        load_plugin("no_such_mod_xyz")
    with pytest.raises(PolicyConfigError, match=r"'a b': not a module name nor a \.py path"):
        load_plugin("a b")

    broken = tmp_path / "broken.py"
    broken.write_text("from pilot.policies import Policy, register\n"
                      "@register\nclass A(Policy):\n    name = 'half'\n"
                      "raise RuntimeError('boom')\n")
    with pytest.raises(PolicyConfigError, match=plugin_error(broken, r"RuntimeError: boom")):
        load_plugin(str(broken))
    assert "half" not in available()  # what it registered before failing is undone

    dup = tmp_path / "dup.py"
    dup.write_text("from pilot.policies import Policy, register\n"
                   "@register\nclass N(Policy):\n    name = 'none'\n")
    with pytest.raises(PolicyConfigError, match=plugin_error(dup, r"register: policy name 'none'")):
        load_plugin(str(dup))
    assert available()["none"] is NonePolicy

    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(PolicyConfigError, match=plugin_error(empty, r"registers no policy")):
        load_plugin(str(empty))


# ---- knobs ----

@dataclasses.dataclass(frozen=True, slots=True)
class Knobs:
    flag: bool = False
    count: int = 1
    ratio: float = 0.5
    label: str = "x"
    budget: Bytes = 0
    wait: Seconds = 1.0
    limit: int | None = None
    tenants: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ValueError(f"count must be >= 0, not {self.count}")


class Knobbed(Policy):
    name = "knobbed"
    Settings = Knobs


class Required(Policy):
    name = "required"

    @dataclasses.dataclass(frozen=True, slots=True)
    class Settings:
        path: str


def test_settings_parsed() -> None:
    s = parse_settings(Knobbed, {"flag": True, "count": 3, "ratio": 2, "label": "y", "budget": "8GiB",
                                 "wait": "250ms", "limit": 5, "tenants": ["a", "b"]})
    assert s == Knobs(True, 3, 2.0, "y", 8 * 2**30, 0.25, 5, ("a", "b"))
    assert isinstance(s.ratio, float)
    assert parse_settings(Knobbed, None) == Knobs() == Knobbed.parse_settings({})
    assert parse_settings(Knobbed, {"budget": "4096B", "wait": 2}) == Knobs(budget=4096, wait=2.0)
    assert parse_settings(Knobbed, {"budget": 0}).budget == 0
    assert parse_settings(Knobbed, {"budget": "0"}).budget == 0
    s = parse_settings(Knobbed, {"budget": "1.5GB", "wait": "1m"})
    assert s == Knobs(budget=1_500_000_000, wait=60.0)
    assert parse_settings(NonePolicy, {}) is None


@pytest.mark.parametrize(("key", "value", "why"), [
    ("flag", 1, "expected true or false, got 1"),
    ("count", True, "expected an integer, got True"),
    ("count", 1.5, "expected an integer"),
    ("ratio", "2", "expected a finite number"),
    ("ratio", float("nan"), "expected a finite number"),
    ("label", 3, "expected a string, got 3 \\(int\\)"),
    ("budget", "8G", "expected a size"),
    ("budget", -1, "expected a size"),
    ("budget", "1.5B", "expected whole bytes"),
    ("budget", 4096, "expected a size with a unit"),
    ("budget", "4096", "expected a size with a unit"),
    ("budget", "8gb", "expected a size with a unit"),
    ("wait", "2 days", "expected a duration"),
    ("limit", "5", "expected an integer"),
    ("tenants", "a", "expected an array"),
    ("tenants", ["a", 1], "array item: expected a string"),
])
def test_settings_wrong_type(key: str, value: object, why: str) -> None:
    with pytest.raises(PolicyConfigError, match=rf"^policy\.knobbed\.{key}: {why}"):
        parse_settings(Knobbed, {key: value})


def test_settings_refusals() -> None:
    with pytest.raises(PolicyConfigError,
                       match=r"^policy\.knobbed: unknown key 'cuont' \(did you mean 'count'\?\)"):
        parse_settings(Knobbed, {"cuont": 1})
    with pytest.raises(PolicyConfigError, match=r"^policy\.knobbed: unknown key 'zzz' \(known: flag, count"):
        parse_settings(Knobbed, {"zzz": 1})
    with pytest.raises(PolicyConfigError,
                       match=r"^policy\.none: unknown key 'x' \(this policy has no settings\)"):
        create("none", {"x": 1})
    with pytest.raises(PolicyConfigError, match=r"^policy\.knobbed: count must be >= 0, not -1"):
        parse_settings(Knobbed, {"count": -1})
    with pytest.raises(PolicyConfigError, match=r"^policy\.required: missing key 'path' \(required\)"):
        parse_settings(Required, {})
    with pytest.raises(PolicyConfigError, match="missing key 'path'"):
        Required()  # no settings given: the defaults, and `path` has none
    assert Required(Required.parse_settings({"path": "/p"})).settings.path == "/p"
    assert Knobbed().settings == Knobs()


def test_settings_class_checked_at_register() -> None:
    @dataclasses.dataclass
    class Mutable:
        x: int = 0

    @dataclasses.dataclass(frozen=True)
    class Listy:
        x: list[int] = dataclasses.field(default_factory=list)

    for settings, why in ((Mutable, "Settings must be a frozen dataclass"),
                          (Listy, "unsupported knob type")):
        cls = type("P", (Policy,), {"name": "p", "Settings": settings})
        with pytest.raises(PolicyConfigError, match=rf"policy p: .*{why}"):
            register(cls)
    assert "p" not in available()


# ---- views and decisions ----

def test_views() -> None:
    fp = (RangeView(0x1000, 100, "device"), RangeView(0x2000, 300, "managed"),
          RangeView(0x3000, 50, "managed"))
    v = launch(fp)
    assert (v.footprint_bytes, v.managed_bytes, v.waited_s) == (450, 350, 2.5)
    assert (launch().footprint_bytes, launch().managed_bytes) == (0, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.attempts = 2  # type: ignore[misc]
    for view in (v, fp[0], SessionView(1, "a", 2, 0, 0), AllocationView(1, "a", 0, "pitch", 16, 32),
                 KernelView(7, 3, "a", 0, "k", 1.0, 2.0), NvmlView(0, 100, 50, None),
                 policies.GpuView(0, 100, 10)):
        assert not hasattr(view, "__dict__")  # slots
    assert policies.ALLOCATION_KINDS == ("device", "pitch", "managed", "module", "limit", "pinned",
                                        "array")


def test_decisions() -> None:
    assert Decision.run() is RUN and RUN.verdict is Verdict.RUN and RUN.reason == ""
    assert Decision.run("fits") == Decision(Verdict.RUN, "fits")
    w = Decision.wait("no room")
    assert (w.verdict, w.reason, w.error) == (Verdict.WAIT, "no room", 2)
    r = Decision.refuse("too big", error=700)
    assert (r.verdict, r.reason, r.error) == (Verdict.REFUSE, "too big", 700)
    assert [v.value for v in Verdict] == ["run", "wait", "refuse"]
    for bad in (0, -1, True, "2"):
        with pytest.raises((ValueError, TypeError)):
            Decision.wait("x", error=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Decision("run")  # type: ignore[arg-type]


def test_base_class_defaults() -> None:
    p = Policy()
    assert p.settings is None and p.state() == {}
    assert not (Policy.implemented is False or Policy.decides_launches or Policy.needs_footprint
                or Policy.needs_kernel_end or Policy.Settings)
    s, a = SessionView(1, "a", 2, 0, 0), AllocationView(1, "a", 0, "device", 16, 32)
    for call in (lambda: p.session_started(s), lambda: p.session_ended(s), lambda: p.allocated(a),
                 lambda: p.freed(a), lambda: p.launch_started(launch()),
                 lambda: p.launch_dropped(launch(), "timeout"),
                 lambda: p.kernel_finished(KernelView(7, 3, "a", 0, "k", 1.0, 2.0)),
                 lambda: p.nvml_reading(NvmlView(0, 100, 50, 3)), lambda: p.tick(1.0)):
        assert call() is None
    assert p.launch_requested(launch()) is RUN
    assert "timeout" in policies.DROP_REASONS


# ---- the example plugin ----

def test_hold_file(tmp_path: Path) -> None:
    load_plugin(str(HOLD_FILE))
    hold = tmp_path / "hold"
    p = create("hold-file", {"path": str(hold), "error": 999})
    assert p.decides_launches and not p.needs_footprint
    assert p.launch_requested(launch()) is RUN
    assert p.state() == {"path": str(hold), "holding": False}
    hold.touch()
    d = p.launch_requested(launch(attempts=3))
    assert (d.verdict, d.error) == (Verdict.WAIT, 999) and str(hold) in d.reason
    assert p.state()["holding"]
    hold.unlink()
    assert p.launch_requested(launch(attempts=4)) is RUN
    assert create("hold-file", {"path": "/x"}).settings.error == 2
    with pytest.raises(PolicyConfigError, match=r"policy\.hold-file: missing key 'path'"):
        create("hold-file")
