#!/usr/bin/env bash
# A cluster on one machine: N hosts as network namespaces on a private bridge, every link
# shaped with `tc tbf` at both ends (a full-duplex NIC of RATE), and mpirun over TCP into them.
#
#   pipelines/cluster.sh up [--hosts N] [--rate RATE] [--burst B] [--id ID]
#                                                                 build it (default 4 hosts, 1gbit)
#   pipelines/cluster.sh status                                   hosts, addresses, rate, reachability
#   pipelines/cluster.sh run [-np N] [--slots S] -- CMD…          mpirun CMD across the hosts
#   pipelines/cluster.sh down                                     remove exactly what `up` made
#   pipelines/cluster.sh check                                    can this machine? (exit 0/1)
#
# State: the file $GRADKIT_CLUSTER (default data/cluster/cluster.env, git-ignored) records every
# namespace and link `up` made, so `down` removes exactly those. `--state FILE` overrides it.
# Names carry a run id (gk<ID>…) and the subnet 10.77.X.0/24 is one no route on this machine
# uses, so two clusters (a test and a user's) never collide. Traffic stays on the bridge.
# See docs/CLUSTER.md.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
AGENT=$ROOT/pipelines/nsrsh

die() { echo "error: $*" >&2; exit 1; }
usage() { sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

# --- the state file: `key=value` lines, read without sourcing -------------------------------
STATE=${GRADKIT_CLUSTER:-$ROOT/data/cluster/cluster.env}
# `GRADKIT_CLUSTER=1` (or `default`) means the default state file.
case $STATE in 1 | default) STATE=$ROOT/data/cluster/cluster.env ;; esac

get() { awk -F= -v k="$1" '$1 == k { sub(/^[^=]*=/, ""); print; exit }' "$STATE"; }
record() { echo "$1=$2" >>"$STATE"; }
# hosts: one "NAMESPACE ADDRESS" line per host, in rank order.
hosts() { awk -F= '$1 == "host" { print $2 }' "$STATE"; }

# rate_bytes RATE: bytes per second of a tc rate (bit, kbit, mbit, gbit; k/m/g are 1000s).
# burst_bytes B RATE_BYTES: tbf's burst in bytes. B is bytes (`16384`) or milliseconds of the
# rate (`1ms`, at least 16 KiB); empty: the default, 2 ms of the rate and at least 64 KiB (at
# 1 Gbit/s this machine's timers need ≥ 64 KiB to reach the rate). A message that fits in the
# burst passes at memory speed, which no real NIC does: `make repro-sim` uses `1ms`.
burst_bytes() {
  local b=${1,,} r=$2 n
  if [ -z "$b" ]; then
    echo $(( r / 500 > 65536 ? r / 500 : 65536 ))
  elif [[ $b =~ ^([1-9][0-9]*)ms$ ]]; then
    n=$(( r * 10#${BASH_REMATCH[1]} / 1000 ))
    echo $(( n > 16384 ? n : 16384 ))
  elif [[ $b =~ ^[0-9]+$ ]] && [ "$((10#$b))" -ge 2048 ]; then
    echo $((10#$b))
  else
    die "--burst $1: give bytes (at least 2048) or milliseconds of the rate, like 16384 or 1ms"
  fi
}

rate_bytes() {
  local r=${1,,} n u
  [[ $r =~ ^([0-9]+)(bit|kbit|mbit|gbit)$ ]] || die "--rate $1: give a rate like 100mbit, 1gbit or 10gbit"
  n=$((10#${BASH_REMATCH[1]})) u=${BASH_REMATCH[2]}
  [ "$n" -gt 0 ] || die "--rate $1: give a rate above zero"
  case $u in bit) echo $((n / 8)) ;; kbit) echo $((n * 125)) ;; mbit) echo $((n * 125000)) ;; gbit) echo $((n * 125000000)) ;; esac
}

# reachable [NS] ADDR: a TCP connect to port 9 of ADDR (from namespace NS, or from this one)
# answered, by a listener or by a refusal. `ping` is not installed on these machines.
reachable() {
  local ns= addr out
  [ $# = 2 ] && ns=$1 && shift
  addr=$1
  out=$( ${ns:+ip netns exec "$ns"} timeout 3 bash -c "exec 3<>/dev/tcp/$addr/9" 2>&1) && return 0
  [[ $out == *"refused"* ]]
}

# --- up ----------------------------------------------------------------------------------------
# teardown: remove what the state file says was made, newest first; wait for the names to go.
teardown() {
  [ -f "$STATE" ] || return 0
  local id made kind name i
  id=$(get id)
  mapfile -t made < <(awk -F= '$1 == "made" { print $2 }' "$STATE" | tac)
  for m in "${made[@]}"; do
    kind=${m%%:*} name=${m#*:}
    case $kind in
      ns) ip netns del "$name" 2>/dev/null || true ;;
      link) ip link del "$name" 2>/dev/null || true ;;
      dir) [[ $name =~ ^/tmp/gk[a-z0-9]+$ ]] && rm -rf "$name" ;;
    esac
  done
  # Deleting a namespace deletes its veth pair, but the bridge-side name can linger a moment.
  for i in $(seq 50); do
    left=$(leftovers "$id")
    [ -z "$left" ] && break
    sleep 0.1
  done
  [ -z "$left" ] || { echo "error: still present after down: $left" >&2; return 1; }
  rm -f "$STATE"
}

# leftovers ID: the namespaces and links of run ID that exist now (empty when none).
leftovers() {
  local id=$1
  [ -n "$id" ] || return 0
  { ip netns list | awk '{ print $1 }' | grep -E "^gk$id-" || true
    ip -o link show | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }' | grep -E "^gk$id(-|$)" || true
  } | tr '\n' ' ' | sed 's/ $//'
}

# pick_subnet ID: 10.77.X with X from the run id, moved on while any route on this machine
# already covers it (another cluster's bridge, a user's network).
pick_subnet() {
  local id=$1 x i
  x=$(( $(printf '%s' "$id" | cksum | cut -d' ' -f1) % 250 + 1 ))
  for i in $(seq 250); do
    if ! ip -4 route show | grep -q "^10\.77\.$x\."; then echo $x; return; fi
    x=$(( x % 250 + 1 ))
  done
  die "no free 10.77.X.0/24 subnet on this machine"
}

# check: exit 0 where this machine can build a cluster (ip, tc, mpirun, `ip netns add`), else
# print why and exit 1. Changes nothing that outlives it.
cmd_check() {
  command -v ip >/dev/null && command -v tc >/dev/null || die "cluster: needs ip and tc (apt-get install iproute2)"
  command -v mpirun >/dev/null || die "cluster: mpirun is not installed (make deps)"
  local probe=gkchk$(printf '%04x' $((RANDOM)))
  ip netns add "$probe" 2>/dev/null || die "cluster: 'ip netns add' is not permitted here (needs root or CAP_NET_ADMIN/CAP_SYS_ADMIN)"
  ip netns del "$probe"
}

cmd_up() {
  local n=4 rate=1gbit id= burst burst_arg= bytes i ns va vb addr x
  while [ $# -gt 0 ]; do
    case $1 in
      --hosts) n=$2; shift 2 ;;
      --rate) rate=$2; shift 2 ;;
      --burst) burst_arg=$2; shift 2 ;;
      --id) id=$2; shift 2 ;;
      *) usage ;;
    esac
  done
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 64 ] || die "--hosts $n: give 1 to 64"
  bytes=$(rate_bytes "$rate")
  burst=$(burst_bytes "$burst_arg" "$bytes")
  [ -n "$id" ] || id=$(printf '%04x%02x' $((RANDOM)) $(($$ % 256)))
  [[ $id =~ ^[a-z0-9]{1,6}$ ]] || die "--id $id: give 1 to 6 of [a-z0-9]"
  command -v ip >/dev/null && command -v tc >/dev/null || die "cluster: needs ip and tc (apt-get install iproute2)"
  if [ -f "$STATE" ]; then
    die "a cluster is already up ($STATE, id $(get id)); run 'make cluster-down' first, or pass --state FILE"
  fi
  [ -z "$(leftovers "$id")" ] || die "names of run id $id are in use: $(leftovers "$id")"

  # The privilege check: one namespace, made and removed before anything else is built.
  if ! ip netns add "gk$id-probe" 2>/dev/null; then
    die "cluster: 'ip netns add' is not permitted here (needs root or CAP_NET_ADMIN/CAP_SYS_ADMIN); nothing was changed"
  fi
  ip netns del "gk$id-probe"

  mkdir -p "$(dirname "$STATE")"
  # From here on, any failure, Ctrl-C or kill removes what was built so far (the state file
  # lists it as it is made).
  trap 'echo "cluster: up failed or was interrupted; tearing down" >&2; teardown' EXIT
  trap 'exit 130' INT TERM
  # Two `up`s at once must not pick the same subnet: the choice and the bridge's address are
  # made under one lock.
  exec 9>/tmp/gradkit-cluster.lock
  flock 9
  x=$(pick_subnet "$id")
  {
    echo "# gradkit cluster state, written by pipelines/cluster.sh up; removed by down"
    echo "id=$id"
    echo "hosts=$n"
    echo "rate=$rate"
    echo "burst=$burst"
    echo "subnet=10.77.$x.0/24"
    echo "bridge=gk$id"
    echo "bridge_addr=10.77.$x.254"
  } >"$STATE"
  # Each host's own temporary directory: all hosts share one /tmp and one hostname, and
  # Open MPI's daemons would race to make the same session directory in it.
  record made "dir:/tmp/gk$id"
  record tmpdir "/tmp/gk$id"
  mkdir -p "/tmp/gk$id"
  record made "link:gk$id"
  ip link add "gk$id" type bridge
  ip addr add "10.77.$x.254/24" dev "gk$id"
  ip link set "gk$id" up
  flock -u 9
  for i in $(seq "$n"); do
    ns=gk$id-h$i va=gk$id-v$i vb=gk$id-b$i addr=10.77.$x.$i
    record made "ns:$ns"
    ip netns add "$ns"
    record made "link:$vb"
    ip link add "$vb" type veth peer name "$va"
    ip link set "$va" netns "$ns"
    ip -n "$ns" link set "$va" name eth0
    ip -n "$ns" addr add "$addr/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    ip link set "$vb" master "gk$id"
    ip link set "$vb" up
    # Both ends: eth0 limits what the host sends, the bridge-side veth what it receives.
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency 50ms
    tc qdisc add dev "$vb" root tbf rate "$rate" burst "$burst" latency 50ms
    record host "$ns $addr"
  done
  for i in $(seq "$n"); do
    reachable "gk$id-h1" "10.77.$x.$i" || die "host $i (10.77.$x.$i) is not reachable from host 1 over the bridge"
  done
  trap - EXIT INT TERM
  echo "cluster $id up: $n hosts on 10.77.$x.0/24 (bridge gk$id), links shaped to $rate both ways (tbf burst $burst B); state $STATE" >&2
}

cmd_down() {
  [ $# = 0 ] || usage
  if [ ! -f "$STATE" ]; then
    echo "cluster: none is up ($STATE does not exist)" >&2
    return 0
  fi
  local id
  id=$(get id)
  trap '' INT TERM # a half-done teardown helps no one
  teardown
  echo "cluster $id down: its namespaces, veths and bridge are removed" >&2
}

cmd_status() {
  [ $# = 0 ] || usage
  [ -f "$STATE" ] || { echo "cluster: none is up ($STATE does not exist)"; return 3; }
  local ns addr bad=0 r
  echo "cluster $(get id): $(get hosts) hosts, rate $(get rate) both ways (tbf burst $(get burst) B), subnet $(get subnet), bridge $(get bridge)"
  printf '%-4s %-14s %-16s %s\n' host address namespace reachable
  local i=0
  while read -r ns addr; do
    i=$((i + 1))
    if ip netns list | awk '{ print $1 }' | grep -qx "$ns" && reachable "$addr"; then r=yes; else r=no; bad=1; fi
    printf '%-4s %-14s %-16s %s\n' "h$i" "$addr" "$ns" "$r"
  done < <(hosts)
  return $bad
}

# run [-np N] [--slots S] -- CMD…: mpirun CMD with S slots per host (default: the fewest
# that hold N), N ranks (default hosts × S), over TCP on the cluster's subnet only. GRADKIT_CLUSTER_INFO tells the
# tools what to record in their outputs' metadata (`gradkit.cluster`).
cmd_run() {
  local np= slots=
  while [ $# -gt 0 ]; do
    case $1 in
      -np | -n) np=$2; shift 2 ;;
      --slots) slots=$2; shift 2 ;;
      --) shift; break ;;
      *) break ;;
    esac
  done
  [ $# -gt 0 ] || usage
  [ -f "$STATE" ] || die "cluster: none is up ($STATE does not exist); run 'make cluster-up' first"
  command -v mpirun >/dev/null || die "cluster run: mpirun not found (make deps)"
  local list subnet n
  subnet=$(get subnet) n=$(get hosts)
  # Slots per host: as given, else as few as hold -np ranks (1 when -np is not given).
  [ -n "$slots" ] || slots=$(( ${np:-$n} > n ? (np + n - 1) / n : 1 ))
  [ -n "$np" ] || np=$((n * slots))
  list=$(hosts | awk -v s="$slots" '{ printf "%s%s:%s", (NR > 1 ? "," : ""), $2, s }')
  export GRADKIT_CLUSTER_STATE=$STATE
  export GRADKIT_CLUSTER_INFO="backend=mpi-tcp hosts=$n ranks=$np rate=$(get rate) id=$(get id)"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  # Each host believes it has cores of its own, so Open MPI would busy-poll; the hosts share
  # this machine's cores, and a waiting rank must not take them from a computing one.
  export OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1}
  # --bind-to none: each host's daemon binds its own first rank to core 0 otherwise, so every
  # host's ranks would share one core of this machine while the others idle (a rank computing
  # after its call then held its peer's receive back by up to a scheduler tick, 4 ms).
  exec mpirun --mca plm_rsh_agent "$AGENT" --host "$list" -np "$np" --bind-to none \
    --mca btl tcp,self --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet" \
    -x GRADKIT_CLUSTER_INFO -x PATH ${RAYON_NUM_THREADS:+-x RAYON_NUM_THREADS} "$@"
}

[ $# -ge 1 ] || usage
sub=$1; shift
if [ "${1:-}" = --state ]; then STATE=$2; shift 2; fi
case $sub in
  up) cmd_up "$@" ;;
  down) cmd_down "$@" ;;
  status) cmd_status "$@" ;;
  check) cmd_check "$@" ;;
  run) cmd_run "$@" ;;
  -h | --help | help) usage ;;
  *) usage ;;
esac
