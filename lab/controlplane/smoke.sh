#!/usr/bin/env bash
# Smoke test of the lab control plane: etcd + kube-apiserver (RBAC, token auth)
# + kube-controller-manager + kube-scheduler + kwok, all on 127.0.0.1 in a temp
# dir. Creates a fake (kwok) GPU node, a bound Pod, a scheduled Pod and a
# DaemonSet, waits for Ready/Running, deletes a pod, then tears everything down
# (trap: also on failure). Finally shows kubelet-validate on testdata/.
#
# Usage: lab/controlplane/smoke.sh [BIN_DIR]   (default: output of build.sh)
# Env:   SMOKE_KEEP=1 keeps the temp dir (logs) after the run.
#        SMOKE_SOAK=N  after the checks wait N s and check the node is still Ready
#                      (e.g. 90: longer than the node-monitor grace period).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BIN="${1:-$("$HERE/build.sh" | tail -n1)}"
for b in etcd kube-apiserver kube-controller-manager kube-scheduler kwok kubelet-validate; do
  [[ -x "$BIN/$b" ]] || { echo "smoke: missing $BIN/$b" >&2; exit 1; }
done

D="$(mktemp -d "${TMPDIR:-/tmp}/gpuharden-cp.XXXXXX")"
PIDS=()
stop_pids() { # <timeout s> <pid...>: TERM, wait, then KILL
  local t="$1"; shift
  (($#)) || return 0
  kill -TERM "$@" 2>/dev/null
  local n=$((t * 10)) p alive
  while ((n-- > 0)); do
    alive=0
    for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
    ((alive)) || return 0
    sleep 0.1
  done
  echo "smoke: escalating to SIGKILL for $*" >&2
  kill -KILL "$@" 2>/dev/null
}
cleanup() {
  local rc=$?
  set +e
  local t0=$SECONDS
  # Everything but etcd first (PIDS[0]): kube-apiserver's graceful shutdown
  # hangs if etcd is already gone.
  stop_pids 15 "${PIDS[@]:1}"
  stop_pids 10 "${PIDS[@]:0:1}"
  wait 2>/dev/null
  echo "smoke: teardown took $((SECONDS - t0))s" >&2
  # Leak check: no process may still reference the temp dir.
  local leaked
  leaked="$(ps -eo pid=,args= | grep -F "$D" | grep -v grep || true)"
  if [[ -n "$leaked" ]]; then
    echo "smoke: LEAKED processes:" >&2; echo "$leaked" >&2
    ((rc != 0)) || rc=1
  else
    echo "smoke: no processes left behind" >&2
  fi
  if ((rc != 0)); then
    echo "smoke: FAILED (rc=$rc); last log lines:" >&2
    for f in "$D"/*.log; do [[ -f "$f" ]] && { echo "== $f" >&2; tail -n 15 "$f" >&2; }; done
  fi
  if [[ "${SMOKE_KEEP:-0}" == 1 ]]; then echo "smoke: kept $D" >&2; else rm -rf "$D"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.2f", b-a}'; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
start() { # <name> <cmd...>: start in background, log to $D/<name>.log
  local name="$1"; shift
  "$@" >"$D/$name.log" 2>&1 &
  PIDS+=($!)
  echo "smoke: started $name (pid $!)"
}
wait_for() { # <timeout s> <description> <cmd...>
  local t="$1" what="$2"; shift 2
  local deadline=$((SECONDS + t))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { echo "smoke: timeout waiting for $what" >&2; return 1; }
    for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null || { echo "smoke: pid $p died while waiting for $what" >&2; return 1; }; done
    sleep 0.2
  done
}

ETCD_PORT=$(free_port); ETCD_PEER_PORT=$(free_port); API_PORT=$(free_port)
KCM_PORT=$(free_port); SCHED_PORT=$(free_port)
TOKEN="$(openssl rand -hex 16)"
API="https://127.0.0.1:$API_PORT"

# ---- credentials ------------------------------------------------------------------
mkdir -p "$D/pki" "$D/etcd"
openssl genrsa -out "$D/sa.key" 2048 2>/dev/null
openssl rsa -in "$D/sa.key" -pubout -out "$D/sa.pub" 2>/dev/null
echo "$TOKEN,admin,admin,\"system:masters\"" >"$D/tokens.csv"
write_kubeconfig() {
# certificate-authority: kube-apiserver's self-signed pki/apiserver.crt holds the
# serving cert and its CA; SANs include 127.0.0.1 (insecure-skip-tls-verify: true also works).
cat >"$D/admin.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster:
    server: $API
    certificate-authority: $D/pki/apiserver.crt
users:
- name: admin
  user:
    token: $TOKEN
contexts:
- name: lab
  context:
    cluster: lab
    user: admin
current-context: lab
EOF
}

api() { curl -sS --cacert "$D/pki/apiserver.crt" --max-time 10 -H "Authorization: Bearer $TOKEN" "$@"; }
# POST $2 (JSON) to path $1; retried because the ServiceAccount admission
# plugin refuses pods until kube-controller-manager created the namespace's "default" SA.
create() {
  local deadline=$((SECONDS + 60)) code
  while :; do
    code=$(api -o "$D/last.json" -w '%{http_code}' -X POST -H 'Content-Type: application/json' "$API$1" -d "$2")
    [[ "$code" == 201 ]] && return 0
    ((SECONDS < deadline)) || { echo "smoke: POST $1 -> $code: $(cat "$D/last.json")" >&2; return 1; }
    sleep 0.5
  done
}
jget() { # <path> <python expr on obj `o`>: prints the value
  api "$API$1" | python3 -c "import json,sys; o=json.load(sys.stdin); print($2)"
}

T0=$(now)
# ---- etcd -----------------------------------------------------------------------
start etcd "$BIN/etcd" --name=lab --data-dir="$D/etcd" \
  --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster="lab=http://127.0.0.1:$ETCD_PEER_PORT" --unsafe-no-fsync --log-level=warn
wait_for 30 "etcd /health" curl -sf "http://127.0.0.1:$ETCD_PORT/health"
echo "smoke: etcd healthy after $(elapsed "$T0")s"

# ---- kube-apiserver ---------------------------------------------------------------
T1=$(now)
start kube-apiserver "$BIN/kube-apiserver" \
  --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" \
  --cert-dir="$D/pki" \
  --token-auth-file="$D/tokens.csv" \
  --authorization-mode=Node,RBAC \
  --service-account-issuer=https://kubernetes.default.svc \
  --service-account-key-file="$D/sa.pub" --service-account-signing-key-file="$D/sa.key" \
  --service-cluster-ip-range=10.96.0.0/16 \
  --endpoint-reconciler-type=none \
  --allow-privileged=true
wait_for 90 "apiserver /readyz" curl -sSfk -H "Authorization: Bearer $TOKEN" "$API/readyz"
write_kubeconfig
READYZ_S=$(elapsed "$T1")
echo "smoke: kube-apiserver /readyz ok after ${READYZ_S}s"

# ---- controller-manager, scheduler, kwok ------------------------------------------
start kube-controller-manager "$BIN/kube-controller-manager" \
  --kubeconfig="$D/admin.kubeconfig" --leader-elect=false \
  --bind-address=127.0.0.1 --secure-port="$KCM_PORT" \
  --service-account-private-key-file="$D/sa.key" \
  --use-service-account-credentials=false
start kube-scheduler "$BIN/kube-scheduler" \
  --kubeconfig="$D/admin.kubeconfig" --leader-elect=false \
  --bind-address=127.0.0.1 --secure-port="$SCHED_PORT"
start kwok "$BIN/kwok" \
  --kubeconfig="$D/admin.kubeconfig" --config="$HERE/stages.yaml" \
  --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
  --cidr=10.244.0.0/16 --node-ip=10.0.0.1 --node-lease-duration-seconds=40
wait_for 60 "kube-controller-manager /healthz" curl -skf "https://127.0.0.1:$KCM_PORT/healthz"
wait_for 60 "kube-scheduler /readyz" curl -skf "https://127.0.0.1:$SCHED_PORT/readyz"
echo "smoke: kcm + scheduler healthy after $(elapsed "$T1")s since apiserver start"

# ---- objects ------------------------------------------------------------------------
T2=$(now)
create /api/v1/nodes '{"apiVersion":"v1","kind":"Node","metadata":{"name":"gpu-node-0",
  "annotations":{"kwok.x-k8s.io/node":"fake"},"labels":{"kubernetes.io/hostname":"gpu-node-0","gpuharden.io/lab":"true"}},
  "status":{"capacity":{"cpu":"64","memory":"512Gi","pods":"110","nvidia.com/gpu":"8"}}}'
ready() { [[ "$(jget /api/v1/nodes/gpu-node-0 '[c["status"] for c in o["status"].get("conditions",[]) if c["type"]=="Ready"]')" == "['True']" ]]; }
wait_for 60 "node Ready" ready
NODE_READY_S=$(elapsed "$T2")
echo "smoke: node gpu-node-0 Ready after ${NODE_READY_S}s"
wait_for 60 "node lease" api -f "$API/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/gpu-node-0"
echo "smoke: lease kube-node-lease/gpu-node-0 present (holder $(jget /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/gpu-node-0 'o["spec"].get("holderIdentity")'))"
no_taint() { [[ "$(jget /api/v1/nodes/gpu-node-0 'len(o["spec"].get("taints") or [])')" == 0 ]]; }
wait_for 60 "node-lifecycle controller to remove the not-ready taint" no_taint
echo "smoke: node untainted after $(elapsed "$T2")s; allocatable: $(jget /api/v1/nodes/gpu-node-0 'o["status"]["allocatable"]')"

T3=$(now)
create /api/v1/namespaces/default/pods '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"bound"},
  "spec":{"nodeName":"gpu-node-0","containers":[{"name":"c","image":"busybox"}]}}'
create /api/v1/namespaces/default/pods '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"scheduled"},
  "spec":{"nodeSelector":{"gpuharden.io/lab":"true"},"containers":[{"name":"c","image":"busybox",
  "resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}'
create /apis/apps/v1/namespaces/kube-system/daemonsets '{"apiVersion":"apps/v1","kind":"DaemonSet",
  "metadata":{"name":"probe"},"spec":{"selector":{"matchLabels":{"app":"probe"}},
  "template":{"metadata":{"labels":{"app":"probe"}},"spec":{"nodeSelector":{"gpuharden.io/lab":"true"},
  "containers":[{"name":"c","image":"busybox"}]}}}}'
phase() { jget "/api/v1/namespaces/$1/pods/$2" 'o["status"].get("phase")'; }
running() { [[ "$(phase "$1" "$2")" == Running ]]; }
wait_for 60 "pod bound Running" running default bound
echo "smoke: pod default/bound Running after $(elapsed "$T3")s (podIP $(jget /api/v1/namespaces/default/pods/bound 'o["status"].get("podIP")'))"
wait_for 60 "pod scheduled Running" running default scheduled
echo "smoke: pod default/scheduled (via kube-scheduler) Running after $(elapsed "$T3")s on $(jget /api/v1/namespaces/default/pods/scheduled 'o["spec"]["nodeName"]')"
ds_ready() { [[ "$(jget /apis/apps/v1/namespaces/kube-system/daemonsets/probe 'o["status"].get("numberReady",0)')" == 1 ]]; }
wait_for 60 "DaemonSet pod ready" ds_ready
echo "smoke: DaemonSet kube-system/probe numberReady=1 after $(elapsed "$T3")s: $(api "$API/api/v1/namespaces/kube-system/pods?labelSelector=app%3Dprobe" | python3 -c 'import json,sys; print([(p["metadata"]["name"],p["spec"]["nodeName"],p["status"]["phase"]) for p in json.load(sys.stdin)["items"]])')"

T4=$(now)
api -o /dev/null -f -X DELETE "$API/api/v1/namespaces/default/pods/bound"
gone() { [[ "$(api -o /dev/null -w '%{http_code}' "$API/api/v1/namespaces/default/pods/bound")" == 404 ]]; }
wait_for 60 "pod bound deleted" gone
echo "smoke: pod default/bound deleted after $(elapsed "$T4")s"

if ((${SMOKE_SOAK:-0} > 0)); then
  # Node must stay Ready past kube-controller-manager's node-monitor grace
  # period (lease renewals by kwok, condition heartbeats by the stage).
  sleep "$SMOKE_SOAK"
  ready || { echo "smoke: node not Ready after ${SMOKE_SOAK}s soak" >&2; exit 1; }
  running default scheduled || { echo "smoke: pod not Running after soak" >&2; exit 1; }
  echo "smoke: after ${SMOKE_SOAK}s soak node still Ready (taints: $(jget /api/v1/nodes/gpu-node-0 'o["spec"].get("taints")')), lease renewTime $(jget /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/gpu-node-0 'o["spec"]["renewTime"]'), Ready heartbeat $(jget /api/v1/nodes/gpu-node-0 '[c["lastHeartbeatTime"] for c in o["status"]["conditions"] if c["type"]=="Ready"][0]')"
fi

echo "smoke: control plane OK; total $(elapsed "$T0")s (apiserver readyz ${READYZ_S}s, node Ready ${NODE_READY_S}s)"

# ---- kubelet-validate --------------------------------------------------------------
echo "smoke: kubelet-validate testdata/kubelet-valid.yaml"
"$BIN/kubelet-validate" "$HERE/testdata/kubelet-valid.yaml"
echo "smoke: kubelet-validate testdata/kubelet-invalid.yaml (must fail)"
if "$BIN/kubelet-validate" "$HERE/testdata/kubelet-invalid.yaml"; then
  echo "smoke: invalid config was accepted" >&2; exit 1
fi
echo "smoke: kubelet-validate flags override the file (static policy without reservation -> startup error)"
if "$BIN/kubelet-validate" --cpu-manager-policy=static --reserved-cpus= --kube-reserved=memory=1Gi \
  --system-reserved=memory=1Gi "$HERE/testdata/kubelet-valid.yaml" >/dev/null; then
  echo "smoke: expected a startup error" >&2; exit 1
fi
echo "smoke: PASS"
