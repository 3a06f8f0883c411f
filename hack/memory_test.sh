#!/usr/bin/env bash
# Checks e2e/memory.py, the reading behind `make e2e`'s idle memory figures, without a cluster:
# on made-up /proc and cgroup trees it must compute the working set as cAdvisor does (cgroup v1
# and v2, a hybrid host, inactive pages over the usage), and fail, saying which, when a figure
# can not be read; then it must read this very process's figures on this machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# A skip says so; under CI=true it fails, so a CI that lost what a check needs cannot pass by
# skipping it.
skip() { if [ "${CI:-}" = true ]; then echo "FAIL (CI=true, no skips): $*"; exit 1; fi; echo "SKIPPED $*"; }
MIB=1048576

# case NAME: a /proc/PID of its own (status, smaps_rollup) and an empty cgroup mount.
new_case() {
  local d=$scratch/$1
  mkdir -p "$d/proc" "$d/fs"
  printf 'Name:\tcontroller-manag\nVmHWM:\t   20000 kB\nVmRSS:\t   17612 kB\nRssAnon:\t    3300 kB\n' > "$d/proc/status"
  printf '55cf5bfd7000-7ffd3000 ---p 00000000 00:00 0                          [rollup]\nRss:               17612 kB\nPss:                9876 kB\nPss_Anon:           3300 kB\n' > "$d/proc/smaps_rollup"
  echo "$d"
}
# v1_cgroup DIR PATH USAGE INACTIVE: PATH in DIR's memory hierarchy, with that usage and
# total_inactive_file (the cgroup's own inactive_file differs, so the wrong key shows).
v1_cgroup() {
  mkdir -p "$1/fs/memory$2"
  echo "$3" > "$1/fs/memory$2/memory.usage_in_bytes"
  printf 'cache 100\nrss 200\ninactive_file 1\nactive_file 2\ntotal_cache 100\ntotal_inactive_file %s\ntotal_active_file 9\n' "$4" > "$1/fs/memory$2/memory.stat"
}
# expect NAME WANT: memory.py on case NAME prints WANT.
expect() {
  local got
  got=$(python3 "$root/e2e/memory.py" "$scratch/$1/proc" "$scratch/$1/fs" 2>&1) || fail "$1: memory.py failed: $got"
  [ "$got" = "$2" ] || fail "$1: printed \"$got\", not \"$2\""
}
# refused NAME WORDS: memory.py on case NAME exits 1 and says WORDS.
refused() {
  local got code=0
  got=$(python3 "$root/e2e/memory.py" "$scratch/$1/proc" "$scratch/$1/fs" 2>&1) || code=$?
  [ "$code" = 1 ] || fail "$1: exit $code, not 1 (it printed \"$got\")"
  case $got in *"$2"*) ;; *) fail "$1: \"$got\" does not say \"$2\"" ;; esac
}

# cgroup v1, as the test cluster's nodes have it: a container of a pod, under kubepods.
d=$(new_case v1)
pod=/cluster-1/gk-node-1/kubepods/burstable/pod7c9e/4f1a
printf '12:pids:%s\n5:cpu,cpuacct:%s\n4:memory:%s\n1:name=systemd:%s\n0::/\n' "$pod" "$pod" "$pod" "$pod" > "$d/proc/cgroup"
v1_cgroup "$d" "$pod" $((25 * MIB)) $((22 * MIB))
expect v1 "3072 17612 9876 $pod"

# cgroup v2: memory.current less inactive_file.
d=$(new_case v2)
echo '0::/kubepods.slice/kubepods-burstable.slice/cri-containerd-4f1a.scope' > "$d/proc/cgroup"
touch "$d/fs/cgroup.controllers"
mkdir -p "$d/fs/kubepods.slice/kubepods-burstable.slice/cri-containerd-4f1a.scope"
echo $((10 * MIB)) > "$d/fs/kubepods.slice/kubepods-burstable.slice/cri-containerd-4f1a.scope/memory.current"
printf 'anon 3145728\nfile 7340032\nactive_file 1048576\ninactive_file %s\n' $((4 * MIB)) \
  > "$d/fs/kubepods.slice/kubepods-burstable.slice/cri-containerd-4f1a.scope/memory.stat"
expect v2 "6144 17612 9876 /kubepods.slice/kubepods-burstable.slice/cri-containerd-4f1a.scope"

# A hybrid host lists the unified hierarchy too, where the memory controller is not: v1's wins,
# also when the unified line comes first.
d=$(new_case hybrid)
printf '0::/elsewhere\n4:memory:/daemons/kube-proxy\n' > "$d/proc/cgroup"
mkdir -p "$d/fs/unified"
v1_cgroup "$d" /daemons/kube-proxy $((40 * MIB)) $((8 * MIB))
expect hybrid "32768 17612 9876 /daemons/kube-proxy"

# More inactive file pages than usage (a reading between two updates): 0, as cAdvisor says.
d=$(new_case over)
echo '4:memory:/x' > "$d/proc/cgroup"
v1_cgroup "$d" /x $((2 * MIB)) $((3 * MIB))
expect over "0 17612 9876 /x"

# What can not be read is named, and nothing is printed as a figure.
d=$(new_case no_stat)
echo '4:memory:/x' > "$d/proc/cgroup"
v1_cgroup "$d" /x $MIB 0
rm "$d/fs/memory/x/memory.stat"
refused no_stat "memory.stat"
d=$(new_case no_key)
echo '4:memory:/x' > "$d/proc/cgroup"
v1_cgroup "$d" /x $MIB 0
sed -i '/^total_inactive_file/d' "$d/fs/memory/x/memory.stat"
refused no_key "no total_inactive_file"
d=$(new_case no_memory)
printf '12:pids:/x\n0::/x\n' > "$d/proc/cgroup"
refused no_memory "no memory cgroup"
d=$(new_case no_rollup)
echo '4:memory:/x' > "$d/proc/cgroup"
v1_cgroup "$d" /x $MIB 0
rm "$d/proc/smaps_rollup"
refused no_rollup "smaps_rollup"
d=$(new_case gone)
rm -r "$d/proc"
refused gone "cgroup"

# This process's own figures on this machine: four fields, the first three numbers.
if [ -d /sys/fs/cgroup/memory ] || [ -e /sys/fs/cgroup/cgroup.controllers ]; then
  line=$(python3 "$root/e2e/memory.py" /proc/self) || fail "memory.py could not read its own figures"
  read -r ws rss pss cg <<<"$line"
  [[ $ws =~ ^[0-9]+$ && $rss =~ ^[1-9][0-9]*$ && $pss =~ ^[1-9][0-9]*$ && $cg == /* ]] \
    || fail "its own figures: \"$line\""
else
  skip "memory check on this machine: no cgroup v1 memory hierarchy or cgroup v2 mount under /sys/fs/cgroup"
fi
echo "memory-check: e2e/memory.py reads the working set as cAdvisor does (v1, v2, hybrid), refuses what it can not read"
