#!/bin/bash
# Stops everything bringup.sh started (by PID file) and removes its state; safe to run twice.
S=${S:-${K8S_WORK:-/var/tmp/sandgate-k8s}/cluster}; BIN=${BIN:-${K8S_WORK:-/var/tmp/sandgate-k8s}/bin-v1.37.2}
[ -d $S ] || exit 0
if [ -f $S/pids/kubelet ] && kill -0 $(cat $S/pids/kubelet) 2>/dev/null; then
  timeout 60 $BIN/kubectl --kubeconfig $S/pki/admin.kubeconfig delete pods --all -A --grace-period=0 --force --wait=true >/dev/null 2>&1
fi
for c in kubelet scheduler controller-manager apiserver; do [ -f $S/pids/$c ] && kill $(cat $S/pids/$c) 2>/dev/null; done
sleep 1
# containers left behind: kill tasks, then the shims (by their pid files), then containerd
A=$S/containerd/containerd.sock
if [ -S $A ]; then for id in $(ctr -a $A -n k8s.io tasks ls -q 2>/dev/null); do ctr -a $A -n k8s.io tasks kill -s SIGKILL $id 2>/dev/null; done; sleep 1; fi
for f in $S/containerd/state/io.containerd.runtime.v2.task/*/*/shim.pid; do [ -f "$f" ] && kill $(cat "$f") 2>/dev/null; done
for c in containerd etcd; do [ -f $S/pids/$c ] && kill $(cat $S/pids/$c) 2>/dev/null; done
sleep 1
# mounts (kubelet root bind mount, token tmpfs, overlay rootfs, shm, pod netns: under $S), bridge, pod cgroups
grep -o " $S[^ ]*" /proc/mounts | sort -r | while read m; do umount -l $m 2>/dev/null; done
ip link delete k8stest0 2>/dev/null
for d in /sys/fs/cgroup/*/kubepods; do [ -d $d ] && find $d -depth -type d -exec rmdir {} \; 2>/dev/null; done
rm -rf $S
