#!/usr/bin/env bash
# Hosts on one machine, for tests and demos only: each host is a network namespace with its own
# address and loopback, plus a mount, PID and UTS namespace of its own (its own /tmp, HOME, process
# table, hostname hostI and an /etc/hosts naming every host), the project and its venv read-only.
# A holder process (PID 1 of the host) keeps them; `exec` enters them (nsenter).
#   launch/netns_hosts.sh up N           make hosts 1..N (N <= 20) on a private bridge
#   launch/netns_hosts.sh exec I CMD...  run CMD on host I (as root)
#   launch/netns_hosts.sh addr I         host I's address
#   launch/netns_hosts.sh link I up|down take host I's link down (it stays up for itself) or up again
#   launch/netns_hosts.sh kill I         SIGKILL every process on host I but its holder (`ip netns pids`)
#   launch/netns_hosts.sh down           kill what runs on the hosts, delete them, the bridge, the state
#
# Addresses (GD_HOSTS_NET, default 10.213.77; the 10.213.77.0/24 range must be unused on the machine,
# `up` refuses otherwise): host I is 10.213.77.(10+I), on bridge ${GD_HOSTS_PREFIX}br0 (default gdbr0) that
# holds 10.213.77.1, the operator's machine (the submitter). Hosts have no default route: they reach
# each other and the operator's address, nothing else; no forwarding, no NAT. Names: namespaces
# gdh1..gdhN, veths gdh1v..gdhNv (GD_HOSTS_PREFIX changes the "gd").
# Files: GD_HOSTS_STATE (default /run/grpo_dist_hosts) holds hI/tmp (bound on host I's /tmp),
# hI/home (its HOME) and shared/ (visible to every host at the same path: the "NFS" of the hosts).
# GD_HOSTS_PRIVATE=PATH on `up` binds an empty directory of each host over PATH (a node whose mount
# is missing); `launch/netns_hosts.sh private I PATH` does it on host I only, from then on. Read-only on every host: this checkout and the venv of the python on PATH (GD_HOSTS_RO,
# colon-separated, adds paths).
set -euo pipefail
P="${GD_HOSTS_PREFIX:-gd}"
NET="${GD_HOSTS_NET:-10.213.77}"
STATE="${GD_HOSTS_STATE:-/run/grpo_dist_hosts}"
BR="${P}br0"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
die() { echo "netns_hosts.sh: $*" >&2; exit 2; }
ns() { echo "${P}h$1"; }
addr() { echo "$NET.$((10 + $1))"; }
hosts() { ip netns list | awk '{print $1}' | grep -E "^${P}h[0-9]+$" | sed "s/^${P}h//" | sort -n || true; }

ro_paths() {
  local py venv
  echo "$ROOT"
  py="$(command -v python3 || command -v python)"
  venv="$(dirname "$(dirname "$py")")"
  if [ -f "$venv/pyvenv.cfg" ]; then readlink -f "$venv"; fi
  if [ -n "${GD_HOSTS_RO:-}" ]; then tr ':' '\n' <<< "$GD_HOSTS_RO"; fi
}

up() {
  local n="${1:?usage: up N}" i
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 20 ] || die "up N: N from 1 to 20"
  [ -z "$(hosts)" ] || die "hosts ${P}h* exist already: run down first"
  if ip -4 addr | grep -q "inet $NET\." || ip -4 route | grep -q "^$NET\."; then
    die "$NET.0/24 is in use on this machine: set GD_HOSTS_NET to an unused private /24"
  fi
  mkdir -p "$STATE/shared" && touch "$STATE/.grpo_dist_hosts"
  {  # every host resolves every host's name, as on a LAN with DNS (gloo binds to its hostname's address)
    printf '127.0.0.1 localhost\n'
    for i in $(seq 1 "$n"); do printf '%s host%s\n' "$(addr "$i")" "$i"; done
  } > "$STATE/hosts"
  ip link add "$BR" type bridge
  ip addr add "$NET.1/24" dev "$BR"
  ip link set "$BR" up
  for i in $(seq 1 "$n"); do
    mkdir -p "$STATE/h$i/tmp" "$STATE/h$i/home" && chmod 1777 "$STATE/h$i/tmp"
    ip netns add "$(ns "$i")"
    ip link add "${P}h${i}v" type veth peer name eth0 netns "$(ns "$i")"
    ip link set "${P}h${i}v" master "$BR" up
    ip -n "$(ns "$i")" addr add "$(addr "$i")/24" dev eth0
    ip -n "$(ns "$i")" link set lo up
    ip -n "$(ns "$i")" link set eth0 up
    start_holder "$i"
    echo "host $i: $(ns "$i") $(addr "$i") (hostname host$i, holder pid $(holder "$i"))"
  done
}

holder() { cat "$STATE/h$1/holder" 2>/dev/null || die "no host $1 (run up first)"; }

start_holder() {  # PID 1 of host i: mounts made once, then it waits (and reaps orphans) until killed
  local i="$1" ro pid k
  ro="$(ro_paths | sort -u | tr '\n' ':')"
  ip netns exec "$(ns "$i")" unshare --mount --uts --pid --fork --mount-proc --propagation private -- bash -c '
    set -e
    hostname "host$2"
    mount --bind "$1/../hosts" /etc/hosts
    mount --bind "$1/tmp" /tmp
    IFS=: read -r -a ro <<< "$3"
    for p in "${ro[@]}"; do [ -z "$p" ] || mount --bind -o ro "$p" "$p"; done
    if [ -n "$4" ]; then mkdir -p "$1/private$4"; mount --bind "$1/private$4" "$4"; fi
    touch "$1/ready"
    trap "exit 0" TERM
    while :; do sleep 3600 & wait $! || true; done' _ "$STATE/h$i" "$i" "$ro" "${GD_HOSTS_PRIVATE:-}" \
    </dev/null >/dev/null 2>"$STATE/h$i/holder.err" &
  for k in $(seq 1 100); do  # bounded: 10 s
    if [ -e "$STATE/h$i/ready" ]; then break; fi
    sleep 0.1
  done
  [ -e "$STATE/h$i/ready" ] || die "host $i did not start: $(cat "$STATE/h$i/holder.err")"
  pid="$(cat "/proc/$!/task/$!/children" 2>/dev/null | awk '{print $1}')"
  [ -n "$pid" ] || die "host $i: no holder process"
  echo "$pid" > "$STATE/h$i/holder"
}

run_on() {
  local i="$1"; shift
  local pid; pid="$(holder "$i")"
  exec nsenter -t "$pid" --net --mount --uts --pid -- env HOME="$STATE/h$i/home" TMPDIR=/tmp GD_HOST="$i" "$@"
}

kill_host() {  # every process of host $1 but its holder (and the unshare that started it); all with $2=all
  local pids keep="" p n=0
  if [ "${2:-}" != all ] && [ -s "$STATE/h$1/holder" ]; then
    keep="$(cat "$STATE/h$1/holder") $(awk '{print $4}' "/proc/$(cat "$STATE/h$1/holder")/stat" 2>/dev/null)"
  fi
  pids="$(ip netns pids "$(ns "$1")" 2>/dev/null || true)"
  for p in $pids; do
    case " $keep " in *" $p "*) continue ;; esac
    kill -KILL "$p" 2>/dev/null && n=$((n + 1))
  done
  echo "host $1: killed $n processes"
}

down() {
  local i k
  for i in $(hosts); do
    for k in 1 2 3 4 5; do  # bounded: a process may fork while the first SIGKILLs land
      [ -n "$(ip netns pids "$(ns "$i")" 2>/dev/null)" ] || break
      kill_host "$i" all >/dev/null; sleep 0.5
    done
    ip netns del "$(ns "$i")"  # deletes its eth0 and so the veth's other end, once the namespace is freed
    # a namespace outlives its name while an exiting process still holds it (a host cut off by `link
    # down` has more to unwind): delete the veth now, or the next `up` finds its name taken
    ip link del "${P}h${i}v" 2>/dev/null || true
  done
  if ip link show "$BR" >/dev/null 2>&1; then ip link del "$BR"; fi
  if [ -f "$STATE/.grpo_dist_hosts" ]; then rm -rf --one-file-system "$STATE"; fi
  echo "hosts down"
}

cmd="${1:-}"; shift || true
case "$cmd" in
  up) up "$@" ;;
  down) down ;;
  exec) [ $# -ge 2 ] || die "usage: exec I CMD..."; run_on "$@" ;;
  addr) addr "${1:?usage: addr I}" ;;
  link) ip link set "${P}h${1:?usage: link I up|down}v" "${2:?usage: link I up|down}" ;;
  kill) kill_host "${1:?usage: kill I}" ;;
  private) p="${2:?usage: private I PATH}"; mkdir -p "$STATE/h$1/private$p"
           nsenter -t "$(holder "$1")" --mount -- mount --bind "$STATE/h$1/private$p" "$p"
           echo "host $1: $p is a private, empty directory" ;;
  *) die "usage: netns_hosts.sh up N | down | exec I CMD... | addr I | link I up|down | kill I | private I PATH" ;;
esac
