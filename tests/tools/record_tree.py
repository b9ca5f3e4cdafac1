"""Record this host's block-device facts into a fixture tree for the unit tests.

    python tests/tools/record_tree.py tests/data/<machine>

Copies exactly the sysfs/procfs files that ``find_block_devices`` reads (with the sysfs
symlinks on the way), and writes ``probes.json`` with the udev properties, wipefs
signatures and O_EXCL results, so the unit tier replays a real host.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from iotune.probes.blockdev import find_block_devices
from iotune.probes.host import PROBES_FILE, LiveHost
from iotune.probes.sysfs import SysTree, copy_touched
from iotune.records import to_jsonable


def main() -> None:
    dest = Path(sys.argv[1])
    dest.mkdir(parents=True, exist_ok=True)
    tree = SysTree("/", record=True)
    host = LiveHost(tree)
    devs = find_block_devices(host, include_empty=True)
    names = [d.name for d in devs]
    parts = [p.name for d in devs for p in d.partitions]
    # mountinfo/swaps of the recording process, not of a later reader
    tree.read_raw("/proc/self/mountinfo")
    tree.read_raw("/proc/swaps")
    assert tree.touched is not None
    copy_touched(tree.touched, dest)
    probes = {
        "disks": names,
        "udev": {n: host.udev_properties(n) for n in names},
        "signatures": {n: to_jsonable(host.signatures(n)) for n in names + parts},
        "exclusive": {n: host.exclusive_open_error(n) for n in names},
        # the route to each NVMe-oF target address: the interface the fabric's link is
        "routes": {
            p.traddr: host.route_iface(p.traddr)
            for d in devs
            if d.fabric is not None
            for p in d.fabric.paths
            if p.traddr
        },
    }
    (dest / PROBES_FILE).write_text(json.dumps(probes, indent=1, sort_keys=True) + "\n")
    print(f"recorded {len(names)} disks into {dest}")


if __name__ == "__main__":
    main()
