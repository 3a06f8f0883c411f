# shellcheck shell=bash disable=SC2154 # here is e2e/cluster.sh's
# The keepers, outside, one per piece and one for the whole cluster (`cluster.sh _keeper`,
# `_cp_keeper`, `_node_keeper`): each starts its piece as PID 1 of new namespaces under
# `setpriv --pdeathsig KILL`, so whatever kills a keeper kills what it keeps. Sourced by
# e2e/cluster.sh.

# Starts `cluster.sh _PIECE STATE [NAME]` as PID 1 of new PID, mount and network namespaces,
# under `setpriv --pdeathsig KILL` (it dies with the keeper that started it), and records its
# host PID (the PID 1 inside) in DIR/ns-pid.
spawn() { # dir cgroup piece args...
  local dir=$1 cg=$2
  shift 2
  rm -f "$dir/ns-pid"
  setpriv --pdeathsig KILL unshare --pid --mount --net --fork --kill-child --mount-proc --propagation private \
    env CGROUP_ROOT="$cg" NODES="$NODES" bash "$here/cluster.sh" "$@" &
  local starter=$! i pid=""
  for ((i = 0; i < 100; i++)); do
    pid=$(pgrep -P "$starter" 2>/dev/null | head -n 1) && [ -n "$pid" ] && break
    sleep 0.05
  done
  [ -n "$pid" ] || die "$* did not start"
  echo "$pid" > "$dir/ns-pid"
  SPAWNED=$starter
}

# One node's keeper: boots the node, and boots it again each time `start` asks after a crash.
# The node is its child (pdeathsig): whatever kills the keeper kills the node.
node_keeper() { # state name
  S=$1
  NODES=$(cat "$S/node-count")
  local name=$2 i dir cg
  i=$(node_index "$name")
  dir=$S/nodes/$name
  cg=$(cat "$S/cgroup")/$name
  cgroup_create "$cg"
  while :; do
    rm -f "$dir/start-request"
    spawn "$dir" "$cg" _node "$S" "$name"
    # The node's end of its link, on the control plane's bridge. After a crash the kernel tears
    # the old pair down only once the node's network namespace is gone, which may be later than
    # this boot: the stale end is removed first, and the pair made again until it takes.
    local tries
    for ((tries = 0; tries < 50; tries++)); do
      nsenter --target "$(cat "$S/cp/ns-pid")" --net -- ip link del "gk-n$i" 2>/dev/null || true
      nsenter --target "$(cat "$S/cp/ns-pid")" --net -- \
        ip link add "gk-n$i" type veth peer name eth0 netns "$(cat "$dir/ns-pid")" 2>/dev/null && break
      sleep 0.1
    done
    nsenter --target "$(cat "$S/cp/ns-pid")" --net -- sh -c "ip link set gk-n$i master gk-br && ip link set gk-n$i up"
    wait "$SPAWNED" || true
    rm -f "$dir/ns-pid"
    log "$name is down"
    while [ ! -e "$dir/start-request" ]; do sleep 0.2; done
  done
}

cp_keeper() { # state
  S=$1
  NODES=$(cat "$S/node-count")
  local cg
  cg=$(cat "$S/cgroup")/control-plane
  cgroup_create "$cg"
  spawn "$S/cp" "$cg" _cp "$S"
  wait "$SPAWNED" || true
}

# The whole cluster, from a keeper process of its own (its host PID names the cgroup root). Each
# piece has a keeper process of its own too, each under `setpriv --pdeathsig KILL` of the one
# above it, so the chain from the caller down to every container breaks at no link.
keeper() { # state
  S=$1
  NODES=$(cat "$S/node-count")
  echo "$BASHPID" > "$S/keeper-pid"
  cgroup_sweep
  echo "$(cgroup_base)/cluster-$BASHPID" > "$S/cgroup"
  trap 'kill -KILL $(jobs -p) 2>/dev/null; exit 0' TERM INT
  setpriv --pdeathsig KILL bash "$here/cluster.sh" _cp_keeper "$S" &
  local i
  for ((i = 0; i < 600; i++)); do [ -e "$S/cp/started" ] || [ -e "$S/cp/broken" ] && break; sleep 0.1; done
  for ((i = 1; i <= NODES; i++)); do
    setpriv --pdeathsig KILL bash "$here/cluster.sh" _node_keeper "$S" "$(node_name "$i")" &
  done
  wait
}
