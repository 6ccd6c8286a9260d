"""What the engines run on: the execution providers by name, and the CPU cores
this process may use.

`usable_cores()` is the one core counter: `--threads 0`, the default of
`--threads` and the runner's intra-op threads all come from it. It counts the
CPUs of the process's affinity mask once per physical core (SMT siblings share a
core's units, so ONNX Runtime's intra-op threads gain nothing from them), and
never more than the cgroup CPU quota (a container's or a Kubernetes pod's CPU
limit): a pool wider than the quota only gets throttled.
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Iterator
from enum import Enum
from pathlib import Path, PurePosixPath


class Provider(str, Enum):
    """ONNX Runtime execution provider as configured: AUTO is CUDA when available."""

    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


PROVIDERS: tuple[str, ...] = tuple(p.value for p in Provider)
# Where cgroup v1 mounts the cpu controller (alone, or joined with cpuacct).
CGROUP_V1_CPU_MOUNTS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")


def usable_cores(root: Path = Path("/"), cpus: Collection[int] | None = None) -> int:
    """The cores this process may use, at least 1. `root` is where /proc and /sys
    are looked up and `cpus` replaces the affinity mask (both for tests)."""
    allowed = set(cpus) if cpus is not None else _affinity()
    cores = _physical_cores(root, allowed)
    quota = cgroup_cpu_quota(root)
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)


def cgroup_cpu_quota(root: Path = Path("/")) -> float | None:
    """The tightest CPU quota (CPUs' worth of time per period) of this process's
    cgroup and its ancestors, v2 (`cpu.max`) or v1 (`cpu.cfs_quota_us` /
    `cpu.cfs_period_us`); None when nothing limits it."""
    v2_path, v1_path = _own_cgroups(root)
    base = root / "sys/fs/cgroup"
    quotas = [q for d in _cgroup_dirs(base, v2_path) if (q := _v2_quota(d)) is not None]
    for mount in CGROUP_V1_CPU_MOUNTS:
        quotas += [q for d in _cgroup_dirs(base / mount, v1_path)
                   if (q := _v1_quota(d)) is not None]
    return min(quotas) if quotas else None


def _affinity() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: no mask, every CPU
        return set(range(os.cpu_count() or 1))


def _physical_cores(root: Path, allowed: set[int]) -> int:
    """Distinct (package, core) pairs among `allowed`; every CPU its own core when
    the topology is not readable."""
    cores: set[tuple[str, str]] = set()
    try:
        for cpu in allowed:
            topology = root / f"sys/devices/system/cpu/cpu{cpu}/topology"
            cores.add(((topology / "physical_package_id").read_text().strip(),
                       (topology / "core_id").read_text().strip()))
    except OSError:
        return len(allowed)
    return len(cores)


def _own_cgroups(root: Path) -> tuple[str, str]:
    """(v2 path, v1 cpu controller path) of this process, "/" where not listed."""
    v2, v1 = "/", "/"
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return v2, v1
    for line in lines:  # "hierarchy-id:controllers:path"
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _cgroup_dirs(mount: Path, path: str) -> Iterator[Path]:
    """The cgroup's directory and its ancestors' below `mount`, those that exist.
    Inside a container's cgroup namespace the path is "/" and the mount's root is
    the container's own cgroup; without one the path may not exist below the
    mount, and the mount's root is still checked."""
    if not mount.is_dir():
        return
    relative = PurePosixPath(path.strip() or "/").relative_to("/")
    for parent in (relative, *relative.parents):
        directory = mount / parent
        if directory.is_dir():
            yield directory


def _v2_quota(directory: Path) -> float | None:
    try:  # "200000 100000" is 2 CPUs; "max 100000" is no limit
        quota, period = (directory / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else _ratio(int(quota), int(period))
    except (OSError, ValueError):
        return None


def _v1_quota(directory: Path) -> float | None:
    try:  # a quota of -1 is no limit
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
        return _ratio(quota, period)
    except (OSError, ValueError):
        return None


def _ratio(quota: int, period: int) -> float | None:
    return quota / period if quota > 0 and period > 0 else None
