# Source this file to point the Slurm client tools (sinfo, squeue, sbatch, sacct) at the local cluster:
#   source slurm/env.sh
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
export SLURM_CONF=$SLURM_LOCAL_ETC/slurm.conf
