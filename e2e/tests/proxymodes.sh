# kube-proxy's modes. Every test runs beside kube-proxy in iptables mode; here, after them,
# every node restarts with kube-proxy in nftables mode (GA, what new clusters choose) and the
# conntrack tests run again: the switch to a new backend on one node, all endpoints gone (the
# zero-endpoint switch), NodePort through another node's address (Cluster and Local), and an
# IPv6 ClusterIP. Last but the uninstall: the cluster stays in nftables mode after it.
# (Localhost NodePorts are tested in iptables mode only: v1.36's nftables mode does not serve
# them, and the test says so when it runs here.)

test_zz_a_kube_proxy_nftables() {
  local n
  proxy_mode nftables || fail "the nodes did not come back with kube-proxy in nftables mode"
  for n in $(all_nodes); do
    until_ok 60 sh -c "nsenter --target \$(cat $CLUSTER_STATE/nodes/$n/ns-pid) --net -- nft list tables | grep -q kube-proxy" \
      || fail "$n: kube-proxy made no nftables table"
    [ -z "$(on_node "$n" iptables-save -t nat 2>/dev/null | grep KUBE-SVC || true)" ] || fail "$n: iptables rules of kube-proxy left"
  done
  k -n "$NS" wait pods -l 'app.kubernetes.io/component in (controller-manager,node-agent)' \
    --for=condition=Ready --timeout=180s >/dev/null && rollout \
    || fail "the chart's pods did not come back after the nodes restarted"
  say "kube-proxy in nftables mode on $(all_nodes | tr '\n' ' ')"
  test_conntrack_server_replaced_new_server_reached_within_1s
  test_conntrack_all_endpoints_gone_flows_removed_by_agent
  test_multinode_conntrack_nodeport_through_another_node
  test_multinode_ipv6_clusterip_backend_replaced
  test_multinode_conntrack_localhost_nodeport
  echo "kube-proxy modes: iptables, nftables"
}
