"""The one core counter: the affinity mask, physical cores, and the cgroup CPU quota."""

from __future__ import annotations

import os
from pathlib import Path

from seq2serve.model.package.session import int8_needs_exact_kernels
from seq2serve.server.resources import cgroup_cpu_quota, usable_cores

NODE = range(64)  # the CPUs of a 64-core node


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_quota_caps_the_cores(tmp_path: Path) -> None:
    """A container limited to 2 CPUs on a 64-core node gets 2-thread pools."""
    write(tmp_path, "proc/self/cgroup", "0::/\n")
    write(tmp_path, "sys/fs/cgroup/cpu.max", "200000 100000\n")
    assert cgroup_cpu_quota(tmp_path) == 2.0
    assert usable_cores(tmp_path, NODE) == 2


def test_a_fractional_quota_rounds_up(tmp_path: Path) -> None:
    write(tmp_path, "sys/fs/cgroup/cpu.max", "150000 100000\n")
    assert usable_cores(tmp_path, NODE) == 2
    write(tmp_path, "sys/fs/cgroup/cpu.max", "10000 100000\n")  # a tenth of a CPU
    assert usable_cores(tmp_path, NODE) == 1


def test_no_quota_leaves_the_affinity_mask(tmp_path: Path) -> None:
    write(tmp_path, "sys/fs/cgroup/cpu.max", "max 100000\n")
    assert cgroup_cpu_quota(tmp_path) is None
    assert usable_cores(tmp_path, NODE) == 64
    assert usable_cores(tmp_path, {3, 5, 7}) == 3  # taskset / cpuset: the mask counts
    assert usable_cores(tmp_path / "nothing-here", NODE) == 64


def test_cgroup_v2_ancestors_limit_too(tmp_path: Path) -> None:
    """Without a cgroup namespace the process sits below the mount; a limit set on
    a parent (a pod's) holds for its children."""
    write(tmp_path, "proc/self/cgroup", "0::/kubepods/pod1/ctr\n")
    write(tmp_path, "sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "max 100000\n")
    write(tmp_path, "sys/fs/cgroup/kubepods/pod1/cpu.max", "300000 100000\n")
    write(tmp_path, "sys/fs/cgroup/kubepods/cpu.max", "800000 100000\n")
    assert cgroup_cpu_quota(tmp_path) == 3.0
    assert usable_cores(tmp_path, NODE) == 3


def test_cgroup_v1_quota_and_period(tmp_path: Path) -> None:
    write(tmp_path, "proc/self/cgroup", "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n")
    # Inside the container the controller's mount root is the container's cgroup.
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "400000\n")
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n")
    assert usable_cores(tmp_path, NODE) == 4
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n")  # no limit
    assert cgroup_cpu_quota(tmp_path) is None
    assert usable_cores(tmp_path, NODE) == 64


def test_smt_siblings_count_once(tmp_path: Path) -> None:
    """4 logical CPUs on 2 cores (hyper-threading): 2 intra-op threads."""
    for cpu, core in enumerate([0, 1, 0, 1]):
        write(tmp_path, f"sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id", "0\n")
        write(tmp_path, f"sys/devices/system/cpu/cpu{cpu}/topology/core_id", f"{core}\n")
    assert usable_cores(tmp_path, range(4)) == 2
    assert usable_cores(tmp_path, {0, 2}) == 1  # both siblings of core 0
    write(tmp_path, "sys/fs/cgroup/cpu.max", "100000 100000\n")
    assert usable_cores(tmp_path, range(4)) == 1


def test_this_machine() -> None:
    cores = usable_cores()
    assert 1 <= cores <= len(os.sched_getaffinity(0))


def _cpuinfo(root: Path, text: str) -> Path:
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc" / "cpuinfo").write_text(text)
    return root


def test_exact_int8_kernels_only_where_the_cpu_lacks_vnni(tmp_path: Path) -> None:
    """The x64quantprecision option (model/package/session.py's EXACT_INT8_CONFIG) on
    x86 without VNNI or AMX alone: an AVX2 EPYC saturates in int16, VNNI and AMX CPUs
    and ARM do not."""
    x86 = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx2 fma {}\n"
    assert int8_needs_exact_kernels(_cpuinfo(tmp_path / "zen3", x86.format("")))
    assert int8_needs_exact_kernels(_cpuinfo(tmp_path / "skx", x86.format("avx512f avx512bw")))
    for extra in ("avx512f avx512_vnni", "avx_vnni", "amx_int8 amx_tile"):
        assert not int8_needs_exact_kernels(_cpuinfo(tmp_path / extra, x86.format(extra)))
    arm = "processor\t: 0\nFeatures\t: fp asimd asimddp\nCPU implementer\t: 0x41\n"
    assert not int8_needs_exact_kernels(_cpuinfo(tmp_path / "arm", arm))
    assert not int8_needs_exact_kernels(tmp_path / "no-proc")
