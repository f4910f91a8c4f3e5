package hcomm

import "os"

// Launched reports whether a launcher started this process as one rank of
// several, and names the variable that says so: the first of WORLD_SIZE
// (torchrun, Kubernetes training operators, hcomm run), OMPI_COMM_WORLD_SIZE
// (Open MPI's mpirun) and SLURM_NTASKS (Slurm's srun) that is set. A program
// that runs its ranks in one process (InitAll) when started by itself calls
// InitFromEnv instead when Launched is true; naming the variable lets it say
// why in an error. getenv reads the environment (nil: os.Getenv), so that a
// caller can pass another. Safe for concurrent use.
//
// Launched looks at the world size, not the rank, so that a half-set
// environment (WORLD_SIZE without RANK) takes the InitFromEnv path, whose
// error names what is missing, rather than silently running alone.
func Launched(getenv func(string) string) (variable string, ok bool) {
	if getenv == nil {
		getenv = os.Getenv
	}
	for _, v := range []string{"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"} {
		if getenv(v) != "" {
			return v, true
		}
	}
	return "", false
}
