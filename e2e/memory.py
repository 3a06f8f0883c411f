#!/usr/bin/env python3
"""A process's memory, as kubelet counts it and as ps does.

Usage: memory.py PROC_DIR [CGROUP_FS]

PROC_DIR is the process's /proc/PID (its `cgroup`, `status` and `smaps_rollup` are read);
CGROUP_FS is where the cgroup hierarchies are mounted (default /sys/fs/cgroup). Prints one line,

    WORKING_SET_KIB RSS_KIB PSS_KIB CGROUP

where WORKING_SET is that of the process's memory cgroup as cAdvisor computes
`container_memory_working_set_bytes`, the figure kubelet, `kubectl top` and eviction use: the
cgroup's usage less its inactive file pages (cgroup v1: `memory.usage_in_bytes` less
`total_inactive_file` of `memory.stat`; cgroup v2: `memory.current` less `inactive_file`), and 0
when the inactive pages exceed the usage. RSS is `VmRSS` of `status`, PSS is `Pss` of
`smaps_rollup`, CGROUP the memory cgroup's path. When a figure can not be read it says which on
stderr and exits 1.
"""

import os
import sys


class Unreadable(Exception):
    pass


def memory_cgroup(cgroup_text, fs):
    """The memory cgroup's directory and its version, from /proc/PID/cgroup's text.

    A v1 line `ID:CONTROLLERS:PATH` naming `memory` wins (a hybrid host also lists the unified
    hierarchy, without the memory controller); otherwise the v2 line `0::PATH`, when FS is a
    cgroup v2 mount."""
    v2 = None
    for line in cgroup_text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if "memory" in controllers.split(","):
            return path, os.path.join(fs, "memory") + path, 1
        if hid == "0" and controllers == "":
            v2 = path
    if v2 is not None and os.path.exists(os.path.join(fs, "cgroup.controllers")):
        return v2, fs.rstrip("/") + v2, 2
    raise Unreadable("no memory cgroup in the process's cgroup file")


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        raise Unreadable(f"{path}: {e.strerror}") from e


def field(text, key, where):
    """The number after KEY (`key value` or `Key:   value kB`) in TEXT."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in (key, key + ":"):
            try:
                return int(parts[1])
            except ValueError:
                break
    raise Unreadable(f"{where}: no {key}")


def working_set_bytes(cgroup_dir, version):
    if version == 1:
        usage_file, inactive_key = "memory.usage_in_bytes", "total_inactive_file"
    else:
        usage_file, inactive_key = "memory.current", "inactive_file"
    usage_path = os.path.join(cgroup_dir, usage_file)
    try:
        usage = int(read(usage_path).strip())
    except ValueError as e:
        raise Unreadable(f"{usage_path}: not a number") from e
    stat_path = os.path.join(cgroup_dir, "memory.stat")
    inactive = field(read(stat_path), inactive_key, stat_path)
    return max(usage - inactive, 0)


def measure(proc_dir, fs="/sys/fs/cgroup"):
    path, cgroup_dir, version = memory_cgroup(read(os.path.join(proc_dir, "cgroup")), fs)
    ws = working_set_bytes(cgroup_dir, version)
    status = os.path.join(proc_dir, "status")
    rss = field(read(status), "VmRSS", status)
    rollup = os.path.join(proc_dir, "smaps_rollup")
    pss = field(read(rollup), "Pss", rollup)
    return ws // 1024, rss, pss, path


def main(argv):
    if len(argv) not in (2, 3):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        ws, rss, pss, path = measure(*argv[1:])
    except Unreadable as e:
        print(f"memory.py: {e}", file=sys.stderr)
        return 1
    print(ws, rss, pss, path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
