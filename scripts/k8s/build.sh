#!/bin/bash
# Builds kube-apiserver, kubelet, kube-controller-manager, kube-scheduler, kubectl from the Go module proxy.
# k8s.io/kubernetes replaces its staging modules with ./staging paths, which are not in its module zip, so a
# scratch module re-points each of them at the published k8s.io/<name> v0.<minor>.<patch>.
set -euo pipefail
KV=${KV:-v1.37.2}; SV=v0.${KV#v1.}                 # v1.37.2 -> v0.37.2
OUT=${BIN:-${K8S_WORK:-/var/tmp/sandgate-k8s}/bin-$KV}; W=${W:-${K8S_WORK:-/var/tmp/sandgate-k8s}/mod-$KV}
[ -f $OUT/.complete ] && { echo "cached: $OUT"; exit 0; }
mkdir -p $W $OUT; cd $W; rm -f go.mod go.sum
go mod init k8sbuild >/dev/null 2>&1
modfile=$(go mod download -json k8s.io/kubernetes@$KV | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
for m in $(grep -E '=> \./staging/' $modfile | awk '{print $1}'); do go mod edit -replace=$m=$m@$SV; done
go mod edit -go=$(awk '/^go /{print $2}' $modfile) -require=k8s.io/kubernetes@$KV
P="k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl"
go get $(for p in $P; do echo $p@$KV; done) >/dev/null 2>&1   # resolves + fills go.sum
minor=$(echo $KV | cut -d. -f2); LDF="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LDF="$LDF -X $p.gitVersion=$KV -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"; done
go build -ldflags "$LDF" -o $OUT/ $P
touch $OUT/.complete
ls -la $OUT
