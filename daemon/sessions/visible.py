"""Device selection as CUDA does it: a program's CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER.

The shim sends both from the program's environment in HELLO (`pilot_req_hello`); the router
resolves them here against the GPUs pilotd serves, so a selection can only narrow what a
session sees: an entry that names no GPU of pilotd's is invalid like an index past the last
GPU natively. The program then sees exactly the selected GPUs, renumbered from 0 in the order
given (sessions/devices.py maps its ordinals to them).

CUDA's rules: the CUDA C Programming Guide ("CUDA Environment Variables") documents a
comma-separated list of device indices or GPU UUIDs (`GPU-<uuid>` as nvidia-smi prints it, or
any prefix of it that matches exactly one GPU), the program seeing the listed devices only, in
the order given, renumbered from 0, and parsing stopping at the first invalid entry ("0,2,-1,1"
shows devices 0 and 2). What it leaves open is taken from PyTorch's model of the runtime's
parser (torch.cuda._parse_visible_devices and its tests, written against the driver):
- the first entry decides the form: a list that starts with `GPU-` is a list of UUIDs, and its
  first entry that does not start with `GPU-` ends it; otherwise it is a list of indices, each
  read like strtoul (blanks, an optional sign, digits; what follows the digits is ignored, so
  "1gpu,2" is "1,2"), and the first entry without digits or with a negative value ends it;
- an index past the last GPU, or a UUID prefix that matches no GPU or several, ends the list;
- a device named twice makes the whole list select nothing;
- an empty value selects nothing: cudaGetDeviceCount returns cudaErrorNoDevice and count 0;
- unset: every device.
`MIG-` lists name MIG instances, which pilot does not serve: nothing is selected.

Indices count the host's GPUs in CUDA's enumeration order: FASTEST_FIRST (the default) is the
order pilotd's own CUDA numbers them, which is how pilotd numbers its GPUs (`gpus` in the
config, the `gpu` label); CUDA_DEVICE_ORDER=PCI_BUS_ID counts them by PCI bus id instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pilot.daemon.backends.base import DeviceInfo, format_uuid, pci_bus_id_of

MAX_ENTRIES = 64  # CUDA reads no further than the devices a host can have


@dataclass(frozen=True)
class GpuIdentity:
    """One GPU pilotd serves, as a selection can name it."""

    gpu: int  # pilotd's GPU number: the host's CUDA ordinal (FASTEST_FIRST)
    pci_index: int  # its index among the host's GPUs in PCI bus order
    uuid: str  # "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
    pci_bus_id: str  # "00000000:1B:00.0", NVML's form


def pci_sort_key(bus_id: str) -> tuple[int, ...]:
    """Numeric (domain, bus, device, function) of a bus id such as "0000:1b:00.0"."""
    head, _, function = bus_id.partition(".")
    fields = head.split(":")
    try:
        return (*(int(f, 16) for f in fields[-3:]), int(function or "0", 16))
    except ValueError:
        return (1 << 32,)


def _strtoul(entry: str) -> int:
    """An index entry as the runtime reads it: -1 where it has no digits."""
    text = entry.strip()
    sign = text[:1] if text[:1] in "+-" else ""
    digits = text[len(sign):]
    n = len(digits) - len(digits.lstrip("0123456789"))
    if n == 0:
        return -1
    value = int(digits[:n])
    return -value if sign == "-" else value


def parse(value: str) -> list[int] | list[str]:
    """CUDA_VISIBLE_DEVICES as a list of indices (ints) or of UUID prefixes (strs), up to the
    entry that ends it; empty where it selects nothing (a device named twice, a MIG list)."""
    if value.startswith(("GPU-", "MIG-")):
        if value.startswith("MIG-"):
            return []
        uuids: list[str] = []
        for entry in value.split(",")[:MAX_ENTRIES]:
            if not entry.startswith("GPU-"):
                break
            if entry in uuids:
                return []
            uuids.append(entry)
        return uuids
    indices: list[int] = []
    for entry in value.split(",")[:MAX_ENTRIES]:
        index = _strtoul(entry)
        if index in indices:
            return []
        if index < 0:
            break
        indices.append(index)
    return indices


def resolve(entries: Sequence[int] | Sequence[str], gpus: Sequence[GpuIdentity],
            pci_order: bool) -> list[int]:
    """The positions in `gpus` the parsed entries select, in their order, up to the first entry
    that names no GPU of `gpus` (an index no served GPU has, a UUID prefix matching none or
    several); nothing if two UUID prefixes name the same GPU."""
    chosen: list[int] = []
    for entry in entries:
        if isinstance(entry, int):
            hits = [p for p, g in enumerate(gpus) if (g.pci_index if pci_order else g.gpu) == entry]
        else:
            hits = [p for p, g in enumerate(gpus) if g.uuid.startswith(entry)]
        if len(hits) != 1:
            break
        if hits[0] in chosen:
            return []
        chosen.append(hits[0])
    return chosen


def select(value: str | None, gpus: Sequence[GpuIdentity], pci_order: bool) -> list[int] | None:
    """The positions a program with CUDA_VISIBLE_DEVICES=`value` sees (None: unset, all of
    them, numbered as pilot places the session)."""
    if value is None:
        return None
    return resolve(parse(value), gpus, pci_order)


def identities(gpus: Sequence[int], infos: Sequence[DeviceInfo],
               host_bus_ids: dict[int, str] | None = None) -> list[GpuIdentity]:
    """The served GPUs (`gpus[p]`, described by `infos[p]`) as selections name them.
    `host_bus_ids` (host ordinal -> PCI bus id of every GPU of the host, where the backend can
    tell) places them in the host's PCI order; without it they are ranked among themselves."""
    bus_ids = [pci_bus_id_of(info) for info in infos]
    everyone = dict(host_bus_ids or {})
    everyone.update(zip(gpus, bus_ids, strict=True))
    ranked = sorted(everyone, key=lambda g: (pci_sort_key(everyone[g]), g))
    return [GpuIdentity(gpu=g, pci_index=ranked.index(g), uuid=format_uuid(info.uuid), pci_bus_id=bus)
            for g, info, bus in zip(gpus, infos, bus_ids, strict=True)]
