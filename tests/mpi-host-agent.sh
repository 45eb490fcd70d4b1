#!/bin/sh
# The remote-shell agent of tests/mpi-hosts.sh, in ssh's place:
#   mpi-host-agent.sh [OPTIONS] HOST COMMAND...
# runs COMMAND by /bin/sh on HOST, one of the hosts that test made: inside
# HOST's network namespace, with the hostname and temporary folder of that
# host (PSM_TEST_HOSTS_MAP: "ADDRESS NAMESPACE HOSTNAME TMPDIR" lines), and
# with no environment but PATH, HOME and what the command line sets, as
# over ssh: a rank on another host sees only what mpirun forwards (-x).
# Open MPI passes ssh options first; they are ignored.
while [ $# -gt 0 ]; do
  case $1 in -*) shift ;; *) break ;; esac
done
[ $# -ge 2 ] || { echo "mpi-host-agent: usage: mpi-host-agent.sh HOST COMMAND..." >&2; exit 255; }
host=$1
shift
line=$(awk -v h="$host" '$1 == h' "${PSM_TEST_HOSTS_MAP:?}")
[ -n "$line" ] || { echo "mpi-host-agent: no host $host in $PSM_TEST_HOSTS_MAP" >&2; exit 255; }
set -- $line "$*"
[ -n "${PSM_TEST_AGENT_LOG:-}" ] && echo "$1: $5" >> "$PSM_TEST_AGENT_LOG"
exec env -i PATH="$PATH" HOME="${HOME:-/root}" TMPDIR="$4" PSM_TEST_HOSTS_MAP="$PSM_TEST_HOSTS_MAP" \
  PSM_TEST_AGENT_LOG="${PSM_TEST_AGENT_LOG:-}" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  ip netns exec "$2" unshare --uts /bin/sh -c 'hostname "$1" && shift && exec /bin/sh -c "$1"' agent "$3" "$5"
