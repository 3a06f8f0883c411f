# shellcheck shell=bash
# The cluster's cgroups (v1): made under the caller's own memory cgroup, one root per cluster,
# swept when their keeper is gone. Sourced by e2e/cluster.sh.

# The cluster's cgroup root sits under this process's own memory cgroup, so the cluster's memory
# stays accounted where the caller's is; the same path is used in every v1 hierarchy, as the
# cgroupfs driver requires.
cgroup_base() {
  local mem
  mem=$(awk -F: '$2 == "memory" {print $3}' /proc/self/cgroup)
  echo "${mem%/}/groundskeeper-e2e"
}

cgroup_create() {
  local path=$1 h
  for h in /sys/fs/cgroup/*/; do
    h=${h%/}
    case $(basename "$h") in unified) continue ;; esac
    mkdir -p "$h$path"
    if [ -f "$h/cpuset.cpus" ]; then
      # A new cpuset is empty and takes no task until its cpus and mems are filled in.
      local p="" part
      for part in ${path//\// }; do
        p="$p/$part"
        [ -s "$h$p/cpuset.cpus" ] || cat "$(dirname "$h$p")/cpuset.cpus" > "$h$p/cpuset.cpus"
        [ -s "$h$p/cpuset.mems" ] || cat "$(dirname "$h$p")/cpuset.mems" > "$h$p/cpuset.mems"
      done
    fi
  done
}

# Removes the empty cgroups of clusters whose keeper is gone (named by its host PID); a cgroup
# that still holds a task is left alone, as rmdir refuses it.
cgroup_sweep() {
  local base h d
  base=$(cgroup_base)
  for h in /sys/fs/cgroup/*/; do
    for d in "${h%/}$base"/cluster-* "${h%/}$base"/node-*; do
      [ -d "$d" ] && [ ! -e "/proc/${d##*-}" ] || continue
      find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
  done
}
