#!/bin/bash
# The "remote shell" OpenMPI's mpirun uses to start its daemon on another host, for the
# two-host tests (multihost.sh): host nodeK is network namespace $MMSP_NETNS_nodeK, with
# that host name. Usage (as plm_rsh_agent): netns_rsh.sh [ssh options] HOST COMMAND...
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done  # ssh's options: none apply here
host=$1
shift
var=MMSP_NETNS_$host
ns=${!var:-}
[ -n "$ns" ] || { echo "netns_rsh.sh: no namespace for host '$host' (set $var)" >&2; exit 255; }
exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
