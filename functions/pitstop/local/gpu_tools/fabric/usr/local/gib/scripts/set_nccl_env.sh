# Stand-in for the gIB plugin's NCCL environment script on A3 Ultra / A4 nodes (the Slurm agent
# sources the real one from /usr/local/gib/scripts through --fabric-root; locally, this tree).
export PITSTOP_FABRIC_PROFILE=gib
