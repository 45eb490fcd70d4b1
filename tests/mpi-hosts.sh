#!/bin/sh
# Data-parallel training across hosts (issue 10): two hosts made on this
# machine, each a network namespace with a hostname of its own (unshare
# --uts) and its own temporary folder, joined by a veth pair. mpirun runs
# on the first with a hostfile naming both by address; Open MPI's rsh
# launcher starts its daemon on the second through tests/mpi-host-agent.sh
# (as it would through ssh), and the ranks talk over TCP only (btl tcp,self),
# through the veth. The same checks as tests/mpi.sh on one host: 2 ranks on
# 2 hosts train the one-process model, a run resumes from one host's
# ranks to one process, and a rank killed on the second host ends the job.
# Skipped without MPI, without root, or where network namespaces cannot be
# made (containers without CAP_SYS_ADMIN).
set -u
run="$top_builddir/tools/psm-run"
cd "${PSM_PROJECT_DIR:-$top_srcdir}" || exit 1
skip () { echo "1..0 # SKIP $1"; exit 77; }
if ! "$run" --version | grep -q "MPI: yes" || ! command -v mpirun > /dev/null; then
  skip "psm built without MPI (apt-get install libopenmpi-dev openmpi-bin; configure --with-mpi)"
fi
[ -n "${PSM_TEST_SANITIZED:-}" ] && skip "under sanitizers: Open MPI's own allocations at exit read as leaks"
[ "$(id -u)" -eq 0 ] || skip "needs root to make network namespaces"
command -v ip > /dev/null && command -v unshare > /dev/null || skip "needs ip (iproute2) and unshare (util-linux)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/psm-hosts-XXXXXX")
# names unique to this test run: two may run at once
id=$$
ns1=psmh1-$id ns2=psmh2-$id v1=psa$id v2=psb$id
net=10.$((id % 200 + 20)).$((id / 200 % 250)).
a1=${net}1 a2=${net}2
cleanup () {
  ip netns pids "$ns1" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns pids "$ns2" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns del "$ns1" 2>/dev/null
  ip netns del "$ns2" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
if ! { ip netns add "$ns1" && ip netns add "$ns2" && ip link add "$v1" type veth peer name "$v2" &&
       ip link set "$v1" netns "$ns1" && ip link set "$v2" netns "$ns2" &&
       ip -n "$ns1" addr add "$a1/24" dev "$v1" && ip -n "$ns2" addr add "$a2/24" dev "$v2" &&
       ip -n "$ns1" link set lo up && ip -n "$ns2" link set lo up &&
       ip -n "$ns1" link set "$v1" up && ip -n "$ns2" link set "$v2" up; } > "$tmp/net.log" 2>&1; then
  cat "$tmp/net.log"
  skip "cannot make network namespaces here (ip netns add failed)"
fi
. "$top_srcdir/tests/tap.sh"
. "$top_srcdir/tests/mpi-common.sh"
mkdir -p "$tmp/host1" "$tmp/host2"
# the launcher's view of the hosts: address -> namespace, hostname, TMPDIR
cat > "$tmp/hosts.map" <<MAP
$a1 $ns1 psm-host1-$id $tmp/host1
$a2 $ns2 psm-host2-$id $tmp/host2
MAP
printf '%s slots=1\n%s slots=1\n' "$a1" "$a2" > "$tmp/hostfile"
export PSM_TEST_HOSTS_MAP="$tmp/hosts.map" PSM_TEST_AGENT_LOG="$tmp/agent.log"
# mpirun on host 1; the ranks on the hostfile's hosts, TCP through the veth
hosts_mpi () {
  timeout 300 "$top_srcdir/tests/mpi-host-agent.sh" "$a1" \
    env OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive PSM_PLUGIN_PATH="$PSM_PLUGIN_PATH" \
    mpirun --hostfile "$tmp/hostfile" -np 2 --mca plm_rsh_agent "$top_srcdir/tests/mpi-host-agent.sh" \
    --mca btl tcp,self --mca btl_tcp_if_include "${net}0/24" --mca oob_tcp_if_include "${net}0/24" \
    -x OMP_NUM_THREADS -x OMP_WAIT_POLICY -x PSM_PLUGIN_PATH "$run" "$@"
}

"$run" --mode train "$tmp/s2s.cfg" --set "run.dir=$tmp/one" > "$tmp/out" 2>&1
check "one process, batch 8" '[ $? -eq 0 ]'
hosts_mpi --mode train "$tmp/s2s.cfg" --set "run.dir=$tmp/two" > "$tmp/out" 2>&1
check "2 ranks on 2 hosts (network namespaces joined by a veth pair), TCP between them" \
  '[ $? -eq 0 ] && grep -q "^2 MPI ranks on 2 hosts: psm-host1-$id (rank 0), psm-host2-$id (rank 1)$" "$tmp/out"'
check "Open MPI started the second host's daemon through the launcher, as over ssh" \
  'grep -q "^$a2: .*orted" "$tmp/agent.log"'
close_to one two train "2 hosts give the one-process losses at all 16 updates"
close_to one two valid "and the same validation losses"

# stopped on two hosts, resumed by one process
hosts_mpi --mode train "$tmp/s2s.cfg" --set "run.dir=$tmp/x21" --stop-after 7 > "$tmp/out" 2>&1
check "2 hosts, --stop-after 7" '[ $? -eq 0 ] && grep -q "stopped at step 7" "$tmp/out"'
"$run" --mode train --resume "$tmp/s2s.cfg" --set "run.dir=$tmp/x21" > "$tmp/out" 2>&1
check "resumed by one process" '[ $? -eq 0 ] && grep -q "resumed .* at step 7" "$tmp/out"'
close_to one x21 train "2 hosts then 1 process: the one-process losses"

# a rank killed on the second host ends the job: no hang
sed 's/steps = 16;/steps = 1000000;/' "$tmp/s2s.cfg" > "$tmp/long.cfg"
hosts_mpi --mode train "$tmp/long.cfg" --set "run.dir=$tmp/die" > "$tmp/out" 2>&1 &
mpid=$!
victim=""
for _ in $(seq 1 60); do
  sleep 0.5
  for p in $(ip netns pids "$ns2" 2>/dev/null); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = psm-run ] && victim=$p
  done
  [ -n "$victim" ] && [ -s "$tmp/die/log.jsonl" ] && break
done
rank_killed "$victim" $mpid "the rank on host 2 killed with SIGKILL ends the job"

finish
