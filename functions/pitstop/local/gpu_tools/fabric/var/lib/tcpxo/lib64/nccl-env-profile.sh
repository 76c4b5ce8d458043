# Stand-in for GPUDirect-TCPXO's NCCL profile on an A3 Mega node (the Slurm agent sources the
# real one from /var/lib/tcpxo/lib64 through --fabric-root; locally, this tree is the root).
# It needs NCCL_LIB_DIR set before it is sourced, as Google's recipe sets it.
[ -n "$NCCL_LIB_DIR" ] || { echo "nccl-env-profile.sh: NCCL_LIB_DIR is not set" >&2; return 1; }
export PITSTOP_FABRIC_PROFILE=tcpxo
