#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# check-gpu-host.sh - on the GPU host (root, no systemd as PID 1): start rmsnormd with
# rmsnormd@.service's environment and as many of its restrictions as apply without systemd,
# show that CUDA initialises inside them, and print what was and was not verified.
#
# Usage, from the repository root on the GPU host, with binaries built elsewhere and the
# runtime libraries from shared/gpu-runtime-libs.sh:
#   bash systemd/check-gpu-host.sh [BUILD_DIR=build] [LIBS_DIR=.gpu-libs]
# Environment: BACKEND (default cuda, as the unit), MPS=0 skips the MPS part.
# It creates the users rmsnormd, rnclient and rnother and writes under /opt and /run:
# run it on a host lent for testing, not on a production node.
set -u
B=${1:-build}; L=${2:-.gpu-libs}; BACKEND=${BACKEND:-cuda}
P=/opt/rn-gpuhost; T=$(mktemp -d /run/rn-gpuhost.XXXXXX); chmod 0755 "$T"
fails=0; notes=()
ok()  { echo "VERIFIED:     $*"; }
bad() { echo "FAILED:       $*"; fails=$((fails + 1)); }
nv()  { notes+=("$*"); }
as()  { local u=$1; shift; setpriv --reuid="$u" --regid="$(id -g "$u")" --init-groups --no-new-privs -- "$@"; }

# -- the installed layout (the unit runs /usr/local/sbin/rmsnormd; here $P/sbin/rmsnormd)
mkdir -p $P/sbin $P/bin $P/lib
cp "$B/rmsnormd" $P/sbin/ && cp "$B/rmsnormctl" $P/bin/ || { echo "no $B/rmsnormd or rmsnormctl"; exit 2; }
[ -d "$L" ] && cp -L "$L"/*.so* $P/lib/ 2>/dev/null; chmod -R a+rX $P
export LD_LIBRARY_PATH=$P/lib

# -- sysusers.d: the service user with the clients' group; one client in the group, one not
getent group rmsnorm >/dev/null || groupadd --system rmsnorm
id rmsnormd >/dev/null 2>&1 || useradd --system -g rmsnorm -d / -s /usr/sbin/nologin rmsnormd
id rnclient >/dev/null 2>&1 || useradd -M -G rmsnorm rnclient
id rnother >/dev/null 2>&1 || useradd -M rnother

# -- the instance: the GPU's UUID, as rmsnormd@GPU-....service would name it
GPU=${GPU:-$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 2>/dev/null | tr -d ' ')}; GPU=${GPU:-0}
R=/run/rmsnormd/$GPU; EP=ipc://$R/rmsnormd.sock
install -d -m 0755 /run/rmsnormd                       # tmpfiles.d
rm -rf "$R"; install -d -m 0750 -o rmsnormd -g rmsnorm "$R"   # RuntimeDirectory=, RuntimeDirectoryMode=0750
install -d -m 0755 /run/nvidia-mps                     # ReadWritePaths=-/run/nvidia-mps

# -- a CUDA probe: cudaFree(0), device name, an IPC handle exported by a worker and opened here,
#    an interprocess event; "mdwe" first applies MemoryDenyWriteExecute's prctl.
cat > "$T/probe.cu" <<'EOF'
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#define CK(x) do { cudaError_t e = (x); if (e) { printf("probe: %s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "mdwe")) { if (prctl(65, 1, 0, 0, 0)) { perror("PR_SET_MDWE"); return 1; } argv++; argc--; }
    cudaDeviceProp p; CK(cudaFree(0)); CK(cudaGetDeviceProperties(&p, 0));
    if (argc > 1 && !strcmp(argv[1], "export")) {           /* the worker side */
        int *d; int h[1024]; for (int i = 0; i < 1024; i++) h[i] = i * 7 + 1;
        CK(cudaMalloc(&d, sizeof h)); CK(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice));
        cudaIpcMemHandle_t m; CK(cudaIpcGetMemHandle(&m, d));
        for (size_t i = 0; i < sizeof m; i++) printf("%02x", ((unsigned char *)&m)[i]);
        printf("\n"); fflush(stdout); getchar(); return 0;    /* keep it alive until stdin closes */
    }
    printf("probe: %s, cc %d.%d, %d SMs\n", p.name, p.major, p.minor, p.multiProcessorCount);
    cudaEvent_t ev; CK(cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming));
    cudaIpcEventHandle_t eh; CK(cudaIpcGetEventHandle(&eh, ev));
    if (argc > 2 && !strcmp(argv[1], "import")) {           /* the daemon side */
        cudaIpcMemHandle_t m; int *d, h[1024];
        for (size_t i = 0; i < sizeof m; i++) sscanf(argv[2] + 2 * i, "%2hhx", &((unsigned char *)&m)[i]);
        CK(cudaIpcOpenMemHandle((void **)&d, m, cudaIpcMemLazyEnablePeerAccess));
        CK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
        for (int i = 0; i < 1024; i++) if (h[i] != i * 7 + 1) { printf("probe: IPC data wrong at %d\n", i); return 1; }
        CK(cudaIpcCloseMemHandle(d)); printf("probe: IPC memory opened and read\n");
    }
    printf("probe: ok\n"); return 0;
}
EOF
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if "$NVCC" -O1 -o $P/bin/cuda-probe "$T/probe.cu" >"$T/nvcc.log" 2>&1; then chmod 0755 $P/bin/cuda-probe
else nv "CUDA probe not built (nvcc or its host compiler missing): $(tail -1 "$T/nvcc.log")"; fi

# -- the sandbox: everything the unit asks for that works without systemd.
#    unshare: PrivateNetwork=, a mount namespace for ProtectSystem=strict, PrivateTmp=,
#    ProtectHome=, ProtectProc=invisible, ProtectKernelTunables=; setpriv: User=, Group=,
#    NoNewPrivileges=, CapabilityBoundingSet= (empty), AmbientCapabilities= (empty); UMask=0077.
sandbox() {
    unshare --mount --net --propagation private -- /bin/bash -c '
        R=$1; shift
        mount -t tmpfs -o mode=1777 tmpfs /tmp
        for d in /home /root /run/user; do [ -d $d ] && mount -t tmpfs -o ro,mode=0755 tmpfs $d; done
        mount -t proc -o hidepid=invisible proc /proc
        mount --bind /proc/sys /proc/sys
        for d in "$R" /run/nvidia-mps "$RN_NOTIFY_DIR"; do mount --bind "$d" "$d"; done
        awk "{print \$5}" /proc/self/mountinfo | sort -u | while read -r m; do
            case $m in /dev|/dev/*|/proc|"$R"|/run/nvidia-mps|"$RN_NOTIFY_DIR"|/tmp) continue;; esac
            mount -o remount,bind,ro "$m" 2>/dev/null || echo "sandbox: $m stays writable" >&2
        done
        umask 0077
        exec setpriv --reuid=rmsnormd --regid=rmsnorm --init-groups --no-new-privs \
            --inh-caps=-all --bounding-set=-all -- "$@"' sandbox "$R" "$@"
}
UNIT_ENV=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LD_LIBRARY_PATH=$P/lib RUNTIME_DIRECTORY=$R
          CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps CUDA_DEVICE_ORDER=PCI_BUS_ID WATCHDOG_USEC=30000000)

# -- sd_notify: a datagram socket like systemd's, logged to a file (needs python3)
export RN_NOTIFY_DIR=$T/notify; mkdir -p "$RN_NOTIFY_DIR"; chmod 0755 "$RN_NOTIFY_DIR"
NS=$RN_NOTIFY_DIR/notify.sock; NLOG=$T/notify.log; : >"$NLOG"
if command -v python3 >/dev/null; then
    python3 -c 'import socket,sys,os
s=socket.socket(socket.AF_UNIX,socket.SOCK_DGRAM); s.bind(sys.argv[1]); os.chmod(sys.argv[1],0o666)
f=open(sys.argv[2],"a",buffering=1)
while True: f.write(s.recv(4096).decode().replace("\n"," | ")+"\n")' "$NS" "$NLOG" & NPID=$!
    for _ in $(seq 50); do [ -S "$NS" ] && break; sleep 0.1; done
else NS=; nv "no python3: sd_notify messages not observed"; fi
trap '[ -n "${NPID:-}" ] && kill $NPID 2>/dev/null' EXIT

# ---------------------------------------------------------------------------------------------
echo "== CUDA inside the sandbox"
if [ -x $P/bin/cuda-probe ]; then
    coproc EXP { as rnclient $P/bin/cuda-probe export; }
    EPID=$EXP_PID; read -r -t 60 HANDLE <&"${EXP[0]}"
    if [[ ! $HANDLE =~ ^[0-9a-f]{128}$ ]]; then bad "CUDA as a worker (rnclient): $HANDLE"
    elif out=$(sandbox "${UNIT_ENV[@]}" $P/bin/cuda-probe import "$HANDLE" 2>&1); then
        ok "CUDA initialises as user rmsnormd under the sandbox; a worker's (rnclient's) IPC memory opens: $(echo "$out" | head -1)"
    else bad "CUDA in the sandbox: $out"; fi
    [ -n "${EXP[1]:-}" ] && eval "exec ${EXP[1]}>&-"; wait "$EPID" 2>/dev/null
    if out=$(sandbox "${UNIT_ENV[@]}" $P/bin/cuda-probe mdwe 2>&1); then
        ok "CUDA initialises under PR_SET_MDWE (the unit's MemoryDenyWriteExecute=yes)"
    else nv "CUDA under PR_SET_MDWE (MemoryDenyWriteExecute=) fails: $(echo "$out" | tail -1)"; fi
fi

echo "== rmsnormd as rmsnormd@$GPU.service would start it (backend $BACKEND)"
sandbox "${UNIT_ENV[@]}" ${NS:+NOTIFY_SOCKET=$NS} $P/sbin/rmsnormd --backend "$BACKEND" --device "$GPU" \
    --socket-mode 0660 --socket-group rmsnorm >"$T/daemon.log" 2>&1 & SPID=$!
for _ in $(seq 300); do
    if [ -n "$NS" ]; then grep -q 'READY=1' "$NLOG" && break; else [ -S "$R/rmsnormd.sock" ] && break; fi
    kill -0 $SPID 2>/dev/null || break; sleep 0.1
done
DPID=$(pgrep -u rmsnormd -x rmsnormd | head -1)
if [ -z "$DPID" ]; then bad "the daemon did not start:"; cat "$T/daemon.log"; else
    [ -n "$NS" ] && grep -q 'READY=1' "$NLOG" && ok "READY=1 on the notify socket: $(grep -m1 READY "$NLOG")"
    st=$(stat -c '%a %U %G' "$R/rmsnormd.sock"); ds=$(stat -c '%a %U %G' "$R")
    [ "$st" = "660 rmsnormd rmsnorm" ] && [ "$ds" = "750 rmsnormd rmsnorm" ] \
        && ok "socket 0660 rmsnormd:rmsnorm in a 0750 rmsnormd:rmsnorm runtime directory" \
        || bad "socket is '$st', directory '$ds'"
    s=/proc/$DPID/status
    [ "$(awk '/^NoNewPrivs/{print $2}' $s)" = 1 ] && [ "$(awk '/^CapEff/{print $2}' $s)" = 0000000000000000 ] \
        && [ "$(awk '/^CapBnd/{print $2}' $s)" = 0000000000000000 ] \
        && ok "daemon runs as $(ps -o user= -p $DPID) with NoNewPrivs=1 and no capabilities (effective, bounding)" \
        || bad "privileges: $(grep -E '^(Uid|NoNewPrivs|CapEff|CapBnd)' $s | tr '\n' ' ')"
    [ "$(readlink /proc/$DPID/ns/net)" != "$(readlink /proc/self/ns/net)" ] && ok "private network namespace"
    awk '$5 == "/" && $6 ~ /(^|,)ro(,|$)/ {f = 1} END {exit !f}' /proc/$DPID/mountinfo \
        && ok "root file system read-only for the daemon" || bad "root file system writable for the daemon"
    for c in info health "ping -c 100"; do
        out=$(as rnclient $P/bin/rmsnormctl -e "$EP" $c 2>&1); rc=$?
        echo "$out" | sed "s/^/  rnclient\$ rmsnormctl $c: /" | head -25
        [ $rc -le 1 ] && ok "rmsnormctl $c as a member of rmsnorm (exit $rc)" || bad "rmsnormctl $c (exit $rc)"
    done
    grep -qiE 'backend *:? *cuda' <<<"$(as rnclient $P/bin/rmsnormctl -e "$EP" info 2>&1)" \
        && ok "the daemon serves from the CUDA backend" \
        || nv "the daemon did not use the CUDA backend (backend $BACKEND; see info above and the log)"
    out=$(as rnclient $P/bin/rmsnormctl -e "$EP" selftest 2>&1) \
        && ok "selftest as rnclient: shared memory of another user is usable by the sandboxed daemon" \
        || bad "selftest as rnclient: $(echo "$out" | tail -3 | tr '\n' ' ')"
    as rnother $P/bin/rmsnormctl -e "$EP" health >/dev/null 2>&1; rc=$?
    [ $rc = 2 ] && ok "a user outside rmsnorm cannot connect (health exit 2)" || bad "rnother got health exit $rc"
    kill -TERM $DPID; wait $SPID; rc=$?
    [ $rc = 0 ] && ok "SIGTERM: drained, exit 0" || bad "exit status $rc after SIGTERM"
    [ -n "$NS" ] && { grep -q 'STOPPING=1' "$NLOG" && ok "STOPPING=1 sent" || bad "no STOPPING=1"; }
    [ -n "$NS" ] && grep -q 'WATCHDOG=1' "$NLOG" && ok "WATCHDOG=1 pings with WATCHDOG_USEC=30 s"
fi

if [ "${MPS:-1}" != 0 ] && command -v nvidia-cuda-mps-control >/dev/null && [ -x $P/bin/cuda-probe ]; then
    echo "== MPS: control daemon on /run/nvidia-mps, the probe as an MPS client in the sandbox"
    mkdir -p /var/log/nvidia-mps
    CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps nvidia-cuda-mps-control -d
    if out=$(sandbox "${UNIT_ENV[@]}" $P/bin/cuda-probe 2>&1); then
        srv=$(echo get_server_list | CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps nvidia-cuda-mps-control)
        [ -n "$srv" ] && ok "CUDA in the sandbox connects to MPS through /run/nvidia-mps (server pid $srv, user $(ps -o user= -p "$srv"))" \
            || bad "no MPS server started for the sandboxed client"
    else bad "CUDA under MPS in the sandbox: $out"; fi
    echo quit | CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps nvidia-cuda-mps-control
fi

echo "== daemon log (last 15 lines)"; tail -15 "$T/daemon.log"
echo "== not verified here (need systemd as PID 1; checked offline by tests/integration/test_systemd):"
echo "   DevicePolicy=closed + DeviceAllow= (device cgroup), SystemCallFilter=, RestrictAddressFamilies=,"
echo "   RestrictNamespaces=, LockPersonality=, ProtectKernelModules=/Logs=, ProtectClock=, WatchdogSec= restarts"
for n in "${notes[@]}"; do echo "   note: $n"; done
echo "== $fails failure(s)"; rm -rf "$T"; exit $((fails > 0))
