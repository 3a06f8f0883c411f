# shellcheck shell=bash
# Faults on demand, from outside: a node crashed (`crash`) and booted again (`start`), its link
# cut and healed (`cut`, `heal`), every node restarted with kube-proxy in another mode
# (`proxy-mode`). Sourced by e2e/cluster.sh.

crash() { # state name
  local s=$1 name=$2 pid
  pid=$(cat "$s/nodes/$name/ns-pid" 2>/dev/null) || die "$name is not running"
  # SIGKILL to a PID namespace's init kills every process in it and in the namespaces nested
  # in it (the containers): a power cut, as far as the rest of the cluster can tell.
  kill -KILL "$pid"
  local i
  for ((i = 0; i < 100; i++)); do [ -e "$s/nodes/$name/ns-pid" ] || break; sleep 0.1; done
  [ ! -e "$s/nodes/$name/ns-pid" ] || die "$name did not go down"
}

boot() { # state name
  local s=$1 name=$2 i t0=$SECONDS since
  [ ! -e "$s/nodes/$name/ns-pid" ] || die "$name is running"
  since=$(date -u +%s)
  touch "$s/nodes/$name/start-request"
  # Ready as this boot's kubelet reports it: a heartbeat no older than the boot (the Node may
  # still say Ready from before a crash the node controller has not noticed yet).
  local ready
  for ((i = 0; i < 240; i++)); do
    ready=$(in_cp "$s" "$s/bin/kubectl" get node "$name" \
      -o jsonpath='{range .status.conditions[?(@.type=="Ready")]}{.status} {.lastHeartbeatTime}{end}' 2>/dev/null) || ready=""
    if [ -e "$s/nodes/$name/started" ] && [ "${ready%% *}" = True ] \
      && [ "$(date -u -d "${ready#* }" +%s)" -ge "$since" ]; then
      log "$name Ready $((SECONDS - t0)) s after its boot"
      return 0
    fi
    sleep 0.5
  done
  die "$name not Ready 120 s after its boot (logs in $s/nodes/$name/logs)"
}

# kube-proxy in MODE on every node: each node is restarted (a fresh network namespace, so no
# rule of the other mode is left behind) and its kube-proxy starts in MODE.
proxy_mode() { # state mode
  local s=$1 mode=$2 n
  case $mode in iptables | nftables) ;; *) die "proxy-mode: iptables or nftables, not $mode" ;; esac
  echo "$mode" > "$s/proxy-mode"
  for n in $(cd "$s/nodes" && ls); do
    crash "$s" "$n"
    boot "$s" "$n"
  done
}

link() { # state name up|down
  in_cp "$1" ip link set "gk-n$(node_index "$2")" "$3"
}
