"""Fake ``nvidia-smi``: the compute mode of the declared cards (``-i``, ``-c``), ``--query-gpu`` in CSV,
``-L`` and the version header. Everything else is refused as an unknown option. See the package docstring
for what each message comes from.
"""

from __future__ import annotations

import os
import sys

import _cards as cards

MODES = {
    "0": cards.DEFAULT,
    "DEFAULT": cards.DEFAULT,
    "2": cards.PROHIBITED,
    "PROHIBITED": cards.PROHIBITED,
    "3": cards.EXCLUSIVE,
    "EXCLUSIVE_PROCESS": cards.EXCLUSIVE,
}
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)
USAGE = "Please run 'nvidia-smi -h' for help."
# nvidia-smi's documented return codes
OK, INVALID, NO_PERMISSION, NOT_FOUND, NO_DRIVER_RC = 0, 2, 4, 6, 9


def _field(card: cards.Card, name: str, units: bool) -> str | None:
    mib = " MiB" if units else ""
    values = {
        "index": str(card.index),
        "name": card.name,
        "gpu_name": card.name,
        "uuid": card.uuid,
        "gpu_uuid": card.uuid,
        "memory.total": f"{card.memory_mb}{mib}",
        "driver_version": cards.DRIVER,
        "compute_mode": cards.SHOWN[cards.compute_mode(card)],
        "pci.bus_id": card.bus_id,
        "gpu_bus_id": card.bus_id,
        "mig.mode.current": "Disabled",  # every run's ``card`` step
        "count": None,
    }
    return values.get(name, "")


HEADERS = {"memory.total": "memory.total [MiB]"}
OPTIONS = {
    "-i": "id",
    "--id": "id",
    "-c": "mode",
    "--compute-mode": "mode",
    "--query-gpu": "query",
    "--format": "format",
}


def main(argv: list[str]) -> int:
    given: dict[str, str] = {}
    listing = False
    args = list(argv)
    while args:
        arg = args.pop(0)
        name, equals, inline = arg.partition("=")
        if arg in ("-h", "--help"):
            print("NVIDIA System Management Interface -- v" + cards.DRIVER)
            print("fake: -i/--id, -c/--compute-mode, --query-gpu with --format=csv[,noheader][,nounits], -L")
            return OK
        if arg in ("-L", "--list-gpus"):
            listing = True
            continue
        key = OPTIONS.get(name)
        if key is None:
            print(f"ERROR: Option {arg} is not recognized. {USAGE}")
            return INVALID
        value = inline if equals else (args.pop(0) if args else "")
        if not value:
            print(f"ERROR: Option {name} requires a value. {USAGE}")
            return INVALID
        given[key] = value
    ids, mode, query, fmt = (given.get(k) for k in ("id", "mode", "query", "format"))

    declared = cards.all_cards()
    if not declared:
        print(NO_DRIVER)
        return NO_DRIVER_RC
    chosen = declared
    if ids is not None:
        chosen = []
        for name in ids.split(","):
            card = cards.find(declared, name.strip())
            if card is None:
                print("No devices were found")
                return NOT_FOUND
            chosen.append(card)

    if mode is not None:
        return _compute_mode(chosen, mode)
    if query is not None:
        return _query(chosen, query, fmt or "")
    if listing:
        for card in chosen:
            print(f"GPU {card.index}: {card.name} (UUID: {card.uuid})")
        return OK
    return _summary(chosen)


def _compute_mode(chosen: list[cards.Card], asked: str) -> int:
    if asked.upper() in ("1", "EXCLUSIVE_THREAD"):
        print(f'Invalid compute mode "{asked}": EXCLUSIVE_THREAD is not supported. {USAGE}')
        return INVALID
    mode = MODES.get(asked.upper())
    if mode is None:
        print(f'Invalid compute mode "{asked}". {USAGE}')
        return INVALID
    if os.geteuid() != 0:
        print(f"Unable to set the compute mode for GPU {chosen[0].bus_id}: Insufficient Permissions")
        print("Terminating early due to previous errors.")
        return NO_PERMISSION
    for card in chosen:
        if cards.compute_mode(card) == mode:
            print(f"Compute mode is already set to {mode} for GPU {card.bus_id}.")
        else:
            cards.set_compute_mode(card, mode)
            print(f"Set compute mode to {mode} for GPU {card.bus_id}.")
    print("All done.")
    return OK


def _query(chosen: list[cards.Card], query: str, fmt: str) -> int:
    options = [o.strip() for o in fmt.split(",") if o.strip()]
    if "csv" not in options or any(o not in ("csv", "noheader", "nounits") for o in options):
        print(f'"{fmt}" is not a valid format. Use --format=csv[,noheader][,nounits]. {USAGE}')
        return INVALID
    fields = [f.strip() for f in query.split(",") if f.strip()]
    for name in fields:
        if _field(chosen[0], name, True) == "":
            print(f'Field "{name}" is not a valid field to query.\n')
            print(USAGE)
            return INVALID
    units = "nounits" not in options
    if "noheader" not in options:
        print(", ".join(HEADERS.get(f, f) if units else f for f in fields))
    for card in chosen:
        print(", ".join(_field(card, f, units) or str(len(chosen)) for f in fields))
    return OK


def _summary(chosen: list[cards.Card]) -> int:
    """Only the version line is measured (``CUDA Version: 13.0``); the table around it is a sketch."""
    rule = "+" + "-" * 89 + "+"
    print(rule)
    print(
        f"| NVIDIA-SMI {cards.DRIVER}  Driver Version: {cards.DRIVER}  CUDA Version: {cards.CUDA_VERSION}".ljust(90)
        + "|"
    )
    print(rule)
    for card in chosen:
        mode = cards.SHOWN[cards.compute_mode(card)]
        line = (
            f"| {card.index:>3}  {card.name:<24} {card.bus_id}  {cards.IDLE_USED_MB}MiB / {card.memory_mb}MiB  {mode}"
        )
        print(line.ljust(90) + "|")
    print(rule)
    return OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
