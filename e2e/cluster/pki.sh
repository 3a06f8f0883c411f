# shellcheck shell=bash disable=SC2164 # run under e2e/cluster.sh's errexit: a failed cd stops it
# The cluster's PKI (a CA, the apiserver's serving certificate, the admin's and each kubelet's
# client and serving certificates, the service account key) and its kubeconfigs. Sourced by
# e2e/cluster.sh.

pki() {
  local d=$1 i
  mkdir -p "$d"
  (
    cd "$d"
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -keyout ca.key -out ca.crt -subj "/CN=groundskeeper-e2e-ca" 2>/dev/null
    cert() { # name subject extensions
      openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
      printf '%b' "$3" > "$1.ext"
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -out "$1.crt" -extfile "$1.ext" 2>/dev/null
    }
    cert apiserver "/CN=kube-apiserver" \
      "subjectAltName=IP:$CP_IP4,IP:$CP_IP6,IP:$APISERVER_VIP,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost\nextendedKeyUsage=serverAuth\n"
    cert admin "/O=system:masters/CN=groundskeeper-e2e-admin" "extendedKeyUsage=clientAuth\n"
    for ((i = 1; i <= NODES; i++)); do
      local n
      n=$(node_name "$i")
      cert "kubelet-$n" "/O=system:nodes/CN=system:node:$n" "extendedKeyUsage=clientAuth\n"
      cert "serving-$n" "/CN=$n" "subjectAltName=IP:$(node_ip4 "$i"),IP:$(node_ip6 "$i"),DNS:$n\nextendedKeyUsage=serverAuth\n"
    done
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    rm -f ./*.csr ./*.ext
  )
}

kubeconfig() { # out server cert-name
  cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster: {server: "$2", certificate-authority: "$S/pki/ca.crt"}
users:
- name: u
  user: {client-certificate: "$S/pki/$3.crt", client-key: "$S/pki/$3.key"}
contexts:
- name: e2e
  context: {cluster: e2e, user: u}
current-context: e2e
EOF
}
