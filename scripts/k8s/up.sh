#!/bin/bash
# The test cluster: a single-node Kubernetes on loopback for the kubernetes provider's tests. etcd (Debian)
# + kube-apiserver/kcm/scheduler/kubelet (built from the Go module proxy by build.sh, cached under
# $K8S_WORK) + its own containerd 1.6 CRI instance (Debian) + a pause image made here (no registry).
# Installs its Debian packages when missing; does nothing when the cluster already answers.
# Prints the KUBECONFIG to use (also $K8S_WORK/cluster/pki/admin.kubeconfig). Stop it with down.sh.
set -euo pipefail
export K8S_WORK=${K8S_WORK:-/var/tmp/sandgate-k8s}
BIN=${BIN:-$K8S_WORK/bin-v1.37.2}
S=${S:-$K8S_WORK/cluster}          # all state lives here
HERE=$(cd "$(dirname "$0")" && pwd)
if [ -f $S/pids/apiserver ] && kill -0 "$(cat $S/pids/apiserver)" 2>/dev/null &&
   $BIN/kubectl --kubeconfig $S/pki/admin.kubeconfig get --raw /readyz >/dev/null 2>&1; then
  echo "export KUBECONFIG=$S/pki/admin.kubeconfig"; exit 0
fi
"$HERE/down.sh"   # leftovers of a cluster that died
need=()
for p in etcd-server:etcd etcd-client:etcdctl containerd:containerd runc:runc containernetworking-plugins:/usr/lib/cni/bridge busybox-static:/bin/busybox openssl:openssl gcc:gcc; do
  command -v "${p#*:}" >/dev/null 2>&1 || [ -x "${p#*:}" ] || need+=("${p%%:*}")
done
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [ ! -x "$BIN/kube-apiserver" ] || [ ! -x "$BIN/kubelet" ]; then
  echo "k8s-up: first start: building Kubernetes v1.37.2 from the Go module proxy into $K8S_WORK (about 9 minutes on 2 cores; later starts take seconds)" >&2
fi
BIN=$BIN "$HERE/build.sh" >/dev/null
KSRC=${KSRC:-$(cd "$K8S_WORK/mod-v1.37.2" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)}   # for build/pause/linux/pause.c
t0=$(date +%s%N); ts() { echo "[$(( ($(date +%s%N)-t0)/1000000 ))ms] $*"; }
mkdir -p $S/{pki,etcd,containerd,cni/net.d,kubelet,logs,pids,images}
start() { local name=$1; shift; setsid "$@" > $S/logs/$name.log 2>&1 < /dev/null & echo $! > $S/pids/$name; }
waitfor() { local what=$1 n=$2; shift 2; for i in $(seq 1 $n); do "$@" >/dev/null 2>&1 && { ts "$what ok"; return 0; }; sleep 0.25; done; ts "$what TIMEOUT"; return 1; }

# --- PKI ---
cd $S/pki
openssl genrsa -out ca.key 2048 2>/dev/null
openssl req -x509 -new -nodes -key ca.key -subj "/CN=k8s-test-ca" -days 2 -out ca.crt 2>/dev/null
mk() { openssl genrsa -out $1.key 2048 2>/dev/null; openssl req -new -key $1.key -subj "$2" -out $1.csr 2>/dev/null
  { echo "basicConstraints=CA:FALSE"; echo "keyUsage=critical,digitalSignature,keyEncipherment"; echo "extendedKeyUsage=$4"; [ -n "$3" ] && echo "subjectAltName=$3"; } > $1.ext
  openssl x509 -req -in $1.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile $1.ext -out $1.crt 2>/dev/null; }
mk apiserver "/CN=kube-apiserver" "IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes.default.svc" serverAuth
mk admin "/O=system:masters/CN=admin" "" clientAuth
mk apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "" clientAuth
mk kubelet-client "/O=system:nodes/CN=system:node:localhost" "" clientAuth
mk kubelet-server "/CN=localhost" "IP:127.0.0.1,DNS:localhost" serverAuth
mk controller-manager "/CN=system:kube-controller-manager" "" clientAuth
mk scheduler "/CN=system:kube-scheduler" "" clientAuth
openssl genrsa -out sa.key 2048 2>/dev/null; openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
for u in admin:admin kubelet:kubelet-client controller-manager:controller-manager scheduler:scheduler; do
cat > ${u%%:*}.kubeconfig <<K
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "https://127.0.0.1:6443", certificate-authority: $S/pki/ca.crt}}]
users: [{name: u, user: {client-certificate: $S/pki/${u#*:}.crt, client-key: $S/pki/${u#*:}.key}}]
contexts: [{name: c, context: {cluster: local, user: u}}]
current-context: c
K
done
ts "pki"
K="$BIN/kubectl --kubeconfig $S/pki/admin.kubeconfig"

# --- etcd (Debian 3.4) ---
start etcd ${ETCD:-etcd} --name t --data-dir $S/etcd/data --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 --initial-cluster t=http://127.0.0.1:2380
waitfor etcd 80 env ETCDCTL_API=3 etcdctl --endpoints=127.0.0.1:2379 endpoint health

# --- containerd (own instance; CRI on) ---
cat > $S/containerd/config.toml <<T
version = 2
root = "$S/containerd/root"
state = "$S/containerd/state"
[grpc]
  address = "$S/containerd/containerd.sock"
[ttrpc]
  address = "$S/containerd/containerd.sock.ttrpc"
[debug]
  address = "$S/containerd/debug.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "k8s-test.local/pause:1"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true   # no CAP_SYS_RESOURCE here: pause's oom_score_adj=-998 fails in runc otherwise
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$S/cni/net.d"
T
cat > $S/cni/net.d/10-test.conflist <<T
{"cniVersion": "0.4.0", "name": "k8stest", "plugins": [
  {"type": "bridge", "bridge": "k8stest0", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]], "dataDir": "$S/cni/ipam"}}]}
T
start containerd containerd --config $S/containerd/config.toml
waitfor containerd 80 ctr -a $S/containerd/containerd.sock version

# --- images: no registry, no daemon: docker-archive tarballs made with tar, imported with ctr ---
# (the tests import their own images, the agent's and a busybox, the same way: internal/providers/kubernetes/k8stest)
cd $S/images; rm -rf pause-root; mkdir -p pause-root
gcc -Os -static -DVERSION=local -o pause-root/pause $KSRC/build/pause/linux/pause.c; strip pause-root/pause
$HERE/mkimage.sh pause-root k8s-test.local/pause:1 pause.tar '["/pause"]' null
ctr -a $S/containerd/containerd.sock -n k8s.io images import pause.tar >/dev/null
ts "images"

# --- kube-apiserver ---
P=$S/pki
start apiserver $BIN/kube-apiserver --etcd-servers=http://127.0.0.1:2379 \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port=6443 --endpoint-reconciler-type=none \
  --tls-cert-file=$P/apiserver.crt --tls-private-key-file=$P/apiserver.key --client-ca-file=$P/ca.crt \
  --kubelet-client-certificate=$P/apiserver-kubelet-client.crt --kubelet-client-key=$P/apiserver-kubelet-client.key \
  --kubelet-certificate-authority=$P/ca.crt --kubelet-preferred-address-types=Hostname \
  --service-account-key-file=$P/sa.pub --service-account-signing-key-file=$P/sa.key \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local --service-cluster-ip-range=10.96.0.0/24 \
  --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction --allow-privileged=true
waitfor apiserver 240 $K get --raw /readyz

# --- controller-manager + scheduler ---
for c in controller-manager:10257 scheduler:10259; do n=${c%%:*};
  extra=""; [ $n = controller-manager ] && extra="--service-account-private-key-file=$P/sa.key --root-ca-file=$P/ca.crt --use-service-account-credentials=true"
  start $n $BIN/kube-$n --kubeconfig=$P/$n.kubeconfig --authentication-kubeconfig=$P/$n.kubeconfig --authorization-kubeconfig=$P/$n.kubeconfig \
    --bind-address=127.0.0.1 --secure-port=${c#*:} --leader-elect=false $extra
done

# --- kubelet (node name "localhost" so the apiserver reaches it on 127.0.0.1 via the Hostname address) ---
cat > $S/kubelet/config.yaml <<Y
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
authentication: {anonymous: {enabled: false}, webhook: {enabled: true}, x509: {clientCAFile: $P/ca.crt}}
authorization: {mode: Webhook}
tlsCertFile: $P/kubelet-server.crt
tlsPrivateKeyFile: $P/kubelet-server.key
cgroupDriver: cgroupfs
failCgroupV1: false          # this VM is cgroup v1 (hybrid); 1.35+ refuse v1 unless this is set
failSwapOn: false
containerRuntimeEndpoint: unix://$S/containerd/containerd.sock
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
podCIDR: 10.244.0.0/24
Y
start kubelet $BIN/kubelet --config=$S/kubelet/config.yaml --kubeconfig=$P/kubelet.kubeconfig --hostname-override=localhost --root-dir=$S/kubelet/root
waitfor node-ready 240 $K wait --for=condition=Ready node/localhost --timeout=1s
waitfor default-sa 240 $K -n default get sa default
echo "export KUBECONFIG=$P/admin.kubeconfig"
